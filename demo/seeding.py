"""Build a large, realistic project fast: ``manage.py seed_scale PROJECT --calls N``.

For benchmarks and scale tests (issue 18). How it stays "exactly what ingest writes":

1. **Templates through the real engine.** In a scratch project, a few hundred template calls
   (every tool × every scenario: success, empty result, retry then success, argument error,
   unknown tool, duplicate proposal, unknown outcome left in review, unknown outcome an
   operator rejected, approval waiting) are driven through ``callgate.ingest.events_apply``
   (the inbox drain's batch engine) and ``reviews.services.review_item_decide``: their
   ``ToolCall``, ``CallEvent``, ``ReviewItem``, ``ReviewAudit`` and ``RequestBudget`` rows are
   real ones.
2. **Set-based clones.** A temporary table maps each of the N new calls to a template (a
   scenario drawn by weight, a tool by a skewed weight, an agent, a creation time spread over
   the last D days); one ``INSERT … SELECT`` per table copies the template rows, with fresh
   IDs (operation, request, call, event IDs derived from the seed and the call's number)
   and every timestamp shifted by the new creation time minus the template's.
3. **Rollups by one aggregate.** The project's ``CallRollup`` rows are rewritten from one
   ``GROUP BY`` over its calls: equal to ``callgate.reports.selectors.direct_counts``.

PostgreSQL only (``setseed``/``random()``, ``md5``, temporary tables). The same ``seed``
gives the same calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from django.contrib.auth import get_user_model
from django.db import connection, models, transaction

from callgate import services
from callgate.ingest import events_apply
from callgate.models import (
    Agent,
    AgentTool,
    CallEvent,
    CallRollup,
    Project,
    RefusalRollup,
    RequestBudget,
    RollupCube,
    ToolCall,
    ToolContract,
)
from callgate.schemas import EVENT_ADAPTER, ContractIn
from callgate.signals import project_config_bump

AGENTS = 10
#: (name, effect, reconcilable, requires approval): 20 tools, reads first (called most).
TOOLS: list[tuple[str, Literal["read", "write"], bool, bool]] = [
    ("search_orders", "read", False, False),
    ("get_customer", "read", False, False),
    ("get_order", "read", False, False),
    ("list_tickets", "read", False, False),
    ("get_invoice", "read", False, False),
    ("search_products", "read", False, False),
    ("get_shipment", "read", False, False),
    ("list_payments", "read", False, False),
    ("get_subscription", "read", False, False),
    ("search_kb", "read", False, False),
    ("get_inventory", "read", False, False),
    ("list_returns", "read", False, False),
    ("create_ticket", "write", True, False),
    ("update_address", "write", True, False),
    ("send_email", "write", False, False),
    ("add_note", "write", True, False),
    ("issue_refund", "write", True, True),
    ("cancel_order", "write", True, False),
    ("apply_discount", "write", False, False),
    ("close_account", "write", False, True),
]

#: Scenario → weight (per mille). Unknown outcomes and approvals (the escalated ones, that
#: open a review item) are about 3% of calls.
SCENARIOS: dict[str, int] = {
    "success": 820,
    "empty": 40,
    "retry_success": 50,
    "argument_error": 30,
    "unknown_tool": 20,
    "duplicate": 10,
    "escalated": 22,  # open item if the call is under two days old, else an operator rejected it
    "approval": 8,  # open item if under two days old, else approved and executed
}
#: Escalations and approvals older than this were decided by an operator.
DECIDED_AFTER = timedelta(days=2)
OPERATOR = "seed-operator"


@dataclass(frozen=True)
class SeedResult:
    project: Project
    calls: int
    events: int
    review_items: int
    seconds: float


def _parameters() -> dict:
    return {
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": "The record's identifier."},
            "note": {"type": "string", "description": "Free text for the record."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        "required": ["id"],
        "additionalProperties": False,
    }


def _setup_project(project: Project) -> tuple[list[Agent], dict[str, ToolContract]]:
    """Agents ``agent-01`` … and the 20 tools' contracts (every agent registers every tool)."""
    agents = [
        Agent.objects.get_or_create(project=project, name=f"agent-{i:02d}")[0]
        for i in range(1, AGENTS + 1)
    ]
    contracts = {}
    for name, effect, reconcilable, approval in TOOLS:
        payload = ContractIn(
            description=f"{name.replace('_', ' ').capitalize()} in the shop's back office.",
            effect=effect,
            idempotent=False,
            reconcilable=reconcilable,
            requires_approval=approval,
            sensitive_fields=["note"] if effect == "write" else [],
            parameters=_parameters(),
        )
        contracts[name], _ = services.contract_register(agent=agents[0], name=name, payload=payload)
    AgentTool.objects.bulk_create(
        [AgentTool(agent=a, name=name) for a in agents[1:] for name, *_ in TOOLS],
        ignore_conflicts=True,
    )
    project_config_bump(agents[0].project_id)  # a bulk insert sends no signal
    return agents, contracts


