"""Reconciliation: look an operation up in the target system by its operation ID.

When a write's outcome is unknown (route ``reconcile``), callgate asks the target whether
the operation happened, instead of retrying blindly. ``reconcile_lookup`` does one HTTP
look-up and answers one of four outcomes; the Celery task ``callgate.tasks.reconcile_call``
retries transient look-up failures and records the outcome through ``callgate.services``.

The target's look-up endpoint (a contract with ``reconcile_method == "http"``)
    ``GET <contract.reconcile_url with {operation_id} replaced by the URL-quoted ID>``
    with ``settings.CALLGATE_RECONCILE_AUTH_HEADER`` (``"Name: value"``, e.g.
    ``"Authorization: Bearer xyz"``) when set -- never a credential from the contract --
    and a timeout of ``settings.CALLGATE_RECONCILE_TIMEOUT`` seconds, only to an origin
    callgate may reach: one listed in ``CALLGATE_RECONCILE_ORIGINS`` when that is set
    (``origin_refusal``), and through ``callgate.outbound``'s guard (contracts are written
    by agents, so a look-up URL must not make callgate probe its own network).
    It must answer
    - 200 ``{"operation_id": str, "request": {...the arguments the target received},
      "receipt": any}`` when the operation is known (``demo.simulator``'s look-up);
    - 404 when it is not (``absent``).
    Anything else (timeout, connection error, 5xx, 429, 401/403, other 4xx, a body that
    is not that JSON object) is ``unknown`` (could not tell) with a short ``detail``;
    timeouts, connection errors, 429 and 5xx are ``transient`` (worth another look-up).

Matching compares the record's ``request`` with the call's stored arguments. Stored
arguments are redacted (sensitive values replaced by ``"•••"``): a redacted value matches
anything, every other value must be equal as canonical JSON (``1`` differs from ``1.0``
and from ``true``), and both sides must have the same keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from django.conf import settings
from django.db.models import Q
from django.utils import timezone
from django.utils.module_loading import import_string

from callgate import outbound
from callgate.models import ToolCall

#: the marker that replaces sensitive argument values before storage
REDACTED = "•••"

APPLIED = "applied"  # found, and the stored request matches the call's arguments
MISMATCH = "mismatch"  # found, with different content
ABSENT = "absent"  # the target has no record of the operation ID
UNKNOWN = "unknown"  # could not tell


@dataclass(frozen=True)
class LookupResult:
    """What one look-up found. ``receipt`` is the target's receipt (``applied``/``mismatch``),
    ``record`` the target's stored request; ``transient`` marks an ``unknown`` that another
    look-up may resolve; ``detail`` is a short, credential-free explanation."""

    outcome: str
    receipt: Any = None
    record: dict | None = None
    detail: str = ""
    http_status: int | None = None
    transient: bool = False
    differences: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return self.outcome in (APPLIED, MISMATCH)

    @property
    def matches(self) -> bool:
        return self.outcome == APPLIED

    def as_detail(self) -> dict:
        """The JSON-able summary recorded on the ``reconciled`` event (no credentials)."""
        detail: dict[str, Any] = {"outcome": self.outcome, "detail": self.detail}
        if self.http_status is not None:
            detail["http_status"] = self.http_status
        if self.found:
            detail["receipt"] = self.receipt
        if self.differences:
            detail["differences"] = self.differences
        return detail


def listed_origins() -> set[str]:
    """The origins ``CALLGATE_RECONCILE_ORIGINS`` and ``CALLGATE_RECONCILE_AUTH_ORIGINS``
    name (lower-case, no trailing slash): the guard admits them whatever their addresses."""
    return {
        o.rstrip("/").lower()
        for o in [
            *getattr(settings, "CALLGATE_RECONCILE_ORIGINS", []),
            *getattr(settings, "CALLGATE_RECONCILE_AUTH_ORIGINS", []),
        ]
    }


def origin_refusal(url: str) -> str | None:
    """Why callgate will not look ``url`` up by its origin, or None. When
    ``CALLGATE_RECONCILE_ORIGINS`` is set, look-ups go only to the listed origins (and the
    auth origins); otherwise to any origin the outbound guard admits (public addresses and
    ``CALLGATE_OUTBOUND_ALLOW``), which ``make_client``'s transport checks per request."""
    here = origin(url)
    if getattr(settings, "CALLGATE_RECONCILE_ORIGINS", []) and here not in listed_origins():
        return (
            f"{here} is not in CALLGATE_RECONCILE_ORIGINS; callgate looks operations up only there"
        )
    return None


