from django.contrib import admin

from reviews.models import (
    ProjectNotifications,
    ReviewAudit,
    ReviewItem,
    SlackIdentity,
    WebhookDelivery,
)


@admin.register(ReviewItem)
class ReviewItemAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "project",
        "kind",
        "status",
        "reason",
        "priority",
        "assignee",
        "created_at",
    )
    list_filter = ("status", "kind", "project")
    search_fields = ("call__operation_id", "call__tool_name", "reason")
    raw_id_fields = ("call", "assignee", "resolved_by")
    readonly_fields = ("status", "resolution", "resolution_reason", "resolved_by", "resolved_at")


@admin.register(ReviewAudit)
class ReviewAuditAdmin(admin.ModelAdmin):
    """Read-only: the trail is append-only."""

    list_display = (
        "created_at",
        "item",
        "actor",
        "action",
        "state_before",
        "state_after",
        "override",
    )
    list_filter = ("action", "override")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("created_at", "delivery_id", "attempt", "status_code", "ok", "url")
    list_filter = ("ok",)

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(SlackIdentity)
class SlackIdentityAdmin(admin.ModelAdmin):
    """Who is linked to which Slack member; admins may unlink (delete) but not link: a link
    needs the Slack member's proof (``SlackLinkRequest``), which only Slack's signed click
    gives, so nobody, admins included, can type in another person's member ID."""

    list_display = ("user", "team_id", "slack_user_id", "created_at")
    search_fields = ("user__username", "slack_user_id", "team_id")
    readonly_fields = ("user", "team_id", "slack_user_id", "created_at")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ProjectNotifications)
class ProjectNotificationsAdmin(admin.ModelAdmin):
    list_display = ("project", "slack_webhook_url", "emails")
