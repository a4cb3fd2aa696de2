"""Writes of the core domain. Views, commands and tasks call these; nothing else writes.

Services take keyword-only arguments, validate, and keep their transactions short.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from urllib.parse import parse_qsl, urlencode

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from callgate.classification import schema_problems, validate_arguments
from callgate.inbox import EventRefused, event_settle
from callgate.ingest import events_apply
from callgate.lifecycle import IllegalTransition
from callgate.lint import lint_contract
from callgate.models import (
    Agent,
    AgentTool,
    CallEvent,
    Membership,
    Project,
    RequestBudget,
    SavedView,
    ToolCall,
    ToolContract,
)
from callgate.schemas import (
    ApprovalExpiredEvent,
    AttemptEvent,
    ContractIn,
    DeadlinePassedEvent,
    DecisionEvent,
    GateRequest,
    ProposedEvent,
    ReconciledEvent,
    ReconcileFailedEvent,
    TurnEvent,
)
from callgate.taxonomy import Reason, Route, category_of
from callgate_sdk.providers import finite_float, no_constants, number_problem
from callgate_sdk.wire import (
    HIDDEN_MOVED,
    MAX_JSON_DEPTH,
    REDACTED,
    arguments_digest,
    canonical_arguments,
    derive_operation_id,
    hidden_moves,
    json_depth,
    redact,
)


def project_create(*, slug: str, name: str) -> tuple[Project, bool]:
    """Create a project, or return the existing one with this slug. Raises ValueError on a bad slug."""
    if slugify(slug) != slug or not slug:
        raise ValueError(
            f"project slug must be lowercase letters, digits and hyphens, got {slug!r}"
        )
    return Project.objects.get_or_create(slug=slug, defaults={"name": name})


def project_by_slug(slug: str) -> Project:
    project = Project.objects.filter(slug=slug).first()
    if project is None:
        raise ValueError(f"no project with slug {slug!r}")
    return project


@transaction.atomic
def membership_set(
    *, project_slug: str, username: str, role: str, password: str | None = None
) -> Membership:
    """Give ``username`` the ``role`` in the project (created or changed). With ``password`` a
    missing user is created. Raises ValueError for an unknown project or user."""
    project = project_by_slug(project_slug)
    if role not in Membership.Role.values:
        raise ValueError(f"role must be one of {', '.join(Membership.Role.values)}, got {role!r}")
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is None:
        if not password:
            raise ValueError(f"no user {username!r}; pass --password to create one")
        user = User.objects.create_user(username=username, password=password)
    membership, _ = Membership.objects.update_or_create(
        user=user, project=project, defaults={"role": role}
    )
    return membership


def agent_get_or_create(*, project_slug: str, name: str) -> Agent:
    project = project_by_slug(project_slug)
    agent, _ = Agent.objects.get_or_create(project=project, name=name)
    return agent


# --- tool contracts -------------------------------------------------------------------------


class ContractRejected(ValueError):
    """The contract cannot be registered; ``loc`` names the field."""

    def __init__(self, loc: str, msg: str):
        self.loc, self.msg = loc, msg
        super().__init__(f"{loc}: {msg}")


#: The contract fields TAXONOMY v2 added, with their defaults.
V2_DEFAULTS = {
    "volatile_arguments": [],
    "max_identical": 3,
    "not_found_may_hide_forbidden": False,
    "result_error_markers": True,
}


class ContractForbidden(ContractRejected):
    """This agent may not publish a changed version of another agent's tool."""


def _contract_checked(*, name: str, payload: ContractIn) -> str:
    """The digest of a valid contract body; raises ``ContractRejected``."""
    if payload.name is not None and payload.name != name:
        raise ContractRejected(
            "name", f"the body names {payload.name!r} but the URL names {name!r}"
        )
    if problem := schema_problems(payload.parameters):
        raise ContractRejected("parameters", problem)
    # v2 fields left at their defaults stay out of the digest: a v1 contract sent again is
    # the same version
    body = payload.model_dump(mode="json", exclude={"name", "version"})
    for key, default in V2_DEFAULTS.items():
        if body.get(key) == default:
            body.pop(key)
    return arguments_digest(body)