def make_client() -> httpx.Client:
    """The HTTP client of a look-up made without one (the task's): ``outbound.client``
    (guarded, no redirects: a look-up that redirects is answered as could-not-tell, and
    credentials never follow a redirect), admitting the listed origins.

    Its transport is the one ``settings.CALLGATE_RECONCILE_TRANSPORT`` makes when that is set
    (a factory returning an ``httpx.BaseTransport``, or its dotted path: the demo's
    in-process simulator, ``demo.simulator.lookup_transport``); otherwise httpx's own."""
    factory = settings.CALLGATE_RECONCILE_TRANSPORT
    timeout = float(settings.CALLGATE_RECONCILE_TIMEOUT)
    if not factory:
        return outbound.client(timeout=timeout, admit_origins=listed_origins())
    if isinstance(factory, str):
        factory = import_string(factory)
    return httpx.Client(follow_redirects=False, transport=factory(), timeout=timeout)


def reconcile_url(*, contract, operation_id: str) -> str:
    """The contract's look-up URL for ``operation_id`` (quoted, so ``/`` or ``?`` stay
    inside its path segment)."""
    return contract.reconcile_url.replace("{operation_id}", quote(operation_id, safe=""))


def origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, lower-case."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def _auth_headers(url: str) -> dict[str, str]:
    """The configured credential, only for an origin in ``CALLGATE_RECONCILE_AUTH_ORIGINS``:
    look-up URLs come from contracts that agents write, so a credential sent to any URL
    would be handed to whoever controls the contract."""
    raw = (getattr(settings, "CALLGATE_RECONCILE_AUTH_HEADER", "") or "").strip()
    allowed = {
        o.rstrip("/").lower() for o in getattr(settings, "CALLGATE_RECONCILE_AUTH_ORIGINS", [])
    }
    if not raw or origin(url) not in allowed:
        return {}
    name, sep, value = raw.partition(":")
    if not sep or not name.strip():
        raise ValueError("CALLGATE_RECONCILE_AUTH_HEADER must look like 'Name: value'")
    return {name.strip(): value.strip()}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def argument_differences(expected: Any, actual: Any, path: str = "$") -> list[str]:
    """JSON paths where ``actual`` (the target's record) differs from ``expected`` (the call's
    redacted arguments). A redacted expected value matches anything."""
    if expected == REDACTED:
        return []
    if isinstance(expected, dict) and isinstance(actual, dict):
        found: list[str] = []
        for key in sorted(set(expected) | set(actual)):
            if key not in expected or key not in actual:
                found.append(f"{path}.{key}")
            else:
                found += argument_differences(expected[key], actual[key], f"{path}.{key}")
        return found
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        found = []
        for index, (left, right) in enumerate(zip(expected, actual, strict=True)):
            found += argument_differences(left, right, f"{path}[{index}]")
        return found
    return [] if _canonical(expected) == _canonical(actual) else [path]