def _event(type_: str, **fields):
    import uuid

    return EVENT_ADAPTER.validate_python(
        {
            "event_id": str(uuid.uuid4()),
            "occurred_at": datetime.now(UTC).isoformat(),
            "type": type_,
            **fields,
        }
    )


def _proposal(op: str, tool: str, arguments: dict, *, n: int) -> object:
    import json

    return _event(
        "proposed",
        operation_id=op,
        request_id=f"req_t{n}",
        conversation_id=f"conv_t{n}",
        trace_id=f"trace_t{n}",
        actor=f"user-{n % 97}@example.com",
        call_id=f"call_t{n}",
        format="openai",
        call={
            "id": f"call_t{n}",
            "type": "function",
            "function": {"name": tool, "arguments": json.dumps(arguments)},
        },
    )


def _template(*, project: Project, agent: Agent, tool: str, scenario: str, decided: bool, n: int):
    """Drive one template call of ``scenario`` through the engine; returns its operation ID."""
    from reviews import services as review_services
    from reviews.models import ReviewItem

    op = f"tpl_{n}"
    args = {"id": f"R-{n:05d}", "limit": 10}
    if tool.startswith(("create", "update", "send", "add", "issue", "cancel", "apply", "close")):
        args = {"id": f"R-{n:05d}", "note": "customer asked on the phone"}

    def apply(*events) -> None:
        for event in events:
            events_apply(project=project, agent=agent, events=[event])

    if scenario == "argument_error":
        apply(_proposal(op, tool, {"limit": "ten"}, n=n))
        return op
    if scenario == "unknown_tool":
        apply(_proposal(op, f"{tool}_all", args, n=n))
        return op
    apply(_proposal(op, tool, args, n=n))
    success = {"rows": [{"id": args["id"], "status": "ok"}]}
    if scenario == "success":
        apply(
            _event(
                "attempt", operation_id=op, attempt=1, outcome="success", sent=True, result=success
            )
        )
    elif scenario == "empty":
        apply(
            _event("attempt", operation_id=op, attempt=1, outcome="success", sent=True, result=[])
        )
    elif scenario == "retry_success":
        apply(
            _event(
                "attempt", operation_id=op, attempt=1, outcome="error", sent=True, http_status=503
            ),
            _event(
                "attempt", operation_id=op, attempt=2, outcome="success", sent=True, result=success
            ),
        )
    elif scenario == "duplicate":
        apply(
            _event(
                "attempt", operation_id=op, attempt=1, outcome="success", sent=True, result=success
            )
        )
        apply(_proposal(op, tool, args, n=n))
    elif scenario == "escalated":
        apply(_event("attempt", operation_id=op, attempt=1, outcome="timeout", sent=True))
        call = ToolCall.objects.get(project=project, operation_id=op)
        if call.state == ToolCall.State.RECONCILING:  # the agent's look-up found nothing clear
            apply(_event("reconciled", operation_id=op, found=True, matches=False))
    elif scenario == "approval":
        if decided:
            item = ReviewItem.objects.get(call__project=project, call__operation_id=op)
            user = get_user_model().objects.get(username=OPERATOR)
            review_services.review_item_decide(item=item, user=user, decision="approve")
            apply(
                _event(
                    "attempt",
                    operation_id=op,
                    attempt=1,
                    outcome="success",
                    sent=True,
                    result=success,
                )
            )
        return op
    if scenario == "escalated" and decided:
        item = ReviewItem.objects.get(
            call__project=project, call__operation_id=op, status__in=ReviewItem.OPEN_STATUSES
        )
        user = get_user_model().objects.get(username=OPERATOR)
        review_services.review_item_decide(
            item=item, user=user, decision="reject", reason="Not allowed for this customer."
        )
    return op


