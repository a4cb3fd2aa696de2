"""Review-queue test data: contracts, escalated calls and their items, created directly
(the ingest API is not needed to exercise the queue)."""

from __future__ import annotations

import itertools
import time
import uuid
from datetime import timedelta

import httpx
from django.urls import reverse
from django.utils import timezone

from callgate.escalation import review_item_open
from callgate.models import CallEvent, ToolCall, ToolContract
from callgate.taxonomy import category_of, route_of
from reviews.models import ReviewItem
from tests.factories import BaseTestCase

_seq = itertools.count(1)


def make_contract(
    project,
    name: str = "create_follow_up",
    *,
    effect: str = "write",
    reconcile: str = "http",
    requires_approval: bool = False,
    version: int = 1,
) -> ToolContract:
    contract, _ = ToolContract.objects.get_or_create(
        project=project,
        name=name,
        version=version,
        defaults=dict(
            parameters={"type": "object", "properties": {"ticket_id": {"type": "string"}}},
            effect=effect,
            reconcile_method=reconcile,
            reconcile_url="http://target.invalid/ops/{operation_id}" if reconcile == "http" else "",
            requires_approval=requires_approval,
            digest=uuid.uuid4().hex,
            lint_score=82,
            sensitive_fields=["card_number"],
        ),
    )
    return contract


def make_call(
    project,
    agent,
    *,
    tool: str = "create_follow_up",
    reason: str = "outcome_unknown",
    state: str = ToolCall.State.IN_REVIEW,
    contract: ToolContract | None = None,
    age: timedelta | None = None,
    arguments: dict | None = None,
    approval_in: timedelta | None = None,
) -> ToolCall:
    now = timezone.now()
    created = now - (age or timedelta(0))
    n = next(_seq)
    call = ToolCall.objects.create(
        project=project,
        agent=agent,
        operation_id=f"op-{n:04d}-{uuid.uuid4().hex[:12]}",
        request_id=f"req-{n}",
        actor="customer-42",
        provider_format="anthropic",
        tool_name=tool,
        contract=contract if contract is not None else make_contract(project, tool),
        arguments=arguments
        if arguments is not None
        else {"ticket_id": f"T-{1000 + n}", "card_number": "•••"},
        state=state,
        reason=reason,
        category=category_of(reason),
        route=route_of(reason),
        observation=f"The outcome of {tool} is unknown.",
        attempts=1,
        created_at=created,
        updated_at=created,
        approval_expires_at=(now + approval_in) if approval_in is not None else None,
    )
    CallEvent.objects.create(
        project=project,
        call=call,
        kind=CallEvent.Kind.PROPOSED,
        body={"type": "proposed"},
        occurred_at=created,
        received_at=created,
        state_after=state,
    )
    return call


def make_item(
    project,
    agent,
    *,
    kind: str = ReviewItem.Kind.ESCALATION,
    age: timedelta | None = None,
    **call_kwargs,
) -> ReviewItem:
    """An open item for a fresh call (approval items wait in ``pending_approval``)."""
    if kind == ReviewItem.Kind.APPROVAL:
        call_kwargs.setdefault("reason", "approval_pending")
        call_kwargs.setdefault("state", ToolCall.State.PENDING_APPROVAL)
        call_kwargs.setdefault("approval_in", timedelta(minutes=15))
        call_kwargs.setdefault("tool", "issue_refund")
    call = make_call(project, agent, age=age, **call_kwargs)
    item = review_item_open(call=call, kind=kind)
    if age:
        ReviewItem.objects.filter(pk=item.pk).update(created_at=timezone.now() - age)
        item.refresh_from_db()
    return item


def add_reconciled(call: ToolCall, *, found: bool, matches: bool = False) -> CallEvent:
    now = timezone.now()
    return CallEvent.objects.create(
        project_id=call.project_id,
        call=call,
        kind=CallEvent.Kind.RECONCILED,
        source=CallEvent.Source.CALLGATE,
        body={"type": "reconciled", "found": found, "matches": matches},
        occurred_at=now,
        received_at=now,
    )


#: A write that the in-process simulator (``demo.simulator``, tenant ``acme``) can look up.
SIM_TOKEN = "acme-secret"
SIM_LOOKUP_URL = "http://sim/tenants/acme/operations/{operation_id}"
SIM_ARGS = {"ticket_id": "T-1", "assignee_id": "u-7", "due_at": "2026-12-01T09:00:00Z"}
#: An attempt the target refused with 409 (a closed ticket): ``conflict``, do not retry.
CLOSED_409 = {"sent": True, "outcome": "error", "http_status": 409, "error": "ticket closed"}


def follow_up_contract(*, idempotent: bool = True) -> dict:
    """The body of ``PUT /api/v1/tools/create_follow_up``, looked up in the simulator."""
    return {
        "description": "Create a follow-up task on a support ticket, assigned to one agent.",
        "effect": "write",
        "idempotent": idempotent,
        "reconcilable": True,
        "reconcile_url": SIM_LOOKUP_URL,
        "max_attempts": 3,
        "max_reasks": 2,
        "parameters": {
            "type": "object",
            "properties": {
                "ticket_id": {"type": "string"},
                "assignee_id": {"type": "string"},
                "due_at": {"type": "string"},
            },
            "required": ["ticket_id", "assignee_id", "due_at"],
            "additionalProperties": False,
        },
    }


HTMX = {"HTTP_HX_REQUEST": "true"}


class ReviewPageTestCase(BaseTestCase):
    def login(self, user):
        self.client.force_login(user)

    def queue_url(self, query: str = "") -> str:
        return reverse("reviews:queue", args=["acme"]) + (f"?{query}" if query else "")

    def item_url(self, item, name: str = "reviews:item") -> str:
        return reverse(name, args=["acme", item.pk])


#: "Approve with edits": a refund needing approval, its schema (bounds, a pattern, no other
#: keys), a sensitive card number (stored as •••) and a volatile nonce.
REFUND = {
    "type": "object",
    "properties": {
        "ticket_id": {"type": "string", "pattern": "^T-[0-9]+$"},
        "amount": {"type": "integer", "minimum": 1, "maximum": 500},
        "card_number": {"type": "string", "pattern": "^[0-9]{16}$"},
        "nonce": {"type": "string"},
    },
    "required": ["ticket_id", "amount"],
    "additionalProperties": False,
}
REFUND_PROPOSED = {"ticket_id": "T-1042", "amount": 120, "card_number": "•••", "nonce": "n-1"}


def make_refund_approval(project, agent) -> ReviewItem:
    """An open approval item for an ``issue_refund`` call proposed with ``REFUND_PROPOSED``."""
    contract = make_contract(project, "issue_refund", requires_approval=True)
    contract.parameters = REFUND
    contract.volatile_arguments = ["/nonce"]
    contract.save(update_fields=["parameters", "volatile_arguments"])
    return make_item(project, agent, kind=ReviewItem.Kind.APPROVAL, arguments=REFUND_PROPOSED)


def target_without_the_operation() -> httpx.Client:
    """The target system of the reconcile look-up: it has no record (404), a little slowly."""

    def handler(request: httpx.Request) -> httpx.Response:
        time.sleep(0.3)
        return httpx.Response(404, json={"error": "not found"})

    return httpx.Client(transport=httpx.MockTransport(handler), follow_redirects=False)
