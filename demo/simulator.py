"""A failure-injecting target system: a small support-ticket service.

It is the "target" that agents' tools write to in the tests and in the demo, with
switchable failure modes so every reason of the taxonomy can be produced end to end.
The core (``SimulatorService``) is framework-free: a WSGI application that tests call
in-process through ``simulator_transport(service)`` (an httpx transport), that
``manage.py simulator --port 8100`` serves with wsgiref, and that the callgate server
mounts under ``/simulator/`` when ``CALLGATE_DEMO`` is on (``demo.urls``).

Data
    Tenants (name + bearer token), tickets ``T-<n>`` (owned by one tenant; open, closed
    or deleted), follow-ups ``F-<n>`` (created by the one write operation), and the
    operation log keyed by (tenant, operation ID).

HTTP interface (all bodies JSON; errors are ``{"error": str, ...}``)
    ``POST /tenants/{tenant}/follow-ups``   header ``Idempotency-Key: <operation_id>``,
        body ``{"ticket_id": "T-1", "assignee_id": "u-7", "due_at": "2026-12-01T09:00:00Z"}``
        -> 201 ``{"operation_id", "receipt": {"id": "F-1", "ticket_id", "assignee_id",
        "due_at", "status": "open", "created_at"}}``. The same key with the same body
        -> 200 with the first answer and header ``Idempotent-Replayed: true`` (no write);
        the same key with a different body -> 422. Missing key -> 400; bad body -> 422;
        unknown or deleted ticket -> 404; another tenant's ticket -> 403 (the body names
        the owning tenant, on purpose: callgate must never pass it on); closed ticket -> 409.
    ``GET /tenants/{tenant}/operations/{operation_id}`` -> 200 ``{"operation_id",
        "request": {...the stored body}, "receipt": {...}}`` or 404 ``{"error"}``.
    ``GET /tickets`` (the token's tenant's tickets), ``GET /tickets/{ticket_id}``
        -> 200 ticket ``{"id", "tenant", "subject", "status"}``, 403 another tenant's
        (naming it), 404 unknown or deleted.
    Every route above needs ``Authorization: Bearer <tenant token>``; an unknown token
    -> 401, a token of another tenant on ``/tenants/{tenant}/...`` -> 401.
    Control (demo only, no auth; never served in production):
        ``POST /_control/fail`` ``{"mode", "count"?: 1, "on"?: "write", "options"?: {}}``,
        ``POST /_control/confirm`` (``confirm_pending``), ``POST /_control/reset``,
        ``GET /_control/writes`` -> ``{"writes": [...]}``,
        ``POST /_control/tickets`` ``{"tenant", "subject"?}`` -> 201 ticket,
        ``POST /_control/tickets/{id}/delete``, ``POST /_control/tickets/{id}/close``.

Failure modes (``service.fail_next(mode, count=1, on="write", **options)``; ``on`` is
``"write"`` (the follow-up POST), ``"lookup"`` (the operations GET), ``"read"`` (the
tickets GETs) or ``"any"``; each matching request consumes one):

=======================  ===========================================  ============================
mode                     in-process (``simulator_transport``)         over HTTP (WSGI server)
=======================  ===========================================  ============================
``unavailable``          503, nothing written                         same
``rate_limited``         429 + ``Retry-After: <options.retry_after    same
                         or 2>``, nothing written
``server_error``         500, nothing written                         same
``connect_error``        raises ``httpx.ConnectError`` (not sent)     503 (cannot refuse in WSGI)
``timeout_after_write``  write applied, raises ``httpx.ReadTimeout``  write applied, sleeps
                                                                      ``options.delay`` s, 504
``timeout_no_write``     raises ``httpx.ReadTimeout``, no write       sleeps, 504, no write
``late_confirmation``    write applied but the look-up answers 404    write applied, 504
                         until ``options.after_lookups`` (default 2)
                         look-ups or ``confirm_pending()``; raises
                         ``httpx.ReadTimeout``
``conflict``             409 state conflict, nothing written          same
``forbidden``            403 naming another tenant                    same
``not_found``            404, nothing written                         same
``unauthorized``         401 even with a good token                   same
``garbage``              200 with a body that is not JSON             same
=======================  ===========================================  ============================

``service.writes`` is the write log (one dict per applied write: ``seq``, ``tenant``,
``operation_id``, ``request``, ``receipt``, ``at``) so tests can assert that no second
write happened. All state is guarded by one lock.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote, unquote

import httpx

MODES = (
    "unavailable",
    "rate_limited",
    "server_error",
    "connect_error",
    "timeout_after_write",
    "timeout_no_write",
    "late_confirmation",
    "conflict",
    "forbidden",
    "not_found",
    "unauthorized",
    "garbage",
)
#: failure modes that the in-process transport turns into httpx exceptions
TRANSPORT_MODES = ("connect_error", "timeout_after_write", "timeout_no_write", "late_confirmation")
SCOPES = ("write", "lookup", "read", "any")

#: the demo's fixed data (``default_service``/``manage.py simulator``)
DEMO_TENANTS = {"acme": "sim-acme-token", "globex": "sim-globex-token"}

_STATUS_TEXT = {
    200: "OK",
    201: "Created",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Failure:
    mode: str
    on: str = "write"
    options: dict = field(default_factory=dict)


@dataclass
class SimResponse:
    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, status: int, data: Any, headers: Iterable[tuple[str, str]] = ()) -> SimResponse:
        return cls(
            status, json.dumps(data).encode(), [("Content-Type", "application/json"), *headers]
        )


class SimulatorService:
    """The support-ticket service. ``tenants`` maps tenant name -> bearer token.

    Python API: ``add_tenant``, ``add_ticket``, ``delete_ticket``, ``close_ticket``,
    ``fail_next``, ``clear_failures``, ``confirm_pending``, ``reset``, ``writes``,
    ``operation``; the instance itself is the WSGI application.
    """

    def __init__(self, tenants: dict[str, str] | None = None) -> None:
        self._lock = threading.RLock()
        self._initial_tenants = dict(tenants or {})
        self.reset()

    # --- set-up -----------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything but the tenants given to the constructor."""
        with self._lock:
            self.tenants: dict[str, str] = dict(self._initial_tenants)
            self.tickets: dict[str, dict] = {}
            self.writes: list[dict] = []
            self._operations: dict[tuple[str, str], dict] = {}
            self._failures: list[Failure] = []
            self._ticket_seq = 0
            self._follow_up_seq = 0

    def add_tenant(self, name: str, token: str) -> None:
        with self._lock:
            self.tenants[name] = token

    def add_ticket(
        self, tenant: str, subject: str = "Printer on fire", *, status: str = "open"
    ) -> str:
        """Create a ticket owned by ``tenant``; returns its id ``T-<n>``.
        Raises KeyError for an unknown tenant."""
        with self._lock:
            if tenant not in self.tenants:
                raise KeyError(f"unknown tenant {tenant!r}")
            self._ticket_seq += 1
            ticket_id = f"T-{self._ticket_seq}"
            self.tickets[ticket_id] = {
                "id": ticket_id,
                "tenant": tenant,
                "subject": subject,
                "status": status,
            }
            return ticket_id

    def delete_ticket(self, ticket_id: str) -> None:
        with self._lock:
            self.tickets[ticket_id]["status"] = "deleted"

    def close_ticket(self, ticket_id: str) -> None:
        with self._lock:
            self.tickets[ticket_id]["status"] = "closed"

    # --- failure injection ------------------------------------------------------
    def fail_next(self, mode: str, count: int = 1, *, on: str = "write", **options: Any) -> None:
        """Make the next ``count`` requests of scope ``on`` fail with ``mode`` (see the module
        docstring). Options: ``retry_after`` (rate_limited, seconds), ``delay`` (HTTP timeouts,
        seconds), ``after_lookups`` (late_confirmation). Raises ValueError on a bad mode/scope."""
        if mode not in MODES:
            raise ValueError(f"unknown failure mode {mode!r}; one of {', '.join(MODES)}")
        if on not in SCOPES:
            raise ValueError(f"unknown scope {on!r}; one of {', '.join(SCOPES)}")
        with self._lock:
            self._failures.extend(Failure(mode, on, dict(options)) for _ in range(count))

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()

    def take_failure(self, scope: str | None) -> Failure | None:
        """Pop the first queued failure that applies to a request of ``scope`` (None: no scope)."""
        if scope is None:
            return None
        with self._lock:
            for index, failure in enumerate(self._failures):
                if failure.on in (scope, "any"):
                    return self._failures.pop(index)
        return None

    def confirm_pending(self) -> int:
        """Make every late-confirmation receipt visible in the look-up; returns how many."""
        with self._lock:
            pending = [op for op in self._operations.values() if op["hidden_lookups"] is not None]
            for op in pending:
                op["hidden_lookups"] = None
            return len(pending)

    def operation(self, tenant: str, operation_id: str) -> dict | None:
        """The stored operation (``request``, ``receipt``) regardless of visibility, or None."""
        with self._lock:
            op = self._operations.get((tenant, operation_id))
            return (
                None
                if op is None
                else {
                    "operation_id": operation_id,
                    "request": op["request"],
                    "receipt": op["receipt"],
                }
            )

    # --- request handling -------------------------------------------------------
    @staticmethod
    def scope_of(method: str, path: str) -> str | None:
        """Which failure scope a request belongs to (None for control and unknown routes)."""
        if method == "POST" and re.fullmatch(r"/tenants/[^/]+/follow-ups", path):
            return "write"
        if method == "GET" and re.fullmatch(r"/tenants/[^/]+/operations/[^/]+", path):
            return "lookup"
        if method == "GET" and re.fullmatch(r"/tickets(/[^/]+)?", path):
            return "read"
        return None

    def dispatch(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        *,
        failure: Failure | None = None,
        query: dict[str, list[str]] | None = None,
        over_http: bool = True,
    ) -> SimResponse:
        """Handle one request. ``headers`` keys are lower-case; ``path`` is the percent-encoded
        path (segments are decoded here, so an operation ID may contain ``/`` as ``%2F``).
        ``failure`` is the failure already taken for this request (the caller takes it, so
        the in-process transport can act on the transport-level modes)."""
        if path.startswith("/_control/"):
            return self._control(method, path, body)
        if failure is not None:
            early = self._early_failure(failure, over_http=over_http)
            if early is not None:
                return early
        segments = [unquote(s) for s in path.strip("/").split("/")]
        if (
            method == "POST"
            and len(segments) == 3
            and segments[0] == "tenants"
            and segments[2] == "follow-ups"
        ):
            return self._create_follow_up(segments[1], headers, body, failure, over_http=over_http)
        if (
            method == "GET"
            and len(segments) == 4
            and segments[0] == "tenants"
            and segments[2] == "operations"
        ):
            return self._lookup(segments[1], segments[3], headers)
        if method == "GET" and segments[0] == "tickets" and len(segments) <= 2:
            return self._read_tickets(segments[1] if len(segments) == 2 else None, headers)
        return SimResponse.json(404, {"error": f"no route {method} {path}"})

    def _early_failure(self, failure: Failure, *, over_http: bool) -> SimResponse | None:
        """The answer of a failure that happens before any write
        (None for the write-then-fail modes)."""
        mode = failure.mode
        if mode in ("unavailable", "connect_error"):
            return SimResponse.json(503, {"error": "service unavailable"})
        if mode == "rate_limited":
            retry_after = str(failure.options.get("retry_after", 2))
            return SimResponse.json(
                429, {"error": "too many requests"}, [("Retry-After", retry_after)]
            )
        if mode == "server_error":
            return SimResponse.json(500, {"error": "internal server error"})
        if mode == "timeout_no_write":
            if over_http:
                time.sleep(float(failure.options.get("delay", 0)))
            return SimResponse.json(504, {"error": "gateway timeout"})
        if mode == "conflict":
            return SimResponse.json(
                409, {"error": "the ticket changed under the request (version conflict)"}
            )
        if mode == "forbidden":
            return SimResponse.json(
                403, {"error": "resource belongs to another tenant", "owner": "globex-private"}
            )
        if mode == "not_found":
            return SimResponse.json(404, {"error": "not found"})
        if mode == "unauthorized":
            return SimResponse.json(401, {"error": "credentials rejected"})
        if mode == "garbage":
            return SimResponse(
                200, b"<html>upstream proxy says hello", [("Content-Type", "text/html")]
            )
        return None

    def _tenant_of(self, headers: dict[str, str]) -> str | None:
        auth = headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return None
        token = auth[len("Bearer ") :].strip()
        for name, expected in self.tenants.items():
            if token and token == expected:
                return name
        return None

    def _create_follow_up(
        self,
        tenant: str,
        headers: dict[str, str],
        body: bytes,
        failure: Failure | None,
        *,
        over_http: bool,
    ) -> SimResponse:
        with self._lock:
            if tenant not in self.tenants or self._tenant_of(headers) != tenant:
                return SimResponse.json(401, {"error": "credentials rejected"})
            key = headers.get("idempotency-key", "").strip()
            if not key:
                return SimResponse.json(400, {"error": "the Idempotency-Key header is required"})
            try:
                request = json.loads(body or b"null")
            except ValueError:
                return SimResponse.json(422, {"error": "body is not JSON"})
            problems = self._validate(request)
            if problems:
                return SimResponse.json(422, {"error": "invalid follow-up", "problems": problems})
            existing = self._operations.get((tenant, key))
            if existing is not None:
                if _canonical(existing["request"]) != _canonical(request):
                    return SimResponse.json(
                        422, {"error": "Idempotency-Key reused with a different request body"}
                    )
                return SimResponse.json(
                    200,
                    {"operation_id": key, "receipt": existing["receipt"]},
                    [("Idempotent-Replayed", "true")],
                )
            ticket, refused = self._ticket_for(tenant, request["ticket_id"])
            if refused is not None:
                return refused
            assert ticket is not None  # _ticket_for answers one or the other
            if ticket["status"] == "closed":
                return SimResponse.json(409, {"error": f"ticket {ticket['id']} is closed"})
            self._follow_up_seq += 1
            receipt = {
                "id": f"F-{self._follow_up_seq}",
                "ticket_id": request["ticket_id"],
                "assignee_id": request["assignee_id"],
                "due_at": request["due_at"],
                "status": "open",
                "created_at": _now_iso(),
            }
            hidden = None
            if failure is not None and failure.mode == "late_confirmation":
                hidden = int(failure.options.get("after_lookups", 2))
            self._operations[(tenant, key)] = {
                "request": request,
                "receipt": receipt,
                "hidden_lookups": hidden,
            }
            self.writes.append(
                {
                    "seq": len(self.writes) + 1,
                    "tenant": tenant,
                    "operation_id": key,
                    "request": request,
                    "receipt": receipt,
                    "at": _now_iso(),
                }
            )
        if failure is not None and failure.mode in ("timeout_after_write", "late_confirmation"):
            if over_http:
                time.sleep(float(failure.options.get("delay", 0)))
            return SimResponse.json(504, {"error": "gateway timeout"})
        return SimResponse.json(201, {"operation_id": key, "receipt": receipt})

    def _ticket_for(self, tenant: str, ticket_id: str) -> tuple[dict | None, SimResponse | None]:
        """``(ticket, None)`` when ``tenant`` may use it, else ``(None, 404 or 403 answer)``; the 403
        names the owning tenant on purpose (callgate must never pass that on)."""
        ticket = self.tickets.get(ticket_id)
        if ticket is None or ticket["status"] == "deleted":
            return None, SimResponse.json(404, {"error": f"ticket {ticket_id} not found"})
        if ticket["tenant"] != tenant:
            return None, SimResponse.json(
                403,
                {
                    "error": f"ticket {ticket_id} belongs to tenant {ticket['tenant']}",
                    "owner": ticket["tenant"],
                },
            )
        return ticket, None

    @staticmethod
    def _validate(request: Any) -> list[str]:
        if not isinstance(request, dict):
            return ["body must be a JSON object"]
        problems = [
            f"{name} is required (string)"
            for name in ("ticket_id", "assignee_id", "due_at")
            if not isinstance(request.get(name), str) or not request.get(name)
        ]
        extra = sorted(set(request) - {"ticket_id", "assignee_id", "due_at", "note"})
        problems += [f"unknown field {name}" for name in extra]
        return problems

    def _lookup(self, tenant: str, operation_id: str, headers: dict[str, str]) -> SimResponse:
        with self._lock:
            if tenant not in self.tenants or self._tenant_of(headers) != tenant:
                return SimResponse.json(401, {"error": "credentials rejected"})
            op = self._operations.get((tenant, operation_id))
            if op is not None and op["hidden_lookups"] is not None:
                if op["hidden_lookups"] > 0:
                    op["hidden_lookups"] -= 1
                    return SimResponse.json(404, {"error": f"no operation {operation_id}"})
                op["hidden_lookups"] = None
            if op is None:
                return SimResponse.json(404, {"error": f"no operation {operation_id}"})
            return SimResponse.json(
                200,
                {"operation_id": operation_id, "request": op["request"], "receipt": op["receipt"]},
            )

    def _read_tickets(self, ticket_id: str | None, headers: dict[str, str]) -> SimResponse:
        with self._lock:
            tenant = self._tenant_of(headers)
            if tenant is None:
                return SimResponse.json(401, {"error": "credentials rejected"})
            if ticket_id is None:
                mine = [
                    t
                    for t in self.tickets.values()
                    if t["tenant"] == tenant and t["status"] != "deleted"
                ]
                return SimResponse.json(200, {"tickets": [dict(t) for t in mine]})
            ticket, refused = self._ticket_for(tenant, ticket_id)
            if refused is not None:
                return refused
            assert ticket is not None  # _ticket_for answers one or the other
            return SimResponse.json(200, dict(ticket))

    def _control(self, method: str, path: str, body: bytes) -> SimResponse:
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            return SimResponse.json(400, {"error": "body is not JSON"})
        if not isinstance(data, dict):
            return SimResponse.json(400, {"error": "body must be a JSON object"})
        try:
            if method == "POST" and path == "/_control/fail":
                self.fail_next(
                    str(data.get("mode")),
                    int(data.get("count", 1)),
                    on=str(data.get("on", "write")),
                    **dict(data.get("options") or {}),
                )
                return SimResponse.json(200, {"queued": int(data.get("count", 1))})
            if method == "POST" and path == "/_control/confirm":
                return SimResponse.json(200, {"confirmed": self.confirm_pending()})
            if method == "POST" and path == "/_control/reset":
                self.reset()
                return SimResponse.json(200, {"reset": True})
            if method == "GET" and path == "/_control/writes":
                with self._lock:
                    return SimResponse.json(200, {"writes": list(self.writes)})
            if method == "POST" and path == "/_control/tickets":
                ticket_id = self.add_ticket(
                    str(data.get("tenant")), str(data.get("subject") or "Printer on fire")
                )
                return SimResponse.json(201, dict(self.tickets[ticket_id]))
            match = re.fullmatch(r"/_control/tickets/([^/]+)/(delete|close)", path)
            if method == "POST" and match:
                (self.delete_ticket if match.group(2) == "delete" else self.close_ticket)(
                    match.group(1)
                )
                return SimResponse.json(200, dict(self.tickets[match.group(1)]))
        except (KeyError, ValueError, TypeError) as exc:
            return SimResponse.json(400, {"error": str(exc)})
        return SimResponse.json(404, {"error": f"no route {method} {path}"})

    # --- WSGI -------------------------------------------------------------------
    def __call__(self, environ: dict, start_response: Callable) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        # PATH_INFO is already decoded; re-encode it (an encoded "/" inside a segment is lost
        # over a real WSGI server, but not in-process, where the transport passes the raw path)
        path = environ.get("simulator.raw_path") or quote(
            environ.get("PATH_INFO", "") or "/", safe="/"
        )
        headers = {
            key[5:].replace("_", "-").lower(): value
            for key, value in environ.items()
            if key.startswith("HTTP_")
        }
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        failure = self.take_failure(self.scope_of(method, path))
        response = self.dispatch(
            method,
            path,
            headers,
            body,
            failure=failure,
            query=parse_qs(environ.get("QUERY_STRING", "")),
            over_http=True,
        )
        reason = _STATUS_TEXT.get(response.status, "Unknown")
        start_response(
            f"{response.status} {reason}",
            [*response.headers, ("Content-Length", str(len(response.body)))],
        )
        return [response.body]