def contract_register(*, agent: Agent, name: str, payload: ContractIn) -> tuple[ToolContract, bool]:
    """Register ``name`` for ``agent``: the same contract again is a no-op, a changed one
    becomes the next version; used versions are never modified. Returns (version, created).

    The agent that created the tool owns it: only it (or a project admin, with
    ``contract_publish`` from the contract's page) publishes changed versions. Another agent
    that registers the identical contract gets to use it (read access), never to change it.

    Raises ``ContractRejected`` for an invalid JSON Schema (draft 2020-12) or one over the
    complexity budget (``classification.schema_problems``), or a body whose ``name`` differs
    from the URL's; ``ContractForbidden`` for a changed contract from an agent that does not
    own the tool (issue 16: one agent cannot weaken another's contract)."""
    digest = _contract_checked(name=name, payload=payload)
    project = agent.project
    for attempt in range(3):
        try:
            with transaction.atomic():
                latest = _latest_contract(project=project, name=name)
                if latest is not None and latest.digest == digest:
                    AgentTool.objects.get_or_create(agent=agent, name=name)
                    return latest, False
                if latest is not None:
                    owners = AgentTool.objects.filter(agent__project=project, name=name, owner=True)
                    if not owners.filter(agent=agent).exists():
                        created_by = ", ".join(sorted(owners.values_list("agent__name", flat=True)))
                        raise ContractForbidden(
                            "name",
                            f"{name!r} was created by {created_by or 'another agent'}; only it "
                            "or a project admin can publish a changed contract (registering the "
                            "identical contract lets this agent use it)",
                        )
                tool, _ = AgentTool.objects.get_or_create(agent=agent, name=name)
                if latest is None and not tool.owner:
                    tool.owner = True
                    tool.save(update_fields=["owner"])
                contract = _contract_version_create(
                    project=project,
                    name=name,
                    payload=payload,
                    digest=digest,
                    latest=latest,
                    published_by=f"agent {agent.name}",
                )
                return contract, True
        except IntegrityError:  # a concurrent registration took the version number
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def contract_publish(
    *, project: Project, name: str, payload: ContractIn, user
) -> tuple[ToolContract, bool]:
    """A project admin publishes ``payload`` as the next version of the existing tool
    ``name`` (the contract page's action); the same contract again is a no-op. Returns
    (version, created). Raises ``ContractRejected`` as ``contract_register`` does, and for a
    tool the project does not have (``name``)."""
    digest = _contract_checked(name=name, payload=payload)
    with transaction.atomic():
        latest = _latest_contract(project=project, name=name, lock=True)
        if latest is None:
            raise ContractRejected("name", f"no tool {name!r} in this project")
        if latest.digest == digest:
            return latest, False
        contract = _contract_version_create(
            project=project,
            name=name,
            payload=payload,
            digest=digest,
            latest=latest,
            published_by=f"user {user.get_username()}",
        )
        return contract, True


def _latest_contract(*, project: Project, name: str, lock: bool = False) -> ToolContract | None:
    versions = ToolContract.objects.filter(project=project, name=name).order_by("-version")
    return (versions.select_for_update() if lock else versions).first()


def _contract_version_create(
    *,
    project: Project,
    name: str,
    payload: ContractIn,
    digest: str,
    latest: ToolContract | None,
    published_by: str,
) -> ToolContract:
    if payload.reconcile_url:
        method = ToolContract.ReconcileMethod.HTTP
    elif payload.reconcilable:
        method = ToolContract.ReconcileMethod.AGENT
    else:
        method = ToolContract.ReconcileMethod.NONE
    report = lint_contract(
        name=name, description=payload.description, parameters=payload.parameters
    )
    return ToolContract.objects.create(
        project=project,
        name=name,
        version=(latest.version + 1) if latest else 1,
        label=payload.version or "",
        description=payload.description,
        parameters=payload.parameters,
        effect=payload.effect,
        idempotent=payload.idempotent,
        reconcile_method=method,
        reconcile_url=payload.reconcile_url or "",
        max_attempts=payload.max_attempts,
        max_reasks=payload.max_reasks,
        retry_initial_interval=payload.retry.initial_interval,
        retry_backoff_coefficient=payload.retry.backoff_coefficient,
        retry_maximum_interval=payload.retry.maximum_interval,
        deadline_seconds=payload.retry.deadline_seconds,
        requires_approval=payload.requires_approval,
        approval_timeout_seconds=payload.approval_timeout_seconds,
        sensitive_fields=payload.sensitive_fields,
        volatile_arguments=payload.volatile_arguments,
        max_identical=payload.max_identical,
        not_found_may_hide_forbidden=payload.not_found_may_hide_forbidden,
        result_error_markers=payload.result_error_markers,
        digest=digest,
        lint_score=report.score,
        lint_findings=[f.as_dict() for f in report.findings],
        published_by=published_by,
    )