def _tools_for(scenario: str) -> list[int]:
    """Indexes of the tools a scenario happens on: approvals on approval tools (every call
    of one waits for a human), unknown outcomes on writes, the rest on the other tools."""
    if scenario == "approval":
        return [i for i, (*_x, approval) in enumerate(TOOLS) if approval]
    plain = [i for i, (*_x, approval) in enumerate(TOOLS) if not approval]
    if scenario == "escalated":
        return [i for i in plain if TOOLS[i][1] == "write"]
    return plain


def _templates(scratch: Project) -> list[tuple[str, int, bool, int]]:
    """Template calls in ``scratch``: ``(scenario, tool index, decided, call id)`` each."""
    agents, contracts = _setup_project(scratch)
    out, n = [], 0
    for scenario in SCENARIOS:
        for index, (name, *_rest) in enumerate(TOOLS):
            if index not in _tools_for(scenario) or name not in contracts:
                continue
            for decided in (False, True) if scenario in ("escalated", "approval") else (False,):
                n += 1
                op = _template(
                    project=scratch,
                    agent=agents[0],
                    tool=name,
                    scenario=scenario,
                    decided=decided,
                    n=n,
                )
                call_id = ToolCall.objects.get(project=scratch, operation_id=op).pk
                out.append((scenario, index, decided, call_id))
    return out


# --- the clone ----------------------------------------------------------------------------


def _columns(model: type[models.Model]) -> list[models.Field]:
    return [f for f in model._meta.concrete_fields]


def _select_list(model, special: dict[str, str], *, alias: str = "t") -> tuple[str, str]:
    """Column list and select list copying ``model`` rows from ``alias``: each column is
    ``special[column]`` if given, else timestamps shifted by ``m.shift``, else copied."""
    cols, exprs = [], []
    for field in _columns(model):
        col = field.column
        assert col is not None  # a concrete field has a column
        cols.append(col)
        if col in special:
            exprs.append(special[col])
        elif isinstance(field, models.DateTimeField):
            exprs.append(f"{alias}.{col} + m.shift")
        else:
            exprs.append(f"{alias}.{col}")
    return ", ".join(cols), ", ".join(exprs)


def _id_text(prefix: str, seed: int, column: str) -> str:
    """SQL for a fresh deterministic identifier of call number ``m.n`` (empty stays empty)."""
    return (
        f"CASE WHEN t.{column} = '' THEN '' ELSE "
        f"'{prefix}' || substr(md5('{prefix}{seed}:' || m.n), 1, 24) END"
    )


TEMP_TABLES = ("seed_template", "seed_agent", "seed_contract", "seed_draw", "seed_map", "seed_item")