class SimulatorTransport(httpx.BaseTransport):
    """An httpx transport onto a ``SimulatorService`` in the same process. It takes the
    request's queued failure itself: transport-level modes raise httpx exceptions (after
    applying the write where the mode says so); everything else goes through
    ``httpx.WSGITransport``."""

    def __init__(self, service: SimulatorService) -> None:
        self.service = service
        self._wsgi = httpx.WSGITransport(app=self._app)
        self._local = threading.local()

    def _app(self, environ: dict, start_response: Callable) -> list[bytes]:
        # the WSGI app, but with the failure this transport already took for the request
        failure = getattr(self._local, "failure", None)
        self._local.failure = None
        method = environ["REQUEST_METHOD"].upper()
        headers = {
            key[5:].replace("_", "-").lower(): value
            for key, value in environ.items()
            if key.startswith("HTTP_")
        }
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        raw_path = getattr(self._local, "raw_path", None) or quote(
            environ.get("PATH_INFO") or "/", safe="/"
        )
        response = self.service.dispatch(
            method, raw_path, headers, body, failure=failure, over_http=False
        )
        reason = _STATUS_TEXT.get(response.status, "Unknown")
        start_response(
            f"{response.status} {reason}",
            [*response.headers, ("Content-Length", str(len(response.body)))],
        )
        return [response.body]

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raw_path = request.url.raw_path.split(b"?", 1)[0].decode("ascii")
        failure = self.service.take_failure(self.service.scope_of(request.method, raw_path))
        if failure is not None and failure.mode == "connect_error":
            raise httpx.ConnectError("[Errno 111] Connection refused (simulated)", request=request)
        if failure is not None and failure.mode == "timeout_no_write":
            raise httpx.ReadTimeout("timed out (simulated, nothing written)", request=request)
        self._local.failure = failure
        self._local.raw_path = raw_path
        try:
            response = self._wsgi.handle_request(request)
        finally:
            self._local.failure = self._local.raw_path = None
        if failure is not None and failure.mode in ("timeout_after_write", "late_confirmation"):
            response.close()
            raise httpx.ReadTimeout("timed out (simulated, the write was applied)", request=request)
        return response


