"""The MCP gateway's configuration: the upstream MCP servers a project's gateway fronts."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from callgate.models import Project

#: Upstream names prefix clashing tool names (``<upstream>__<tool>``): letters, digits, - and _.
UPSTREAM_NAME = RegexValidator(
    r"^[A-Za-z0-9_-]{1,40}$", "1 to 40 letters, digits, hyphens or underscores"
)


class Upstream(models.Model):
    """One upstream MCP server of a project's gateway: reached over Streamable HTTP (``url``)
    or started as a stdio command (``command``, split like a shell would, no shell run).

    ``tool_overrides`` is what an admin says against the server's own annotations, per
    upstream tool name: ``{"delete_ticket": {"requires_approval": false, "effect": "write",
    "idempotent": true, "approval_timeout_seconds": 600}}``. ``tools``, ``status``,
    ``last_error`` and ``last_seen_at`` are written by the running gateway (health)."""

    class Transport(models.TextChoices):
        HTTP = "http", "Streamable HTTP"
        STDIO = "stdio", "stdio command"

    class Status(models.TextChoices):
        UNKNOWN = "unknown", "Not contacted yet"
        UP = "up", "Up"
        DOWN = "down", "Down"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="mcp_upstreams")
    name = models.CharField(max_length=40, validators=[UPSTREAM_NAME])
    transport = models.CharField(max_length=8, choices=Transport.choices)
    url = models.URLField(max_length=500, blank=True, help_text="Streamable HTTP endpoint.")
    command = models.CharField(
        max_length=1000, blank=True, help_text="stdio: the command line that starts the server."
    )
    timeout_seconds = models.FloatField(
        default=30.0,
        validators=[MinValueValidator(0.1), MaxValueValidator(3600)],
        help_text="How long one tools/call may take upstream (seconds).",
    )
    enabled = models.BooleanField(default=True)
    tool_overrides = models.JSONField(default=dict, blank=True)
    tools = models.JSONField(default=list, blank=True, help_text="As last listed upstream.")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.UNKNOWN)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="mcpupstream_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.target})"

    @property
    def target(self) -> str:
        return self.url if self.transport == self.Transport.HTTP else self.command
