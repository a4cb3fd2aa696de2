"""Property (TAXONOMY v2 "Sticky refusals"): a refused proposal never changes the stored call.

Whatever brought a call where it is (success, unknown outcome, review, approval, a denial, an
operator's rejection, an expired approval, a tool error), a later proposal under its
operation ID that is refused (``idempotency_mismatch``, ``duplicate_suppressed``,
``duplicate_in_flight``, ``loop_detected``, a sticky refusal) is answered on its own event:
the call keeps its reason, route, state, observation, receipt, attempts and review items.
Runs through the batch engine (``events_apply``), the path every event takes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.django import TestCase

from callgate import services
from callgate.ingest import events_apply
from callgate.models import Agent, CallEvent, Project, ToolCall
from callgate.schemas import EVENT_ADAPTER, ContractIn
from callgate.taxonomy import REFUSALS
from reviews.models import ReviewItem

PARAMETERS = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
    "required": ["order_id", "amount"],
}
CONTRACTS = {
    "pay": {"effect": "write", "reconcilable": True, "idempotent": True},
    "pay_blind": {"effect": "write"},
    "pay_approved": {"effect": "write", "reconcilable": True, "requires_approval": True},
}
#: histories: the tool and the events (after the first proposal) that bring the call there
HISTORIES = {
    "succeeded": (
        "pay",
        [{"type": "attempt", "sent": True, "outcome": "success", "result": {"id": 1}}],
    ),
    "reconciling": ("pay", [{"type": "attempt", "sent": True, "outcome": "timeout"}]),
    "in_review": ("pay_blind", [{"type": "attempt", "sent": True, "outcome": "timeout"}]),
    "pending_approval": ("pay_approved", []),
    "denied": ("pay", [{"type": "denied", "reason": "not allowed"}]),
    "operator_rejected": (
        "pay_approved",
        [{"type": "decision", "decision": "reject", "reason": "policy"}],
    ),
    "approval_expired": ("pay_approved", [{"type": "approval_expired"}]),
    "tool_error": (
        "pay",
        [{"type": "attempt", "sent": True, "outcome": "error", "http_status": 422, "error": "bad"}],
    ),
}
ARGUMENTS = {"order_id": "O-1", "amount": 5}


def snapshot(call: ToolCall) -> tuple:
    call.refresh_from_db()
    items = tuple(ReviewItem.objects.filter(call=call).order_by("pk").values_list("pk", "status"))
    return (
        call.state,
        call.reason,
        call.category,
        call.route,
        call.observation,
        call.receipt,
        call.arguments_digest,
        call.attempts,
        items,
    )


class RefusalPropertyTests(TestCase):
    @settings(max_examples=60, deadline=None)
    @given(
        history=st.sampled_from(sorted(HISTORIES)),
        follow_ups=st.lists(
            st.tuples(st.booleans(), st.sampled_from(["proposed", "turn"])), min_size=1, max_size=5
        ),
    )
    def test_a_refused_proposal_never_changes_the_stored_call(self, history, follow_ups):
        project = Project.objects.create(slug=f"p{uuid.uuid4().hex[:10]}", name="p")
        agent = Agent.objects.create(project=project, name="a")
        for name, fields in CONTRACTS.items():
            services.contract_register(
                agent=agent,
                name=name,
                payload=ContractIn.model_validate({"parameters": PARAMETERS, **fields}),
            )
        tool, events = HISTORIES[history]

        def send(body: dict) -> CallEvent:
            event = EVENT_ADAPTER.validate_python(
                {
                    "event_id": str(uuid.uuid4()),
                    "occurred_at": datetime.now(UTC).isoformat(),
                    "request_id": "req-1",
                    **body,
                }
            )
            [outcome] = events_apply(project=project, agent=agent, events=[event])
            assert outcome.status == "accepted", outcome.errors
            return CallEvent.objects.get(project=project, event_id=event.event_id)

        first = send(
            {
                "type": "proposed",
                "format": "plain",
                "operation_id": "op-1",
                "call": {"tool": tool, "arguments": ARGUMENTS},
            }
        )
        call = first.call
        for body in events:
            send({**body, "operation_id": "op-1"})
        for other_arguments, kind in follow_ups:
            arguments = {**ARGUMENTS, "amount": 6} if other_arguments else ARGUMENTS
            before = snapshot(call)
            if kind == "proposed":
                body = {
                    "type": "proposed",
                    "format": "plain",
                    "operation_id": "op-1",
                    "call": {"tool": tool, "arguments": arguments},
                }
            else:  # the same call in a turn: its operation ID is derived, the request's count shared
                body = {
                    "type": "turn",
                    "format": "anthropic",
                    "response": {
                        "content": [
                            {"type": "tool_use", "id": f"t{i}", "name": tool, "input": arguments}
                            for i in range(2)
                        ]
                    },
                }
            answered = send(body)
            refused = answered.reason in REFUSALS and answered.call_id == call.pk
            if refused or (other_arguments and kind == "proposed"):
                assert answered.reason in REFUSALS, (history, answered.reason)
                assert snapshot(call) == before, (history, answered.reason)
