"""Cache invalidation, the one use of signals here (STYLE.md): a change of a tool contract
or of an agent's registered tools bumps the project's ``config_version``, the stamp that
``callgate.ingest.tools_for``'s per-process cache is checked against. Bulk writes send no
signals: code that bulk-creates either calls ``project_config_bump`` itself."""

from __future__ import annotations

from django.db.models import F
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from callgate.ingest import tools_cache_forget
from callgate.models import Agent, AgentTool, Project, ToolContract


def project_config_bump(project_id: int) -> None:
    """Mark every process's cached contracts of the project as stale (and drop this
    process's at once)."""
    Project.objects.filter(pk=project_id).update(config_version=F("config_version") + 1)
    tools_cache_forget(project_id)


@receiver([post_save, post_delete], sender=ToolContract, dispatch_uid="contract_changed")
def _contract_changed(sender, instance: ToolContract, **kwargs) -> None:
    project_config_bump(instance.project_id)


@receiver([post_save, post_delete], sender=AgentTool, dispatch_uid="agent_tool_changed")
def _agent_tool_changed(sender, instance: AgentTool, **kwargs) -> None:
    project_id = Agent.objects.filter(pk=instance.agent_id).values_list("project_id", flat=True)
    project_config_bump(project_id.first() or 0)