# --- events that do not come from the agent ------------------------------------------------


def _apply_one(*, call: ToolCall, event, source: str, user=None) -> ToolCall:
    """Apply one event to ``call`` through the ingest path; raises IllegalTransition or
    ValueError when the rules refuse it."""
    outcome = events_apply(
        project=call.project, agent=call.agent, events=[event], source=source, user=user
    )[0]
    if outcome.status != "accepted":
        message = "; ".join(e["msg"] for e in outcome.errors) or outcome.status
        raise IllegalTransition(call.state, event.type, message)
    return ToolCall.objects.select_related("contract", "agent", "project").get(pk=call.pk)


def _envelope(call: ToolCall) -> dict:
    return {
        "event_id": uuid.uuid4(),
        "occurred_at": timezone.now(),
        "operation_id": call.operation_id,
    }


def call_apply_decision(*, call: ToolCall, decision: str, reason: str, user) -> ToolCall:
    """An operator's decision (``approve``, ``reject``, ``approve_retry``, ``mark_applied``,
    ``mark_failed``) on ``call``, per TAXONOMY "Human decisions". Records an operator event.
    Raises ``callgate.lifecycle.IllegalTransition`` when the call's state does not allow it."""
    event = DecisionEvent.model_validate(
        {"type": "decision", "decision": decision, "reason": reason or "", **_envelope(call)}
    )
    return _apply_one(call=call, event=event, source=CallEvent.Source.OPERATOR, user=user)


#: Why an edit cannot take the operation ID its arguments derive.
TAKEN = "another call of this request already has these arguments; decide that call instead"


class ArgumentsRefused(ValueError):
    """Edited arguments that cannot replace a call's: ``problems``, each
    ``{"path": "$.a[0]", "msg": "…"}`` (JSON paths as the gate's observations name them)."""

    def __init__(self, problems: list[dict]):
        self.problems = problems
        super().__init__("; ".join(f"{p['path']}: {p['msg']}" for p in problems))


def arguments_parse(text: str):
    """An operator's typed arguments ("approve with edits"), parsed as strict JSON (RFC 8259
    §6: no NaN or Infinity), as the gate reads an agent's (``callgate_sdk.providers``): a
    number beyond a double's range (``1e400``) or an integer of more digits than Python
    reads (``sys.get_int_max_str_digits()``, 4,300) is refused too. Returns the value (any
    JSON type: ``call_arguments_edit`` checks the rest). Raises ``ArgumentsRefused`` with
    one problem at ``$`` (JSON syntax: its line and column)."""
    try:
        return json.loads(text, parse_constant=no_constants, parse_float=finite_float)
    except json.JSONDecodeError as exc:
        problem = f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    except RecursionError:
        problem = f"nested deeper than {MAX_JSON_DEPTH}"
    except ValueError as exc:  # NaN, Infinity, 1e400, or too many digits
        problem = number_problem(exc)
    raise ArgumentsRefused([{"path": "$", "msg": problem}])