def _clone(
    *,
    project: Project,
    scratch: Project,
    templates: list[tuple[str, int, bool, int]],
    calls: int,
    days: int,
    seed: int,
    say: Callable[[str], None],
) -> None:
    from reviews.models import ReviewAudit, ReviewItem

    call_t, event_t = ToolCall._meta.db_table, CallEvent._meta.db_table
    item_t, audit_t = ReviewItem._meta.db_table, ReviewAudit._meta.db_table
    budget_t = RequestBudget._meta.db_table
    agents = list(
        Agent.objects.filter(project=project).order_by("name").values_list("id", flat=True)
    )
    scratch_agents = list(
        Agent.objects.filter(project=scratch).order_by("name").values_list("id", flat=True)
    )
    contract_map = dict(
        ToolContract.objects.filter(project=project).values_list("name", "id")
    )  # one version per tool name in a seeded project
    # cumulative scenario weights → a CASE over the draw r in [0, 1000)
    bounds, total = [], 0
    for scenario, weight in SCENARIOS.items():
        total += weight
        bounds.append((total, scenario))
    scenario_case = "CASE " + " ".join(f"WHEN r < {b} THEN '{s}'" for b, s in bounds) + " END"
    now = datetime.now(UTC)
    seed_fraction = (seed % 1000) / 1000.0
    plain = _tools_for("success")
    tool_case = (
        "CASE "
        + " ".join(
            f"WHEN {scenario_case} = '{s}' THEN "
            f"(ARRAY{_tools_for(s)})[mod(tool, {len(_tools_for(s))}) + 1]"
            for s in ("approval", "escalated")
        )
        + f" ELSE (ARRAY{plain})[tool + 1] END"
    )
    with connection.cursor() as cur:
        # ON COMMIT DROP, and dropped first: a caller's outer transaction (tests) may still
        # hold the previous run's
        cur.execute(f"DROP TABLE IF EXISTS {', '.join(TEMP_TABLES)}")
        cur.execute("SELECT setseed(%s)", [seed_fraction])
        cur.execute(
            "CREATE TEMP TABLE seed_template (scenario text, tool int, decided bool, call_id bigint)"
            " ON COMMIT DROP"
        )
        cur.executemany("INSERT INTO seed_template VALUES (%s, %s, %s, %s)", templates)
        cur.execute(
            "CREATE TEMP TABLE seed_agent (i int, id bigint, scratch_id bigint) ON COMMIT DROP"
        )
        cur.executemany(
            "INSERT INTO seed_agent VALUES (%s, %s, %s)",
            [(i, a, s) for i, (a, s) in enumerate(zip(agents, scratch_agents, strict=True))],
        )
        cur.execute("CREATE TEMP TABLE seed_contract (scratch_id bigint, id bigint) ON COMMIT DROP")
        cur.executemany(
            "INSERT INTO seed_contract VALUES (%s, %s)",
            [
                (c.pk, contract_map[c.name])
                for c in ToolContract.objects.filter(project=scratch)
                if c.name in contract_map
            ],
        )
        # The draws: r picks the scenario, the tool is skewed (index ~ k * u^2: reads first),
        # agents uniform, creation times uniform over the window.
        cur.execute(
            f"""
            CREATE TEMP TABLE seed_draw ON COMMIT DROP AS
            SELECT n, floor(random() * 1000)::int AS r,
                   least(floor(power(random(), 2) * {len(plain)})::int, {len(plain) - 1}) AS tool,
                   floor(random() * {len(agents)})::int AS agent,
                   %s::timestamptz - random() * %s * interval '1 day' AS created_at
            FROM generate_series(1, %s) AS n
            """,
            [now, days, calls],
        )
        cur.execute(
            f"""
            CREATE TEMP TABLE seed_map ON COMMIT DROP AS
            SELECT d.n, nextval(pg_get_serial_sequence('{call_t}', 'id')) AS id,
                   a.id AS agent_id, d.created_at, t.call_id AS template_id
            FROM (SELECT n, created_at, agent, {scenario_case} AS scenario, {tool_case} AS tool
                  FROM seed_draw) d
            JOIN seed_agent a ON a.i = d.agent
            JOIN seed_template t ON t.tool = d.tool AND t.scenario = d.scenario
                 AND t.decided = (d.scenario IN ('escalated', 'approval')
                                  AND d.created_at < %s::timestamptz - %s * interval '1 second')
            ORDER BY d.n
            """,
            [now, DECIDED_AFTER.total_seconds()],
        )
        cur.execute(
            f"ALTER TABLE seed_map ADD COLUMN shift interval; "
            f"UPDATE seed_map m SET shift = m.created_at - c.created_at "
            f"FROM {call_t} c WHERE c.id = m.template_id"
        )
        cur.execute("ANALYZE seed_map")
        say(f"  drew {calls} calls")

        cols, exprs = _select_list(
            ToolCall,
            {
                "id": "m.id",
                "project_id": str(project.pk),
                "agent_id": "m.agent_id",
                "contract_id": "sc.id",
                "operation_id": f"'op_' || substr(md5('op{seed}:' || m.n), 1, 32)",
                "request_id": _id_text("req_", seed, "request_id"),
                "conversation_id": _id_text("conv_", seed, "conversation_id"),
                "trace_id": _id_text("trace_", seed, "trace_id"),
                "call_id": _id_text("call_", seed, "call_id"),
            },
        )
        cur.execute(
            f"INSERT INTO {call_t} ({cols}) SELECT {exprs} FROM seed_map m "
            f"JOIN {call_t} t ON t.id = m.template_id "
            f"LEFT JOIN seed_contract sc ON sc.scratch_id = t.contract_id"
        )
        say(f"  calls: {cur.rowcount}")

        cols, exprs = _select_list(
            CallEvent,
            {
                "id": f"nextval(pg_get_serial_sequence('{event_t}', 'id'))",
                "project_id": str(project.pk),
                "call_id": "m.id",
                "event_id": f"md5('ev{seed}:' || m.n || ':' || t.id)::uuid",
            },
        )
        cur.execute(
            f"INSERT INTO {event_t} ({cols}) SELECT {exprs} FROM seed_map m "
            f"JOIN {event_t} t ON t.call_id = m.template_id ORDER BY m.n, t.id"
        )
        say(f"  events: {cur.rowcount}")

        cur.execute(
            f"""
            CREATE TEMP TABLE seed_item ON COMMIT DROP AS
            SELECT nextval(pg_get_serial_sequence('{item_t}', 'id')) AS id, t.id AS template_id,
                   m.id AS call_id, m.agent_id, m.shift
            FROM seed_map m JOIN {item_t} t ON t.call_id = m.template_id ORDER BY m.n, t.id
            """
        )
        cols, exprs = _select_list(
            ReviewItem,
            {
                "id": "m.id",
                "project_id": str(project.pk),
                "call_id": "m.call_id",
                "agent_id": "m.agent_id",
            },
        )
        cur.execute(
            f"INSERT INTO {item_t} ({cols}) SELECT {exprs} FROM seed_item m "
            f"JOIN {item_t} t ON t.id = m.template_id"
        )
        say(f"  review items: {cur.rowcount}")
        cols, exprs = _select_list(
            ReviewAudit,
            {
                "id": f"nextval(pg_get_serial_sequence('{audit_t}', 'id'))",
                "project_id": str(project.pk),
                "item_id": "m.id",
            },
        )
        cur.execute(
            f"INSERT INTO {audit_t} ({cols}) SELECT {exprs} FROM seed_item m "
            f"JOIN {audit_t} t ON t.item_id = m.template_id ORDER BY m.id, t.id"
        )
        cols, exprs = _select_list(
            RequestBudget,
            {
                "id": f"nextval(pg_get_serial_sequence('{budget_t}', 'id'))",
                "project_id": str(project.pk),
                "request_id": f"'req_' || substr(md5('req_{seed}:' || m.n), 1, 24)",
            },
            alias="b",
        )
        cur.execute(
            f"INSERT INTO {budget_t} ({cols}) SELECT {exprs} FROM seed_map m "
            f"JOIN {call_t} t ON t.id = m.template_id "
            f"JOIN {budget_t} b ON b.project_id = %s AND b.request_id = t.request_id "
            f"AND b.tool_name = t.tool_name",
            [scratch.pk],
        )


