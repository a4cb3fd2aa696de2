"""The shapes callgate's REST API v1 answers with, and what a client's ``run`` ends with.

Units: every duration is in seconds (floats allowed). Times on the wire are RFC 3339 UTC.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Format = Literal["openai", "openai_responses", "anthropic", "gemini", "mcp", "plain"]
Verdict = Literal[
    "allow",
    "reask",
    "deny",
    "retry",
    "reconcile",
    "return_receipt",
    "pending_approval",
    "review",
    "stop",
]
Outcome = Literal["success", "error", "timeout", "connection_reset", "circuit_open"]
Effect = Literal["read", "write"]

#: verdicts after which the agent waits for callgate (a reconciliation or a human).
WAITING_VERDICTS = frozenset({"reconcile", "review", "pending_approval"})


class RetryPolicy(BaseModel):
    """A contract's retry policy. ``backoff_delay`` turns it into sleeps.

    ``initial_interval`` and ``maximum_interval`` are seconds; ``deadline_seconds`` bounds
    the whole call (first attempt to last), ``None`` for no deadline.
    """

    initial_interval: float = Field(1.0, ge=0)
    backoff_coefficient: float = Field(2.0, ge=1)
    maximum_interval: float = Field(60.0, ge=0)
    deadline_seconds: int | None = Field(None, ge=1)


class Decision(BaseModel):
    model_config = ConfigDict(extra="allow")

    decision: str
    reason: str | None = None
    decided_at: str | None = None
    #: the arguments an operator approved with edits ("•••": keep the proposed value), or None
    arguments: dict[str, Any] | None = None
    #: the operation ID proposed, when the edit gave the call a new one (``operation_id``)
    proposed_operation_id: str | None = None


class CallAnswer(BaseModel):
    """callgate's answer about one operation (the gate, an event, or ``GET /calls/{op}``)."""

    model_config = ConfigDict(extra="allow")

    operation_id: str
    verdict: Verdict
    state: str
    reason: str | None = None
    category: str | None = None
    route: str | None = None
    observation: str = ""
    receipt: Any = None
    attempts: int = 0
    max_attempts: int | None = None
    retry_after: float | None = None
    decision: Decision | None = None
    # only on GET /api/v1/calls/{operation_id}
    tool: str | None = None
    contract_version: int | None = None
    created_at: str | None = None
    updated_at: str | None = None


class Finding(BaseModel):
    path: str = ""
    message: str = ""


class ToolRegistration(BaseModel):
    """The answer to ``PUT /api/v1/tools/{name}``: the contract's version and its lint."""

    model_config = ConfigDict(extra="allow")

    name: str
    version: int
    created: bool
    lint: dict[str, Any] = Field(default_factory=dict)

    @property
    def lint_score(self) -> int | None:
        return self.lint.get("score")

    @property
    def findings(self) -> list[Finding]:
        return [Finding(**f) for f in self.lint.get("findings", [])]


RunStatus = Literal[
    "succeeded",  # executed; callgate (or, when it was down, the attempt itself) says it worked
    "receipt",  # not executed (again): the stored receipt is the result
    "reask",  # the model must propose again; hand it ``observation``
    "denied",  # do not execute, do not retry
    "stopped",  # give up and tell the user (budget exhausted, rejected, expired)
    "waiting",  # still waiting for a reconciliation or a human after the wait limit
    "outcome_unknown",  # callgate unreachable and the write's outcome is unknown: never retried
    "failed",  # callgate unreachable and the attempt failed permanently, or the retries ran out
]


class RunResult(BaseModel):
    """What a client's ``run`` ended with.

    ``result`` is the tool's result (or the stored receipt); ``observation`` is the text to hand
    back to the model when the call did not succeed; ``executions`` counts how many times the
    execute callable ran during this ``run``; ``answer`` is callgate's last answer (``None``
    when callgate could not be reached).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    status: RunStatus
    operation_id: str | None = None
    result: Any = None
    observation: str = ""
    reason: str | None = None
    route: str | None = None
    executions: int = 0
    answer: CallAnswer | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("succeeded", "receipt")
