"""The transition table of ``callgate.lifecycle``, walked whole without a database: every
(state, event kind) pair and every decision is either allowed or raises, and the state
after an event follows from its route with the documented exceptions."""

from __future__ import annotations

import itertools

import pytest

from callgate.classification import Verdict
from callgate.lifecycle import (
    ALLOWED_DECISIONS,
    ALLOWED_EVENTS,
    STATE_FOR_ROUTE,
    IllegalTransition,
    State,
    check,
    next_state,
)
from callgate.taxonomy import TABLE, Reason, Route, route_of

KINDS = sorted({kind for kinds in ALLOWED_EVENTS.values() for kind in kinds} | {"decision"})
DECISIONS = sorted({d for ds in ALLOWED_DECISIONS.values() for d in ds})
STATES: list[str | None] = [None, *State.values]


def test_the_table_names_every_state_and_only_states():
    assert set(ALLOWED_EVENTS) == set(STATES)
    assert set(ALLOWED_DECISIONS) <= set(State.values)
    assert set(STATE_FOR_ROUTE) == set(Route)
    assert set(STATE_FOR_ROUTE.values()) <= set(State.values)


@pytest.mark.parametrize(("state", "kind"), list(itertools.product(STATES, KINDS)))
def test_every_event_in_every_state_is_allowed_or_raises(state, kind):
    allowed = kind in ALLOWED_EVENTS[state]
    decisions = sorted(ALLOWED_DECISIONS.get(state or "", ())) if kind == "decision" else [None]
    if allowed and decisions:
        for decision in decisions:
            check(state, kind, decision=decision)  # does not raise
    else:
        with pytest.raises(IllegalTransition) as raised:
            check(state, kind, decision=decisions[0] if decisions else "approve")
        assert raised.value.state == (state or "new") and raised.value.kind == kind


@pytest.mark.parametrize(("state", "decision"), list(itertools.product(State.values, DECISIONS)))
def test_a_decision_the_state_does_not_allow_raises_naming_it(state, decision):
    if "decision" in ALLOWED_EVENTS[state] and decision in ALLOWED_DECISIONS.get(state, ()):
        check(state, "decision", decision=decision)
    else:
        with pytest.raises(IllegalTransition):
            check(state, "decision", decision=decision)


def test_only_a_proposal_starts_a_call():
    check(None, "proposed")
    for kind in set(KINDS) - {"proposed"}:
        with pytest.raises(IllegalTransition):
            check(None, kind, decision="approve")


@pytest.mark.parametrize("reason", list(TABLE))
def test_the_state_after_an_event_follows_its_route(reason):
    verdict = Verdict(reason=reason, route=route_of(reason))
    after = next_state(State.ALLOWED, "attempt", verdict, executed=True)
    if reason == Reason.APPROVAL_GRANTED:
        assert after == State.ALLOWED
    elif reason in (Reason.DUPLICATE_SUPPRESSED, Reason.IDEMPOTENCY_MISMATCH):
        assert after == State.ALLOWED  # the stored call is untouched
    elif reason == Reason.APPROVAL_PENDING:
        assert after == State.PENDING_APPROVAL
    else:
        assert after == STATE_FOR_ROUTE[verdict.route]


def test_a_refusal_before_any_execution_is_rejected_at_the_gate_and_after_one_failed():
    reask = Verdict(reason=Reason.MISSING_REQUIRED, route=Route.REASK)
    assert next_state(None, "proposed", reask, executed=False) == State.REJECTED
    assert next_state(State.ALLOWED, "attempt", reask, executed=True) == State.FAILED


def test_an_allowed_proposal_and_an_approval_leave_the_call_allowed():
    assert next_state(None, "proposed", Verdict(None, Route.PROCEED), executed=False) == "allowed"
    granted = Verdict(Reason.APPROVAL_GRANTED, Route.PROCEED)
    assert next_state(State.PENDING_APPROVAL, "decision", granted, executed=False) == "allowed"


@pytest.mark.parametrize("reason", [Reason.OUTCOME_UNKNOWN, Reason.RECONCILE_MISMATCH])
def test_a_look_up_that_could_not_tell_sends_a_reconciling_call_to_review(reason):
    kept = Verdict(reason=reason, route=Route.REVIEW)
    check(State.RECONCILING, "reconcile_failed")
    assert next_state(State.RECONCILING, "reconcile_failed", kept, executed=True) == "in_review"
    for state in (State.SUCCEEDED, State.FAILED, State.RETRY_WAIT, State.PENDING_APPROVAL):
        with pytest.raises(IllegalTransition):
            check(state, "reconcile_failed")


def test_the_deadline_sweep_moves_only_a_call_waiting_to_retry():
    exhausted = Verdict(reason=Reason.RETRY_EXHAUSTED, route=route_of(Reason.RETRY_EXHAUSTED))
    check(State.RETRY_WAIT, "deadline_passed")
    assert next_state(State.RETRY_WAIT, "deadline_passed", exhausted, executed=True) == "in_review"
    for state in set(State.values) - {State.RETRY_WAIT}:
        with pytest.raises(IllegalTransition):
            check(state, "deadline_passed")
