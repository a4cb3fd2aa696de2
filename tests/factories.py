"""Small factories and the named personas every test file uses.

``BaseTestCase`` builds two projects, A ("acme") and B ("globex"), and people with roles:
alice (operator of A), bob (second operator of A), victor (viewer of A), maria (manager of A),
olga (operator of B, the outsider). Each project has an agent with an API key.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.contrib.auth import get_user_model
from django.test import TestCase

from callgate.auth import api_key_issue
from callgate.models import Agent, CallRollup, Membership, Project, ToolCall, ToolContract
from callgate.reports.tallies import Closed, review_rollups_add
from callgate.schemas import EVENT_ADAPTER
from callgate.taxonomy import TABLE, Reason
from reviews.models import ReviewItem

PASSWORD = "correct horse battery staple"

#: The test vectors, part of the product: the repository's copy of
#: ``shared/cases/classification.jsonl`` (``.ci/run`` fails when the two differ);
#: ``CALLGATE_CASES`` names another file.
CASES_FILE = Path(
    os.environ.get(
        "CALLGATE_CASES", Path(__file__).resolve().parent / "cases" / "classification.jsonl"
    )
)


def load_cases() -> list[dict]:
    """The cases of ``CASES_FILE``, or an empty list when the file is not there."""
    if not CASES_FILE.exists():
        return []
    return [json.loads(line) for line in CASES_FILE.read_text().splitlines() if line.strip()]


def make_user(username: str):
    return get_user_model().objects.create_user(username=username, password=PASSWORD)


def make_event(type_: str, **fields) -> dict:
    """An API event envelope: a fresh event_id, occurred_at now, plus the body fields."""
    return {
        "event_id": str(uuid.uuid4()),
        "occurred_at": datetime.now(UTC).isoformat(),
        "type": type_,
        **fields,
    }


class BaseTestCase(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.project = Project.objects.create(slug="acme", name="Acme")
        cls.other_project = Project.objects.create(slug="globex", name="Globex")
        cls.alice = make_user("alice")
        cls.bob = make_user("bob")
        cls.victor = make_user("victor")
        cls.maria = make_user("maria")
        cls.olga = make_user("olga")
        Membership.objects.create(
            user=cls.alice, project=cls.project, role=Membership.Role.OPERATOR
        )
        Membership.objects.create(user=cls.bob, project=cls.project, role=Membership.Role.OPERATOR)
        Membership.objects.create(user=cls.victor, project=cls.project, role=Membership.Role.VIEWER)
        Membership.objects.create(user=cls.maria, project=cls.project, role=Membership.Role.MANAGER)
        Membership.objects.create(
            user=cls.olga, project=cls.other_project, role=Membership.Role.OPERATOR
        )
        cls.agent = Agent.objects.create(project=cls.project, name="support-bot")
        cls.other_agent = Agent.objects.create(project=cls.other_project, name="globex-bot")
        cls.key = api_key_issue(agent=cls.agent).plain
        cls.other_key = api_key_issue(agent=cls.other_agent).plain

    def api(self, key: str | None = None):
        """A test client that sends ``Authorization: Bearer <key>`` (project A's by default)."""
        from rest_framework.test import APIClient

        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key or self.key}")
        return client


# --- contracts and proposals of the API tests ----------------------------------------------

WEATHER = {
    "description": "Weather for a city on a date",
    "effect": "read",
    "max_attempts": 3,
    "max_reasks": 2,
    "parameters": {
        "type": "object",
        "properties": {
            "city": {
                "type": "string",
                "minLength": 1,
                "description": "Full city name, e.g. 'Paris'",
            },
            "date": {"type": "string", "format": "date", "description": "ISO 8601 date"},
        },
        "required": ["city"],
    },
}
FOLLOW_UP = {
    "description": "Create a follow-up task on a support ticket",
    "effect": "write",
    "idempotent": True,
    "reconcilable": True,
    "sensitive_fields": ["note"],
    "parameters": {
        "type": "object",
        "properties": {
            "ticket_id": {"type": "string", "pattern": "^T-[0-9]+$"},
            "note": {"type": "string"},
            "password": {"type": "string"},
        },
        "required": ["ticket_id"],
    },
}


def proposal(tool: str, arguments: dict, **fields) -> dict:
    return make_event(
        "proposed", format="plain", call={"tool": tool, "arguments": arguments}, **fields
    )


# --- calls written directly (reports and rollups) ---------------------------------------

#: A Monday: the start of the week that ``seed_calls`` fills by default.
T0 = datetime(2026, 3, 2, 0, tzinfo=UTC)


def make_call(
    *,
    project,
    agent,
    created_at,
    tool="get_weather",
    reason=Reason.OK,
    attempts=1,
    duplicates=0,
    state=ToolCall.State.SUCCEEDED,
    **extra,
) -> ToolCall:
    category, route = TABLE[Reason(reason)] if reason else ("", "")
    return ToolCall.objects.create(
        project=project,
        agent=agent,
        operation_id=str(uuid.uuid4()),
        tool_name=tool,
        state=state,
        reason=reason,
        category=category,
        route=route,
        attempts=attempts,
        duplicates_suppressed=duplicates,
        created_at=created_at,
        updated_at=extra.pop("updated_at", created_at),
        **extra,
    )