def _unstorable(value, path: str = "$") -> list[dict]:
    """Where ``value`` holds what JSON cannot say or PostgreSQL's jsonb cannot store: a NaN
    or infinite number, a NUL (U+0000) or an unpaired surrogate in a string or a key."""

    def bad_text(text: str) -> str | None:
        if "\x00" in text:
            return "must not contain a NUL character (U+0000)"
        if any("\ud800" <= ch <= "\udfff" for ch in text):
            return "must not contain an unpaired surrogate (not Unicode text)"
        return None

    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            here = f"{path}.{key}"
            if isinstance(key, str) and (problem := bad_text(key)):
                found.append({"path": here, "msg": f"the key {problem}"})
            found += _unstorable(item, here)
        return found
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _unstorable(item, f"{path}[{i}]")]
    if isinstance(value, float) and not math.isfinite(value):
        return [{"path": path, "msg": "must be a finite number (JSON has no NaN or Infinity)"}]
    if isinstance(value, str) and (problem := bad_text(value)):
        return [{"path": path, "msg": problem}]
    return []


def _leaves(value, path: str = "$") -> dict[str, object]:
    """Every scalar (and empty container) of a JSON value by its JSON path."""
    if isinstance(value, dict) and value:
        return {
            k: v for key, item in value.items() for k, v in _leaves(item, f"{path}.{key}").items()
        }
    if isinstance(value, list) and value:
        return {
            k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{path}[{i}]").items()
        }
    return {path: value}


def arguments_changes(before, after) -> list[dict]:
    """What an edit changed, leaf by leaf: ``[{"path", "from", "to"}]`` in path order; a
    value added has ``from`` None, one removed ``to`` None."""
    old, new = _leaves(before), _leaves(after)
    return [
        {"path": path, "from": old.get(path), "to": new.get(path)}
        for path in sorted(old.keys() | new.keys())
        if old.get(path, ...) != new.get(path, ...)
    ]


