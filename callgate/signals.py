"""Cache invalidation, the one use of signals here (STYLE.md): a change of a tool contract
or of an agent's registered tools bumps the project's ``config_version``, the stamp that
``callgate.ingest.tools_for``'s per-process cache is checked against; that and any change of
the project, one of its agents or keys drops the project's key stamp, which
``callgate.auth.api_key_verify``'s per-process cache of keys (with their agent and project
rows) is checked against. Bulk writes send no signals: code that bulk-writes these rows
calls ``project_config_bump`` or ``keys_stamp_bump`` itself."""

from __future__ import annotations

from django.db.models import F
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from callgate.auth import keys_stamp_bump
from callgate.ingest import tools_cache_forget
from callgate.models import Agent, AgentTool, ApiKey, Project, ToolContract


def project_config_bump(project_id: int) -> None:
    """Mark every process's cached contracts of the project as stale (and drop this
    process's at once)."""
    Project.objects.filter(pk=project_id).update(config_version=F("config_version") + 1)
    tools_cache_forget(project_id)
    keys_stamp_bump(project_id)  # the cached project rows hold the old config_version


@receiver([post_save, post_delete], sender=ToolContract, dispatch_uid="contract_changed")
def _contract_changed(sender, instance: ToolContract, **kwargs) -> None:
    project_config_bump(instance.project_id)


@receiver([post_save, post_delete], sender=AgentTool, dispatch_uid="agent_tool_changed")
def _agent_tool_changed(sender, instance: AgentTool, **kwargs) -> None:
    project_id = Agent.objects.filter(pk=instance.agent_id).values_list("project_id", flat=True)
    project_config_bump(project_id.first() or 0)


@receiver([post_save, post_delete], sender=Project, dispatch_uid="project_changed")
def _project_changed(sender, instance: Project, **kwargs) -> None:
    keys_stamp_bump(instance.pk)


@receiver([post_save, post_delete], sender=Agent, dispatch_uid="agent_changed")
@receiver([post_save, post_delete], sender=ApiKey, dispatch_uid="api_key_changed")
def _agent_or_key_changed(sender, instance: Agent | ApiKey, **kwargs) -> None:
    keys_stamp_bump(instance.project_id)
