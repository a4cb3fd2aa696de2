"""Writes of the MCP gateway's configuration and health, and the upstream tools' contracts.

An upstream tool becomes a callgate contract (``callgate.services.contract_register``: linted,
versioned, a changed schema is a new version) published by the project's gateway agent
(``GATEWAY_AGENT``); each agent that connects joins it (same contract, no new version) so that
its calls pass the ``unknown_tool`` check. Mapping of the MCP tool annotations (MCP spec
2025-06-18, "Tool annotations"):

- ``readOnlyHint: true`` → ``effect: read``; anything else → ``effect: write``
- ``idempotentHint: true`` → ``idempotent: true``
- ``destructiveHint: true`` (stated, on a write) → ``requires_approval: true``

and an admin's ``Upstream.tool_overrides`` win over all three.
"""

from __future__ import annotations

import shlex
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from callgate.models import Agent, Project
from callgate.schemas import ContractIn
from callgate.services import ContractRejected, contract_register
from mcp_gateway.models import Upstream

#: The agent that publishes the upstream tools' contracts in each project.
GATEWAY_AGENT = "mcp-gateway"
#: What an admin may override per upstream tool, and the type each takes.
OVERRIDE_FIELDS = {
    "effect": str,
    "idempotent": bool,
    "requires_approval": bool,
    "approval_timeout_seconds": int,
}


def upstream_set(
    *, project: Project, name: str, target: str, timeout_seconds: float = 30.0
) -> Upstream:
    """Create or change the upstream ``name`` of ``project`` from the command line (enabled,
    its overrides kept). ``target`` is an ``http(s)://`` URL (Streamable HTTP) or a command
    line (stdio). Raises ``ValueError("<field>: <problem>")``."""
    existing = Upstream.objects.filter(project=project, name=name).first()
    return upstream_configure(
        project=project,
        name=name,
        target=target,
        timeout_seconds=timeout_seconds,
        tool_overrides=existing.tool_overrides if existing else {},
    )


def upstream_configure(
    *,
    project: Project,
    name: str,
    target: str,
    timeout_seconds: float = 30.0,
    enabled: bool = True,
    tool_overrides: dict | None = None,
) -> Upstream:
    """Create or change the upstream ``name`` (the gateway page's form). Raises
    ``ValueError("<field>: <problem>")`` for a bad name, target, timeout or overrides."""
    is_url = urlsplit(target).scheme in ("http", "https")
    upstream = Upstream.objects.filter(project=project, name=name).first() or Upstream(
        project=project, name=name
    )
    upstream.transport = Upstream.Transport.HTTP if is_url else Upstream.Transport.STDIO
    upstream.url, upstream.command = (target, "") if is_url else ("", target)
    upstream.timeout_seconds = timeout_seconds
    upstream.enabled = enabled
    upstream.tool_overrides = tool_overrides if tool_overrides is not None else {}
    upstream.updated_at = timezone.now()
    upstream_validate(upstream)
    upstream.save()
    return upstream


def upstream_validate(upstream: Upstream) -> None:
    """Field checks of an upstream; raises ``ValueError("<field>: <problem>")``."""
    try:
        upstream.full_clean(exclude=["project"], validate_unique=False)
    except ValidationError as exc:
        field, problems = next(iter(exc.message_dict.items()))
        raise ValueError(f"{field}: {problems[0]}") from None
    if upstream.transport == Upstream.Transport.HTTP and not upstream.url:
        raise ValueError("url: a Streamable HTTP upstream needs its URL")
    if upstream.transport == Upstream.Transport.STDIO:
        try:
            argv = shlex.split(upstream.command)
        except ValueError as exc:
            raise ValueError(f"command: {exc}") from None
        if not argv:
            raise ValueError("command: a stdio upstream needs the command that starts it")
    problem = overrides_problem(upstream.tool_overrides)
    if problem:
        raise ValueError(f"tool_overrides: {problem}")


def overrides_problem(overrides) -> str | None:
    """Why ``overrides`` is not ``{tool: {field: value}}`` with ``OVERRIDE_FIELDS``, or None."""
    if not isinstance(overrides, dict):
        return "must be an object of tool name → overrides"
    for tool, fields in overrides.items():
        if not isinstance(fields, dict):
            return f"{tool}: must be an object"
        for field, value in fields.items():
            kind = OVERRIDE_FIELDS.get(field)
            if kind is None:
                return f"{tool}.{field}: unknown; use {', '.join(OVERRIDE_FIELDS)}"
            if type(value) is not kind:
                return f"{tool}.{field}: must be {kind.__name__}"
            if field == "effect" and value not in ("read", "write"):
                return f"{tool}.effect: must be read or write"
    return None


