from django.apps import AppConfig


class McpGatewayConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "mcp_gateway"
    verbose_name = "MCP gateway"