def call_arguments_edit(*, call: ToolCall, arguments) -> tuple[ToolCall, dict | None]:
    """Replace the arguments of ``call`` (locked by the caller, in its transaction) with an
    operator's ``arguments`` before approving it ("approve with edits"). Returns the call
    and what changed (``{"arguments": [changes], "operation_id": {"from", "to"}}``), or
    ``(call, None)`` when the edit equals the stored arguments (a plain approval).

    Rules, in order; every failure raises ``ArgumentsRefused`` naming each problem by JSON
    path, and nothing is written:

    - ``arguments`` is a JSON object, at most ``MAX_JSON_DEPTH`` deep, that JSON can say
      and PostgreSQL can store: no NaN or infinite number, no NUL or unpaired surrogate.
    - Sensitive values (the contract's ``sensitive_fields`` and obvious secrets) are never
      stored, so they cannot be edited: a value shown as ``•••`` left as is keeps the
      agent's value (the agent puts its own back by its place: ``callgate_sdk`` does), any
      other value at a sensitive path is refused. A ``•••`` may not move: one typed where
      nothing was hidden, or in an array that lost, gained or reordered entries
      (``wire.hidden_moves``), is refused at that path (``wire.HIDDEN_MOVED``), so a hidden
      value is never put back into another entry.
    - The arguments are validated against the contract's JSON Schema with the gate's
      validator (``classification.validate_arguments``); a kept ``•••`` stands for a value
      the gate already accepted, so problems at its path are not the edit's.

    The operation ID (TAXONOMY v2 "Operation IDs"): one operation ID names one set of
    canonical arguments (a re-sent ID with other arguments is ``idempotency_mismatch``, and
    a target that dedupes by it would answer the first arguments' result), so an edit that
    changes the canonical arguments (volatile ones left out) is a new operation. It gets
    the ID callgate gives any operation its runtime did not name: derived from the request
    ID, the tool and the new canonical arguments (``wire.derive_operation_id``), or a fresh
    ``op_<uuid>`` without a request ID. The ID the agent proposed is kept in
    ``proposed_operation_id`` (and the digest of its arguments in
    ``proposed_arguments_digest``), so it keeps naming this call everywhere: an agent still
    waiting under it finds the call (``GET /api/v1/calls/{operation_id}``, the MCP gateway)
    and learns the new one from the answer, and its events and a repeat of its proposal
    apply to this call (``callgate.ingest``), never to a new one. A new ID that names
    another call (as its own or as the one it was proposed under) is refused. An edit of
    volatile arguments only keeps the ID. The digest is of the new
    canonical arguments (with a kept ``•••`` as it stands: callgate never had the value).
    """
    contract = call.contract
    problems: list[dict] = []
    if not isinstance(arguments, dict):
        raise ArgumentsRefused([{"path": "$", "msg": "must be a JSON object"}])
    if json_depth(arguments) > MAX_JSON_DEPTH:
        raise ArgumentsRefused([{"path": "$", "msg": f"nested deeper than {MAX_JSON_DEPTH}"}])
    if unstorable := _unstorable(arguments):
        raise ArgumentsRefused(unstorable)
    if contract is None:
        raise ArgumentsRefused(
            [{"path": "$", "msg": "the call has no contract to check edited arguments against"}]
        )
    stored = _leaves(call.arguments or {})
    typed = _leaves(arguments)
    hidden = _leaves(redact(arguments, contract.sensitive_fields or ()))
    kept = set()
    for path, value in hidden.items():
        if value != REDACTED:
            continue  # not sensitive
        if typed.get(path) == REDACTED and stored.get(path) == REDACTED:
            kept.add(path)
        elif typed.get(path) == REDACTED:  # where nothing was hidden: moved, or meaningless
            problems.append({"path": path, "msg": HIDDEN_MOVED})
        else:
            problems.append(
                {
                    "path": path,
                    "msg": "a sensitive value: callgate never stores it, so it cannot be set "
                    "here; leave •••, and the agent keeps its own value",
                }
            )
    problems += [
        {"path": path, "msg": HIDDEN_MOVED} for path in hidden_moves(arguments, call.arguments)
    ]
    problems += [
        {"path": p.path, "msg": p.message}
        for p in validate_arguments(arguments, contract.parameters)
        if p.path not in kept
    ]
    if problems:
        raise ArgumentsRefused(problems)
    new_arguments = redact(arguments, contract.sensitive_fields or ())
    if new_arguments == call.arguments:
        return call, None
    volatile = contract.volatile_arguments or ()
    canonical = canonical_arguments(arguments, volatile)
    operation_id = call.operation_id
    if canonical != canonical_arguments(call.arguments, volatile):
        operation_id = (
            derive_operation_id(
                request_id=call.request_id, tool=call.tool_name, canonical=canonical
            )
            if call.request_id
            else f"op_{uuid.uuid4().hex}"
        )
    if (
        operation_id != call.operation_id
        and ToolCall.objects.filter(
            Q(operation_id=operation_id) | Q(proposed_operation_id=operation_id),
            project_id=call.project_id,
        )
        .exclude(pk=call.pk)
        .exists()
    ):
        raise ArgumentsRefused([{"path": "$", "msg": TAKEN}])
    change = {
        "arguments": arguments_changes(call.arguments, new_arguments),
        "operation_id": {"from": call.operation_id, "to": operation_id},
    }
    if operation_id == call.proposed_operation_id:  # edited back to what the agent proposed
        call.proposed_operation_id = call.proposed_arguments_digest = ""
    elif operation_id != call.operation_id and not call.proposed_operation_id:
        call.proposed_operation_id = call.operation_id
        call.proposed_arguments_digest = call.arguments_digest
    call.operation_id = operation_id
    call.arguments = call.decision_arguments = new_arguments
    call.arguments_digest = hashlib.sha256(canonical).hexdigest()
    call.updated_at = timezone.now()
    try:
        with transaction.atomic():  # a savepoint: another edit may take the ID meanwhile
            call.save(
                update_fields=[
                    "operation_id",
                    "proposed_operation_id",
                    "proposed_arguments_digest",
                    "arguments",
                    "decision_arguments",
                    "arguments_digest",
                    "updated_at",
                ]
            )
    except IntegrityError:
        raise ArgumentsRefused([{"path": "$", "msg": TAKEN}]) from None
    return call, change


def call_approval_expired(*, call: ToolCall) -> ToolCall:
    """Nobody decided before the approval timeout: ``approval_expired`` (never an approval)."""
    return _apply_one(
        call=call,
        event=ApprovalExpiredEvent(type="approval_expired", **_envelope(call)),
        source=CallEvent.Source.CALLGATE,
    )