def simulator_transport(service: SimulatorService) -> SimulatorTransport:
    """An httpx transport for ``httpx.Client(transport=..., base_url="http://sim")``."""
    return SimulatorTransport(service)


#: Where callgate's server mounts the simulator (``demo.urls``).
SIMULATOR_PATH = "/simulator"


class MountedTransport(httpx.BaseTransport):
    """callgate's reconcile look-ups as the demo answers them, in-process: a request to
    ``…/simulator/…`` goes to ``service`` without the mount prefix, carrying the demo
    tenant's bearer token when it has no credential of its own (the configured
    ``CALLGATE_RECONCILE_AUTH_HEADER`` when the origin is allowed); any other URL goes to
    the network through ``fallback`` (callgate's guarded transport by default)."""

    def __init__(
        self,
        service: SimulatorService,
        *,
        token: str = "",
        fallback: httpx.BaseTransport | None = None,
    ):
        self.inner = simulator_transport(service)
        self.token = token or DEMO_TENANTS["acme"]
        self.fallback = fallback

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raw = request.url.raw_path
        prefix = SIMULATOR_PATH.encode() + b"/"
        if not raw.startswith(prefix):
            if self.fallback is None:
                from callgate.outbound import GuardedTransport
                from callgate.reconcile import listed_origins

                self.fallback = GuardedTransport(admit_origins=listed_origins())
            return self.fallback.handle_request(request)
        request.url = request.url.copy_with(raw_path=raw[len(SIMULATOR_PATH) :])
        request.headers.setdefault("Authorization", f"Bearer {self.token}")
        return self.inner.handle_request(request)