def review_item(call: ToolCall, **fields) -> ReviewItem:
    """An unsaved review item for ``call`` carrying what every writer copies from the call
    (project, tool name, agent; the reason unless given), as ``escalation`` does."""
    fields.setdefault("reason", call.reason)
    return ReviewItem(
        project_id=call.project_id,
        call=call,
        tool_name=call.tool_name,
        agent_id=call.agent_id,
        **fields,
    )


def make_review_item(call: ToolCall, **fields) -> ReviewItem:
    """A saved ``review_item`` (fixtures that need an item in a given state, with no
    escalation behind it). A closed one (with ``resolved_at``) is counted in the review
    rollups, as every writer that closes an item does."""
    item = review_item(call, **fields)
    item.save()
    if not item.is_open and item.resolved_at is not None:
        review_rollups_add(
            [Closed.of(item, status=item.status, resolution=item.resolution, at=item.resolved_at)]
        )
    return item


def seed_calls(
    project, agents, contracts, *, seed=7, n=400, start=T0, hours=24 * 7
) -> list[ToolCall]:
    """Random mixed calls over ``hours`` from ``start``; contracts: {tool: ToolContract}."""
    rng = random.Random(seed)
    tools = list(contracts) + ["lookup_order"]
    weights = {
        Reason.OK: 40,
        Reason.EMPTY_RESULT: 6,
        Reason.MISSING_REQUIRED: 5,
        Reason.TYPE_MISMATCH: 4,
        Reason.UNKNOWN_TOOL: 3,
        Reason.UNKNOWN_ARGUMENT: 3,
        Reason.RATE_LIMITED: 4,
        Reason.READ_FAILURE: 3,
        Reason.OUTCOME_UNKNOWN: 3,
        Reason.RECONCILED_APPLIED: 3,
        Reason.RETRY_EXHAUSTED: 2,
        Reason.DUPLICATE_SUPPRESSED: 2,
        Reason.APPROVAL_PENDING: 1,
        Reason.PERMISSION_DENIED: 2,
        Reason.TOOL_ERROR: 2,
        Reason.CONFLICT: 1,
    }
    population, w = zip(*weights.items(), strict=True)
    calls = []
    for _ in range(n):
        reason = rng.choices(population, w)[0]
        tool = rng.choice(tools)
        attempts = {Reason.RETRY_EXHAUSTED: 3, Reason.RATE_LIMITED: 1}.get(
            reason, rng.choice([1, 1, 1, 2, 3])
        )
        state = ToolCall.State.SUCCEEDED
        if reason in (Reason.OUTCOME_UNKNOWN, Reason.RETRY_EXHAUSTED, Reason.CONFLICT):
            state = ToolCall.State.IN_REVIEW
        elif reason == Reason.RATE_LIMITED:
            state = ToolCall.State.RETRY_WAIT
        calls.append(
            make_call(
                project=project,
                agent=rng.choice(agents),
                tool=tool,
                reason=reason,
                attempts=attempts,
                duplicates=rng.choice([0, 0, 0, 0, 1, 2]) if tool == "create_follow_up" else 0,
                state=state,
                created_at=start + timedelta(minutes=rng.randrange(hours * 60)),
                contract=contracts.get(tool),
            )
        )
    return calls


def make_contracts(project) -> dict[str, ToolContract]:
    out = {}
    for name, version, score in (
        ("get_weather", 2, 92),
        ("create_follow_up", 3, 71),
        ("issue_refund", 1, 55),
    ):
        out[name] = ToolContract.objects.create(
            project=project,
            name=name,
            version=version,
            parameters={},
            digest=uuid.uuid4().hex,
            lint_score=score,
            lint_findings=[{"path": "/", "message": "x"}] * ((100 - score) // 20),
        )
    return out


def rollup_counts(project) -> dict[tuple, tuple[int, int, int]]:
    return {
        (r.bucket, r.tool_name, r.agent_id, r.reason, r.route): (
            r.calls,
            r.attempts,
            r.duplicates_suppressed,
        )
        for r in CallRollup.objects.filter(project=project)
    }


def weather_call(i: int) -> list[dict]:
    """A proposal and its successful attempt, correlated by request ID and call ID."""
    return [
        proposal("get_weather", {"city": f"City {i}"}, request_id=f"req-{i}", call_id=f"c{i}"),
        make_event(
            "attempt",
            request_id=f"req-{i}",
            call_id=f"c{i}",
            sent=True,
            outcome="success",
            result={"temperature": i},
        ),
    ]


def validated(envelopes: list[dict]) -> list:
    return [EVENT_ADAPTER.validate_python(e) for e in envelopes]


#: a payment that needs approval and caps the amount (agent boundaries tests)
PAYMENT = {
    "description": "Pay an invoice",
    "effect": "write",
    "requires_approval": True,
    "parameters": {
        "type": "object",
        "properties": {"amount": {"type": "number", "maximum": 1000}},
        "required": ["amount"],
    },
}