def contract_for_tool(tool: dict, overrides: dict | None = None) -> ContractIn:
    """The contract of one MCP tool (``Tool`` as JSON: name, description, inputSchema,
    annotations), with an admin's overrides applied. Pure. Raises pydantic's
    ``ValidationError`` for a tool whose fields do not fit a contract."""
    annotations = tool.get("annotations") or {}
    read_only = annotations.get("readOnlyHint") is True
    fields: dict[str, Any] = {
        "effect": "read" if read_only else "write",
        "idempotent": annotations.get("idempotentHint") is True,
        "requires_approval": not read_only and annotations.get("destructiveHint") is True,
    }
    fields.update(overrides or {})
    return ContractIn(
        description=(tool.get("description") or "")[:5000],
        parameters=tool.get("inputSchema") or {"type": "object"},
        **fields,
    )


def exposed_names(tools_by_upstream: dict[str, list[dict]]) -> dict[tuple[str, str], str]:
    """The name each upstream tool is listed under: its own, or ``<upstream>__<tool>`` when
    two upstreams have a tool of that name. ``{(upstream, tool): exposed}``."""
    seen: dict[str, int] = {}
    for tools in tools_by_upstream.values():
        for tool in tools:
            seen[tool["name"]] = seen.get(tool["name"], 0) + 1
    return {
        (upstream, tool["name"]): tool["name"]
        if seen[tool["name"]] == 1
        else f"{upstream}__{tool['name']}"
        for upstream, tools in tools_by_upstream.items()
        for tool in tools
    }


def tools_publish(*, upstream_id: int, tools: list[dict], names: dict[str, str]) -> list[dict]:
    """Register each upstream tool's contract under its exposed name (``names``: upstream tool
    name → exposed name) for the gateway agent, and record the list and the health on the
    upstream. Returns ``[{"name", "exposed", "contract": ContractIn | None, "version",
    "error"}]``; a tool whose contract is refused is listed with its ``error``."""
    upstream = Upstream.objects.select_related("project").get(pk=upstream_id)
    agent, _ = Agent.objects.get_or_create(project=upstream.project, name=GATEWAY_AGENT)
    published, snapshot = [], []
    for tool in tools:
        exposed = names[tool["name"]]
        entry = {"name": tool["name"], "exposed": exposed, "contract": None, "version": None}
        try:
            payload = contract_for_tool(tool, upstream.tool_overrides.get(tool["name"]))
            contract, _ = contract_register(agent=agent, name=exposed, payload=payload)
            entry.update(contract=payload, version=contract.version, error="")
        except ContractRejected as exc:
            entry["error"] = f"{exc.loc}: {exc.msg}"
        except ValueError as exc:  # pydantic: the tool does not fit a contract
            entry["error"] = str(exc).splitlines()[0]
        published.append(entry)
        snapshot.append(
            {
                "name": tool["name"],
                "exposed": exposed,
                "description": (tool.get("description") or "")[:300],
                "effect": entry["contract"].effect if entry["contract"] else "",
                "requires_approval": bool(
                    entry["contract"] and entry["contract"].requires_approval
                ),
                "version": entry["version"],
                "error": entry["error"],
            }
        )
    Upstream.objects.filter(pk=upstream.pk).update(
        tools=snapshot,
        status=Upstream.Status.UP,
        last_seen_at=timezone.now(),
        updated_at=timezone.now(),
    )
    return published


def agent_tools_join(*, agent: Agent, contracts: dict[str, ContractIn]) -> None:
    """Let ``agent`` call the gateway's tools: register the same contracts for it (a no-op
    that records the agent as a user of each; ``contract_register``). A contract changed
    meanwhile by the gateway agent is skipped (the next tools/list joins it)."""
    for name, payload in contracts.items():
        try:
            contract_register(agent=agent, name=name, payload=payload)
        except ContractRejected:
            continue


@transaction.atomic
def upstream_health(*, upstream_id: int, up: bool, error: str = "") -> None:
    """Record a contact with the upstream: ``up`` (seen now) or down with ``error``."""
    now = timezone.now()
    fields: dict[str, str | datetime] = {
        "status": Upstream.Status.UP if up else Upstream.Status.DOWN,
        "updated_at": now,
    }
    if up:
        fields["last_seen_at"] = now
    if error:
        fields.update(last_error=error[:2000], last_error_at=now)
    Upstream.objects.filter(pk=upstream_id).update(**fields)
