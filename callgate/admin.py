"""Django admin for projects, members, agents and keys (keys are issued by a command or
the admin action below; the plain key is shown once in a message and never stored)."""

from django import forms
from django.contrib import admin, messages

from callgate.auth import api_key_issue, api_key_revoke
from callgate.models import Agent, ApiKey, InboxEvent, Membership, Project, ToolContract
from callgate.outbound import url_refusal
from callgate.reports.tallies import counts_rebuild


class RecountOnDelete(admin.ModelAdmin):
    """For an admin whose deletions take counted rows with them (an agent: its calls and
    their events; not its review items, whose audit trail the admin may not delete, so an
    agent that had any stays): the reports' rollups and the refused proposals' tallies are
    kept by adding and cannot follow a deletion, so the projects touched are recounted
    (``counts_rebuild``) in the deletion's transaction, as ``manage.py backfill_rollups``
    would. It reads the project's history: as long as the deletion itself, or longer."""

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        counts_rebuild(project_id=obj.project_id)

    def delete_queryset(self, request, queryset):
        projects = sorted(set(queryset.values_list("project_id", flat=True)))
        super().delete_queryset(request, queryset)
        for project_id in projects:
            counts_rebuild(project_id=project_id)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "retention_days", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "project", "role"]
    list_filter = ["role", "project"]
    autocomplete_fields = ["user", "project"]


@admin.action(description="Issue a new API key (shown once)")
def issue_key(modeladmin, request, queryset):
    for agent in queryset:
        issued = api_key_issue(agent=agent, name="admin")
        messages.warning(
            request, f"Key for {agent.name} (copy it now, it is not shown again): {issued.plain}"
        )


class AgentAdminForm(forms.ModelForm):
    """An agent as the admin edits it: its decision webhook must be an address the outbound
    guard lets callgate post to (``callgate.outbound.url_refusal``), as the delivery would."""

    webhook_url = forms.URLField(required=False, assume_scheme="https", label="Webhook URL")

    class Meta:
        model = Agent
        fields = ["project", "name", "description", "webhook_url", "webhook_secret", "created_at"]

    def clean_webhook_url(self) -> str:
        url = self.cleaned_data["webhook_url"]
        if url and (refusal := url_refusal(url)):
            raise forms.ValidationError(f"callgate may not post to this address: {refusal}")
        return url


@admin.register(Agent)
class AgentAdmin(RecountOnDelete):
    form = AgentAdminForm
    list_display = ["name", "project", "webhook_url", "created_at"]
    list_filter = ["project"]
    search_fields = ["name"]
    actions = [issue_key]


@admin.action(description="Revoke selected keys")
def revoke_keys(modeladmin, request, queryset):
    for key in queryset:
        api_key_revoke(api_key=key)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["__str__", "agent", "project", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["project"]
    readonly_fields = [
        "project",
        "agent",
        "prefix",
        "digest",
        "last4",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    actions = [revoke_keys]

    def has_add_permission(self, request):
        return False  # keys are issued from the Agent admin action or `create_agent_key`


@admin.register(ToolContract)
class ToolContractAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "version",
        "project",
        "effect",
        "idempotent",
        "lint_score",
        "created_at",
    ]
    list_filter = ["project", "effect"]
    search_fields = ["name"]

    def has_change_permission(self, request, obj=None):
        return False  # versions are immutable; register a new one through the API


@admin.register(InboxEvent)
class InboxEventAdmin(admin.ModelAdmin):
    """Inbox rows not applied: ``rejected`` by the rules, or ``quarantined`` after drains died
    applying them (``callgate.inbox.QUARANTINE_AFTER``). Read-only; deleting one drops it."""

    list_display = ["event_id", "project", "agent", "status", "attempts", "received_at"]
    list_filter = ["status", "project"]
    search_fields = ["event_id"]
    readonly_fields = [
        "project",
        "agent",
        "event_id",
        "body",
        "received_at",
        "status",
        "errors",
        "attempts",
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).exclude(status=InboxEvent.Status.PENDING)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