def call_approval_extend(*, call: ToolCall, expires_at) -> int:
    """Move the approval timeout of a call still ``pending_approval`` to ``expires_at``.
    Returns 1 when the call was waiting, else 0 (it was decided or expired meanwhile)."""
    return ToolCall.objects.filter(pk=call.pk, state=ToolCall.State.PENDING_APPROVAL).update(
        approval_expires_at=expires_at, updated_at=timezone.now()
    )


def call_reconciled(
    *,
    call: ToolCall,
    found: bool,
    matches: bool,
    source: str = CallEvent.Source.CALLGATE,
    detail: dict | None = None,
    receipt=None,
) -> ToolCall:
    """Record a look-up of the operation in the target: applied, absent or different."""
    event = ReconciledEvent(
        type="reconciled",
        found=found,
        matches=matches,
        receipt=receipt,
        detail=detail,
        **_envelope(call),
    )
    return _apply_one(call=call, event=event, source=source)


def call_reconcile_failed(*, call: ToolCall, detail: dict) -> ToolCall:
    """The look-up could not tell (after its retries): records it as a ``reconciled`` event
    with ``found`` null. A call still ``reconciling`` is escalated to a human with its reason
    kept; a call already in review (an operator's "reconcile now") only gets the event, so the
    page shows the result. A call settled meanwhile is returned unchanged."""
    event = ReconcileFailedEvent(type="reconcile_failed", detail=detail, **_envelope(call))
    return _apply_internal(call=call, event=event)


def call_deadline_passed(*, call: ToolCall) -> ToolCall:
    """A call still waiting to retry after its deadline: ``retry_exhausted`` (route review).
    A call that left ``retry_wait`` meanwhile is returned unchanged."""
    event = DeadlinePassedEvent(type="deadline_passed", **_envelope(call))
    return _apply_internal(call=call, event=event)


def _apply_internal(*, call: ToolCall, event) -> ToolCall:
    """Apply one of callgate's own events; a state that no longer allows it (the call moved
    on since the sweep or the look-up began) is not an error: the call is returned as is."""
    try:
        return _apply_one(call=call, event=event, source=CallEvent.Source.CALLGATE)
    except IllegalTransition:
        return ToolCall.objects.select_related("contract", "agent", "project").get(pk=call.pk)


# --- history (replay and case files) ------------------------------------------------------


def receipt_import(
    *,
    agent: Agent,
    tool: str,
    arguments: dict,
    result,
    operation_id: str | None = None,
    request_id: str | None = None,
) -> ToolCall:
    """Store a success that happened before callgate saw it (a case file's ``history``):
    a succeeded call with its receipt, under the given or derived operation ID."""
    contract = (
        ToolContract.objects.filter(project=agent.project, name=tool).order_by("-version").first()
    )
    volatile = contract.volatile_arguments if contract else ()
    if not operation_id:
        if not request_id:
            raise ValueError("a receipt needs operation_id or request_id")
        operation_id = derive_operation_id(
            request_id=request_id, tool=tool, arguments=arguments, volatile_arguments=volatile
        )
    now = timezone.now()
    return ToolCall.objects.create(
        project=agent.project,
        agent=agent,
        operation_id=operation_id,
        request_id=request_id or "",
        tool_name=tool,
        contract=contract,
        arguments=redact(arguments, contract.sensitive_fields if contract else ()),
        arguments_digest=hashlib.sha256(canonical_arguments(arguments, volatile)).hexdigest(),
        state=ToolCall.State.SUCCEEDED,
        reason=Reason.OK,
        category=category_of(Reason.OK),
        route=Route.PROCEED,
        attempts=1,
        receipt=result,
        receipt_at=now,
    )


def request_budget_set(
    *, project: Project, request_id: str, tool_name: str, reasks_used: int
) -> None:
    """Set the re-asks already used for a request and tool (a case file's ``history``)."""
    RequestBudget.objects.update_or_create(
        project=project,
        request_id=request_id,
        tool_name=tool_name,
        defaults={"reasks_used": reasks_used},
    )


def gate_envelope(gate) -> dict:
    """``event_id`` and ``occurred_at`` of a gate request, generated when the agent sent none."""
    return {
        "event_id": gate.event_id or uuid.uuid4(),
        "occurred_at": gate.occurred_at or timezone.now(),
    }