def rollups_rewrite(*, project: Project) -> int:
    """Rewrite the project's ``CallRollup`` rows from one aggregate over its calls
    (``callgate.reports.rollups.rollup_cells``, every bucket at once), then its
    ``RollupCube`` rows from those (``cubes_rewrite``). Returns the number of ``CallRollup``
    rows. For a freshly seeded project; live projects use the refresh."""
    from callgate.reports.rollups import cubes_rewrite, rollup_cells

    with transaction.atomic():
        CallRollup.objects.filter(project=project).delete()
        cells = rollup_cells(ToolCall.objects.filter(project=project))
        rows = CallRollup.objects.bulk_create(
            (CallRollup(project=project, **cell) for cell in cells.iterator(chunk_size=5000)),
            batch_size=5000,
        )
        cubes_rewrite(project_id=project.pk)
    return len(rows)


def membership_operator(project: Project) -> None:
    """The operator who decides the seeded escalations: ``seed-operator`` (no password)."""
    User = get_user_model()
    if not User.objects.filter(username=OPERATOR).exists():
        User.objects.create_user(username=OPERATOR, password=None)
    services.membership_set(project_slug=project.slug, username=OPERATOR, role="operator")


def seed_scale(
    *,
    slug: str,
    calls: int,
    days: int = 30,
    seed: int = 1,
    say: Callable[[str], None] = lambda _line: None,
) -> SeedResult:
    """Add ``calls`` calls spread over the last ``days`` days to the project ``slug`` (created
    if missing, with 10 agents and 20 tool contracts), with their events, review items (about
    3% escalated), audit rows and re-ask budgets as ingest writes them, then rewrite the
    project's rollups and ``VACUUM (ANALYZE)`` the tables (``ANALYZE`` alone inside a
    transaction). Raises ValueError on a bad slug, ``calls`` < 1 or ``days`` < 1, or a
    database other than PostgreSQL. ``say`` receives progress lines."""
    if connection.vendor != "postgresql":
        raise ValueError("seed_scale needs PostgreSQL")
    if calls < 1 or days < 1:
        raise ValueError("calls and days must be at least 1")
    started = time.monotonic()
    project, _ = services.project_create(slug=slug, name=slug.replace("-", " ").title())
    _setup_project(project)
    membership_operator(project)
    scratch, _ = services.project_create(slug=f"seed-templates-{project.pk}", name="seed templates")
    try:
        membership_operator(scratch)
        templates = _templates(scratch)
        say(f"  {len(templates)} template calls through the ingest engine")
        before = ToolCall.objects.filter(project=project).count()
        with transaction.atomic():
            _clone(
                project=project,
                scratch=scratch,
                templates=templates,
                calls=calls,
                days=days,
                seed=seed,
                say=say,
            )
    finally:
        ToolCall.objects.filter(project=scratch).delete()  # contracts are protected by calls
        scratch.delete()
    rows = rollups_rewrite(project=project)
    say(f"  rollups: {rows} rows")
    from callgate.reports.tallies import refusal_rollups_rebuild, review_rollups_rebuild
    from reviews.models import ClosedItemCount, ReviewAudit, ReviewItem, ReviewRollup

    say(f"  review rollups: {review_rollups_rebuild(project_id=project.pk)} rows")
    say(f"  refusal rollups: {refusal_rollups_rebuild(project_id=project.pk)} rows")

    # as autovacuum would after a bulk load (PostgreSQL 13+ vacuums after inserts too): the
    # statistics, and the visibility map that lets index-only scans skip the rows; only
    # ANALYZE inside a transaction (tests), where VACUUM cannot run
    command = "ANALYZE" if connection.in_atomic_block else "VACUUM (ANALYZE)"
    with connection.cursor() as cur:
        for model in (
            ToolCall,
            CallEvent,
            ReviewItem,
            ReviewAudit,
            ReviewRollup,
            ClosedItemCount,
            RefusalRollup,
            CallRollup,
            RollupCube,
            RequestBudget,
        ):
            cur.execute(f"{command} {model._meta.db_table}")
    return SeedResult(
        project=project,
        calls=ToolCall.objects.filter(project=project).count() - before,
        events=CallEvent.objects.filter(project=project).count(),
        review_items=ReviewItem.objects.filter(project=project).count(),
        seconds=time.monotonic() - started,
    )