def reconcile_lookup(
    *, contract, operation_id: str, arguments: Any, client: httpx.Client | None = None
) -> LookupResult:
    """Look ``operation_id`` up in the target of ``contract`` and compare with ``arguments``
    (the call's stored, redacted arguments). Never raises for what the target does;
    raises ValueError when the contract has no HTTP look-up or the auth setting is malformed.
    ``client`` lets tests pass an ``httpx.Client`` with the simulator's transport."""
    if contract is None or contract.reconcile_method != "http" or not contract.reconcile_url:
        raise ValueError(
            "the contract has no HTTP look-up (reconcile_method 'http' with a reconcile_url)"
        )
    url = reconcile_url(contract=contract, operation_id=operation_id)
    timeout = float(settings.CALLGATE_RECONCILE_TIMEOUT)
    headers = {"Accept": "application/json", **_auth_headers(url)}
    if refusal := origin_refusal(url):
        return LookupResult(UNKNOWN, detail=refusal)
    owns_client = client is None
    if client is None:
        client = make_client()
    try:
        response = client.get(url, headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return LookupResult(
            UNKNOWN, detail=f"look-up timed out after {timeout:g} s", transient=True
        )
    except outbound.OutboundRefused as exc:
        return LookupResult(UNKNOWN, detail=str(exc))
    except httpx.TransportError as exc:
        return LookupResult(UNKNOWN, detail=f"look-up failed: {type(exc).__name__}", transient=True)
    except httpx.InvalidURL:
        return LookupResult(UNKNOWN, detail="the contract's reconcile_url is not a valid URL")
    finally:
        if owns_client:
            client.close()
    return _interpret(response, operation_id=operation_id, arguments=arguments)


def _interpret(response: httpx.Response, *, operation_id: str, arguments: Any) -> LookupResult:
    status = response.status_code
    if status == 404:
        return LookupResult(
            ABSENT, detail="the target has no record of the operation", http_status=status
        )
    if status in (401, 403):
        return LookupResult(
            UNKNOWN,
            detail=f"the target refused the look-up's credentials ({status})",
            http_status=status,
        )
    if status == 429 or status >= 500:
        return LookupResult(
            UNKNOWN, detail=f"the target answered {status}", http_status=status, transient=True
        )
    if status != 200:
        return LookupResult(UNKNOWN, detail=f"unexpected answer {status}", http_status=status)
    try:
        body = response.json()
    except ValueError:
        return LookupResult(UNKNOWN, detail="the look-up's body is not JSON", http_status=status)
    if not isinstance(body, dict) or not isinstance(body.get("request"), dict):
        return LookupResult(
            UNKNOWN, detail="the look-up's body has no 'request' object", http_status=status
        )
    if body.get("operation_id") not in (None, operation_id):
        return LookupResult(
            UNKNOWN, detail="the look-up answered for another operation ID", http_status=status
        )
    record, receipt = body["request"], body.get("receipt")
    differences = argument_differences(arguments if arguments is not None else {}, record)
    if differences:
        return LookupResult(
            MISMATCH,
            receipt=receipt,
            record=record,
            http_status=status,
            differences=differences,
            detail="the target's record differs at " + ", ".join(differences[:10]),
        )
    return LookupResult(
        APPLIED,
        receipt=receipt,
        record=record,
        http_status=status,
        detail="the target has the operation with the requested arguments",
    )


def reconcile_calls_claim_stale(*, older_than, limit: int = 500) -> list[int]:
    """Claim calls left ``reconciling`` (HTTP look-up contracts) whose
    ``reconcile_requested_at`` (or, when unset, ``updated_at``) is older than ``older_than``
    (a timedelta): each is claimed by a compare-and-swap UPDATE that sets
    ``reconcile_requested_at`` to now, so concurrent sweepers never enqueue one call twice
    and a claimed call is not re-enqueued again before another ``older_than`` has passed.
    Returns the claimed call ids (the caller enqueues them)."""

    now = timezone.now()
    cutoff = now - older_than
    stale = (
        ToolCall.objects.filter(state=ToolCall.State.RECONCILING, contract__reconcile_method="http")
        .filter(
            Q(reconcile_requested_at__lt=cutoff)
            | Q(reconcile_requested_at__isnull=True, updated_at__lt=cutoff)
        )
        .order_by("reconcile_requested_at")
        .values_list("pk", "reconcile_requested_at")[:limit]
    )
    claimed = []
    for pk, requested_at in stale:
        updated = ToolCall.objects.filter(
            pk=pk, state=ToolCall.State.RECONCILING, reconcile_requested_at=requested_at
        ).update(reconcile_requested_at=now)
        if updated:
            claimed.append(pk)
    return claimed