def gate_check(*, project: Project, agent: Agent, gate: GateRequest) -> dict:
    """The gate (``POST /api/v1/calls``): record ``gate`` as a ``proposed`` event (or a
    ``turn`` event when it carries ``turn``), apply it at once and return ``event_answer``'s
    dict: ``answer``, the ``CallAnswer`` (operation ID, verdict, route, observation, receipt),
    and for a turn ``calls``, one answer per call. Raises ``callgate.inbox.EventRefused``
    (see there for its kinds; ``invalid`` for an ``operation_id`` given with a turn)."""
    ids = {
        "request_id": gate.request_id,
        "conversation_id": gate.conversation_id,
        "trace_id": gate.trace_id,
        "actor": gate.actor,
        **gate_envelope(gate),
    }
    if "turn" in gate.model_fields_set:
        if gate.operation_id:
            raise EventRefused(
                "invalid",
                [
                    {
                        "loc": "operation_id",
                        "msg": "the calls of a turn get their own operation IDs; leave it out",
                    }
                ],
            )
        event: TurnEvent | ProposedEvent = TurnEvent.model_validate(
            {"type": "turn", "format": gate.format, "response": gate.turn, **ids}
        )
    else:
        event = ProposedEvent(
            type="proposed",
            format=gate.format,
            call=gate.call,
            operation_id=gate.operation_id,
            **ids,
        )
    return event_settle(project=project, agent=agent, event=event)


def attempt_report(*, project: Project, agent: Agent, attempt: AttemptEvent) -> dict:
    """Report one execution of an allowed call, as ``POST /api/v1/events`` does, and apply it at
    once; returns the ``CallAnswer`` dict that classifies it (what to do next). Raises
    ``callgate.inbox.EventRefused`` (e.g. ``refused`` for an attempt the call's state refuses)."""
    return event_settle(project=project, agent=agent, event=attempt)["answer"]


# --- saved views -------------------------------------------------------------------------

#: Query parameters a saved view never keeps: a page's position, selection and poll state.
SAVED_VIEW_DROPPED = ("before", "after", "last", "seen", "ids", "all_matching")


class SavedViewRejected(ValueError):
    """A saved view that cannot be saved; ``field`` names the form field at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def saved_view_save(*, user, project: Project, page: str, name: str, query: str) -> SavedView:
    """Save the filters and search of a page (``SavedView.Page``: ``calls`` or ``queue``) as
    ``query`` (a query string; a leading ``?`` and the ``SAVED_VIEW_DROPPED`` parameters are
    left out) under ``name`` (1 to ``SavedView.NAME_MAX`` characters, trimmed). The same name
    on the same page replaces the user's earlier view. Raises ``SavedViewRejected`` naming
    ``page``, ``name`` or ``query`` (too long, empty, or holding a NUL)."""
    if page not in SavedView.Page.values:
        raise SavedViewRejected("page", f"must be one of {', '.join(SavedView.Page.values)}")
    name = name.strip()
    if not 0 < len(name) <= SavedView.NAME_MAX:
        raise SavedViewRejected("name", f"must be 1 to {SavedView.NAME_MAX} characters")
    for field, text in (("name", name), ("query", query)):
        if "\x00" in text:  # PostgreSQL text cannot hold it
            raise SavedViewRejected(field, "must not contain a NUL character")
    pairs = parse_qsl(query.removeprefix("?"))
    query = urlencode([(k, v) for k, v in pairs if k not in SAVED_VIEW_DROPPED])
    if len(query) > SavedView.QUERY_MAX:
        raise SavedViewRejected("query", f"is longer than {SavedView.QUERY_MAX} characters")
    view, _ = SavedView.objects.update_or_create(
        user=user, project=project, page=page, name=name, defaults={"query": query}
    )
    return view


def saved_view_delete(*, user, project: Project, pk: int) -> bool:
    """Delete the user's saved view ``pk`` in ``project``; False when there is none (another
    user's view included: nobody deletes another's)."""
    deleted, _ = SavedView.objects.filter(user=user, project=project, pk=pk).delete()
    return bool(deleted)
