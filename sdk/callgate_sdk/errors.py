"""What the clients raise, and how an exception raised by a tool becomes an attempt's cause."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import httpx

from callgate_sdk.models import Outcome, RunResult


class CallgateError(Exception):
    """callgate answered with a 4xx: the request itself is wrong. ``errors`` are ``{"loc","msg"}``."""

    def __init__(self, status_code: int, message: str, errors: list[dict] | None = None):
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.errors = errors or []


class CallgateUnavailable(Exception):
    """callgate could not be reached, or answered 5xx/429. ``retry_after``: the seconds its
    ``Retry-After`` header asked to wait (backpressure: the project's inbox is full), when
    it sent one."""

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ToolFailure(Exception):
    """Raised by a tool when it did not succeed, to state the cause exactly.

    ``sent``: did the request reach the target (``True``), certainly not (``False``), or
    cannot tell (``None``). ``outcome``: ``error``, ``timeout`` or ``connection_reset``.
    ``http_status``: the target's status code, if any. ``error``: a short message.
    """

    def __init__(
        self,
        error: str = "",
        *,
        sent: bool | None = True,
        outcome: Outcome = "error",
        http_status: int | None = None,
        result: Any = None,
    ):
        super().__init__(error or outcome)
        self.sent = sent
        self.outcome = outcome
        self.http_status = http_status
        self.error = error or outcome
        self.result = result


class CallNotAllowed(Exception):
    """A gated tool (``client.tool``) did not produce a result: callgate's verdict was not
    ``allow`` (re-ask, deny, stop, still waiting) or the attempts failed. ``observation`` is
    the text to hand back to the model; ``result`` the whole ``RunResult``."""

    def __init__(self, result: RunResult):
        super().__init__(result.observation or result.status)
        self.result = result
        self.status = result.status
        self.observation = result.observation
        self.reason = result.reason
        self.operation_id = result.operation_id


def failure_cause(exc: BaseException) -> tuple[Outcome, bool | None, int | None, str]:
    """``(outcome, sent, http_status, error)`` of an attempt that raised ``exc``.

    ``ToolFailure`` says it exactly. Otherwise the cause is read from the exception's type:
    a refused or failed connection never reached the target (``sent: false``); a timeout or a
    reset connection may have (``sent: null``, the outcome is unknown); an HTTP status error
    (httpx's ``raise_for_status``) reached it; anything else is the tool's own error
    (``sent: true``), which the model may fix.
    """
    message = f"{exc.__class__.__name__}: {exc}"[:2000]
    if isinstance(exc, ToolFailure):
        return exc.outcome, exc.sent, exc.http_status, exc.error
    if isinstance(exc, httpx.HTTPStatusError):
        return "error", True, exc.response.status_code, message
    if isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ConnectError)):
        return "error", False, None, message
    if isinstance(exc, (httpx.TimeoutException, TimeoutError, concurrent.futures.TimeoutError)):
        return "timeout", None, None, message
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, ConnectionResetError)):
        return "connection_reset", None, None, message
    if isinstance(exc, (ConnectionRefusedError, ConnectionAbortedError)):
        return "error", False, None, message
    return "error", True, None, message