def lookup_transport() -> MountedTransport:
    """``CALLGATE_RECONCILE_TRANSPORT`` of the demo: look-ups reach ``default_service()``."""
    return MountedTransport(default_service())


def demo_service() -> SimulatorService:
    """A service with the demo's data: tenants acme and globex (tokens in ``DEMO_TENANTS``),
    tickets T-1, T-2 (acme, open), T-3 (globex), T-4 (acme, deleted), T-5 (acme, closed)."""
    service = SimulatorService(DEMO_TENANTS)
    service.add_ticket("acme", "Printer on fire")
    service.add_ticket("acme", "VPN drops every hour")
    service.add_ticket("globex", "Globex payroll export")
    service.delete_ticket(service.add_ticket("acme", "Duplicate of T-1"))
    service.close_ticket(service.add_ticket("acme", "Password reset"))
    return service


_default_service: SimulatorService | None = None
_default_lock = threading.Lock()


def default_service() -> SimulatorService:
    """The process-wide demo service (what ``/simulator/`` in the callgate server serves)."""
    global _default_service
    with _default_lock:
        if _default_service is None:
            _default_service = demo_service()
        return _default_service


# --- Django mount (imports Django lazily so the core above stays framework-free) ---------------
def django_view(request, path: str = ""):
    """Serve ``default_service()`` under ``/simulator/``. 404 unless ``settings.CALLGATE_DEMO``
    (default: ``DEBUG``) is on: the simulator has unauthenticated control endpoints."""
    from django.conf import settings
    from django.http import Http404, HttpResponse

    if not settings.CALLGATE_DEMO:
        raise Http404("the simulator is off")
    environ = dict(request.META)
    body = request.body
    environ.update(
        {"PATH_INFO": "/" + path, "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body))}
    )
    raw_uri = environ.get("RAW_URI") or environ.get("REQUEST_URI") or ""  # gunicorn / uWSGI
    _prefix, sep, rest = raw_uri.split("?", 1)[0].partition("/simulator/")
    if sep:  # keeps an encoded "/" inside an operation ID in one segment
        environ["simulator.raw_path"] = "/" + rest
    captured: dict = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info=None):
        captured["status"], captured["headers"] = int(status.split(" ", 1)[0]), headers

    content = b"".join(default_service()(environ, start_response))
    response = HttpResponse(content, status=captured["status"])
    for name, value in captured["headers"]:
        if name.lower() != "content-length":
            response[name] = value
    return response
