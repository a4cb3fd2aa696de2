"""Replaying a case file (``shared/cases/README.md``) through the ingest path.

Each case runs in its own throw-away project inside a transaction that is rolled back,
so a replay leaves nothing behind. Contracts go through ``contract_register`` and events
through the same pydantic validation, ``events_receive`` and ``inbox_drain`` as
``POST /api/v1/events``, then ``event_answer`` as ``GET /api/v1/events/{event_id}``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import TextIO

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from callgate import services
from callgate.inbox import event_answer, events_receive, inbox_drain
from callgate.models import Agent, Project, ToolCall
from callgate.schemas import EVENT_ADAPTER, ContractIn
from callgate_sdk.providers import normalise


class _Rollback(Exception):
    pass


def case_envelopes(case: dict) -> list[dict]:
    """The case's events with an API envelope: a fresh ``event_id``, ``occurred_at`` now and
    the case's request ID (``case-<id>`` when the event names none)."""
    request_id = f"case-{case.get('id', 'x')}"
    now = timezone.now().isoformat()
    return [
        {"event_id": str(uuid.uuid4()), "occurred_at": now, "request_id": request_id, **event}
        for event in case.get("events", [])
    ]


def names_its_call(envelope: dict) -> bool:
    """Whether an event names its call itself: a proposal or turn (which makes calls), or
    an event with an ``operation_id`` or a ``call_id`` (a call of a turn). Any other event of
    a case concerns the call the previous answer named."""
    return (
        envelope.get("type") in ("proposed", "turn")
        or bool(envelope.get("operation_id"))
        or bool(envelope.get("call_id"))
    )


def case_tool_payloads(case: dict) -> dict[str, dict]:
    """The case's contracts as ``PUT /api/v1/tools/{name}`` bodies, by name."""
    return {tool["name"]: {k: v for k, v in tool.items()} for tool in case.get("tools", [])}


def case_history(case: dict, *, agent: Agent) -> None:
    """Store the case's ``history``: earlier receipts and re-asks already used."""
    history = case.get("history") or {}
    for receipt in history.get("receipts", []):
        services.receipt_import(
            agent=agent,
            tool=receipt["tool"],
            arguments=receipt["arguments"],
            result=receipt.get("result"),
            operation_id=receipt.get("operation_id"),
            request_id=receipt.get("request_id"),
        )
    if history.get("reasks_used"):
        request_id = f"case-{case.get('id', 'x')}"
        for event in case.get("events", []):
            if event.get("type") == "proposed":
                tool = normalise(event.get("format", ""), event.get("call")).tool
                if tool:
                    services.request_budget_set(
                        project=agent.project,
                        request_id=event.get("request_id") or request_id,
                        tool_name=tool,
                        reasks_used=history["reasks_used"],
                    )


def replay_case(case: dict) -> dict:
    """``{"id", "reason", "category", "route", "observation", "operation_id", "calls"}``: the
    answer to the case's last event, the operation ID of the call it concerns, and one
    ``{"call_id", "operation_id", "reason", "category", "route", "state", "observation"}`` per
    call the case's events created, in creation order (``shared/cases/README.md``)."""
    result: dict = {"id": case.get("id")}
    try:
        with transaction.atomic():
            project = Project.objects.create(slug=f"replay-{uuid.uuid4().hex[:12]}", name="replay")
            agent = Agent.objects.create(project=project, name="replay")
            for name, body in case_tool_payloads(case).items():
                services.contract_register(
                    agent=agent, name=name, payload=ContractIn.model_validate(body)
                )
            case_history(case, agent=agent)
            before = ToolCall.objects.filter(project=project).aggregate(last=Max("pk"))["last"] or 0
            operation_id = None
            answer: dict = {}
            for envelope in case_envelopes(case):
                if operation_id and not names_its_call(envelope):
                    envelope["operation_id"] = operation_id
                event = EVENT_ADAPTER.validate_python(envelope)
                events_receive(project=project, agent=agent, events=[event], may_decide=True)
                inbox_drain(project.pk, lock_wait=60)  # offline: wait for a live drainer
                found = event_answer(project, event.event_id)
                if found is None or found["status"] != "applied":
                    errors = found["errors"] if found else [{"msg": "the event was not stored"}]
                    answer = {
                        "reason": None,
                        "category": None,
                        "route": None,
                        "observation": "; ".join(e["msg"] for e in errors),
                    }
                    continue
                answer = found["answer"]
                operation_id = answer["operation_id"]
            result.update(
                reason=answer.get("reason"),
                category=answer.get("category"),
                route=answer.get("route"),
                observation=answer.get("observation", ""),
                operation_id=operation_id,
                calls=[
                    {
                        "call_id": call.call_id or None,
                        "operation_id": call.operation_id,
                        "reason": call.reason or None,
                        "category": call.category or None,
                        "route": call.route or None,
                        "state": call.state,
                        "observation": call.observation,
                    }
                    for call in ToolCall.objects.filter(project=project, pk__gt=before).order_by(
                        "pk"
                    )
                ],
            )
            raise _Rollback
    except _Rollback:
        pass
    return result


def read_cases(stream: TextIO) -> Iterator[tuple[int, dict | None, str]]:
    """``(line number, case or None, error)`` for each non-blank line."""
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            case = json.loads(line)
        except ValueError as exc:
            yield number, None, f"line {number}: not JSON ({exc})"
            continue
        if not isinstance(case, dict):
            yield number, None, f"line {number}: a case must be a JSON object"
            continue
        yield number, case, ""
