"""The demo fleet: simulated agents whose scripted "models" make realistic mistakes.

``manage.py demo`` (``callgate.management.commands.demo``) calls ``demo_run``: it creates
the ``demo`` project with an operator and a manager, registers tool contracts (good and
badly described ones), and runs agents through the SDK (``callgate_sdk``) against callgate
and the target-system simulator (``demo.simulator``), both in-process, so that every
reason of the taxonomy occurs at least once, review items wait in the queue, and the reports
have data. Randomness comes from one ``random.Random(seed)``: the same seed gives the same
calls, arguments and failures.

The tool adapters below (``follow_up_tool``, ``ticket_tool``) are also what the end-to-end
tests execute: they turn the simulator's HTTP answers into results or ``ToolFailure``.
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from callgate_sdk import CallgateClient, RetryPolicy, RunResult, SelfCorrector, ToolFailure
from callgate_sdk.models import Format
from demo.simulator import (
    DEMO_TENANTS,
    SIMULATOR_PATH,
    SimulatorService,
    default_service,
    simulator_transport,
)

TENANT = "acme"
TOKEN = DEMO_TENANTS[TENANT]
PROJECT_SLUG = "demo"


# --------------------------------------------------------------------------- in-process wiring


def callgate_transport() -> httpx.WSGITransport:
    """callgate itself, in this process: Django's WSGI application behind an httpx transport
    (use base URL ``http://localhost``)."""
    from django.core.wsgi import get_wsgi_application

    return httpx.WSGITransport(app=get_wsgi_application())


def simulator_client(service: SimulatorService) -> httpx.Client:
    """An httpx client onto ``service`` in this process (base URL ``http://sim``)."""
    return httpx.Client(transport=simulator_transport(service), base_url="http://sim")


def lookup_url(base_url: str, tenant: str = TENANT) -> str:
    """The simulator's operation look-up URL template for a contract's ``reconcile_url``."""
    return f"{base_url.rstrip('/')}/tenants/{tenant}/operations/{{operation_id}}"


# --------------------------------------------------------------------------- tool adapters


def _simulator_failure(exc: httpx.HTTPError) -> ToolFailure:
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return ToolFailure(f"{exc.__class__.__name__}: {exc}", sent=False, outcome="error")
    if isinstance(exc, httpx.TimeoutException):
        return ToolFailure(f"{exc.__class__.__name__}: {exc}", sent=True, outcome="timeout")
    if isinstance(exc, httpx.RemoteProtocolError):
        return ToolFailure(
            f"{exc.__class__.__name__}: {exc}", sent=True, outcome="connection_reset"
        )
    return ToolFailure(f"{exc.__class__.__name__}: {exc}", sent=None, outcome="error")


def _answer(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            message = response.json().get("error") or response.reason_phrase
        except ValueError:
            message = response.reason_phrase
        raise ToolFailure(
            str(message), sent=True, outcome="error", http_status=response.status_code
        )
    try:
        return response.json()
    except ValueError:
        raise ToolFailure(
            "the target answered with a body that is not JSON",
            sent=True,
            http_status=response.status_code,
        ) from None


def follow_up_tool(
    http: httpx.Client,
    *,
    tenant: str = TENANT,
    token: str = TOKEN,
    mangle: Callable[[dict], dict] | None = None,
) -> Callable[[dict, str], Any]:
    """The ``create_follow_up`` tool: POST the arguments to the simulator with
    ``Idempotency-Key: <operation_id>``; returns the receipt. ``mangle`` simulates a buggy
    adapter that sends something other than the validated arguments."""

    def execute(arguments: dict, operation_id: str) -> Any:
        body = mangle(dict(arguments)) if mangle else arguments
        try:
            response = http.post(
                f"/tenants/{tenant}/follow-ups",
                json=body,
                headers={"Idempotency-Key": operation_id, "Authorization": f"Bearer {token}"},
            )
        except httpx.HTTPError as exc:
            raise _simulator_failure(exc) from exc
        return _answer(response)["receipt"]

    return execute


def ticket_tool(http: httpx.Client, *, token: str = TOKEN) -> Callable[[dict, str], Any]:
    """The ``lookup_ticket`` read tool: GET /tickets/{ticket_id}."""

    def execute(arguments: dict, operation_id: str) -> Any:
        try:
            response = http.get(
                f"/tickets/{arguments['ticket_id']}", headers={"Authorization": f"Bearer {token}"}
            )
        except httpx.HTTPError as exc:
            raise _simulator_failure(exc) from exc
        return _answer(response)

    return execute


def tag_tool(http: httpx.Client, *, token: str = TOKEN) -> Callable[[dict, str], Any]:
    """The ``tag_tickets`` batch write: tags each ticket that is open and answers per ticket,
    like batch endpoints do (``{"succeeded": [...], "failed": [{"id", "error"}]}``); a closed,
    deleted or foreign ticket fails on its own while the others are tagged."""

    def execute(arguments: dict, operation_id: str) -> Any:
        succeeded, failed = [], []
        for ticket_id in arguments["ticket_ids"]:
            try:
                response = http.get(
                    f"/tickets/{ticket_id}", headers={"Authorization": f"Bearer {token}"}
                )
            except httpx.HTTPError as exc:
                raise _simulator_failure(exc) from exc
            ticket = response.json() if response.status_code == 200 else {}
            if ticket.get("status") == "open":
                succeeded.append(ticket_id)
            else:
                error = ticket.get("status") and f"ticket is {ticket['status']}"
                failed.append({"id": ticket_id, "error": error or response.json().get("error")})
        return {"tag": arguments["tag"], "succeeded": succeeded, "failed": failed}

    return execute


# --------------------------------------------------------------------------- contracts

FOLLOW_UP_SCHEMA = {
    "type": "object",
    "properties": {
        "ticket_id": {
            "type": "string",
            "pattern": "^T-[0-9]+$",
            "description": "Support ticket id, e.g. T-1042",
            "examples": ["T-1042"],
        },
        "assignee_id": {
            "type": "string",
            "minLength": 1,
            "description": "User id of the assignee, e.g. u-7",
            "examples": ["u-7"],
        },
        "due_at": {
            "type": "string",
            "format": "date-time",
            "description": "When the follow-up is due, RFC 3339, e.g. 2026-12-01T09:00:00Z",
            "examples": ["2026-12-01T09:00:00Z"],
        },
        "note": {
            "type": "string",
            "maxLength": 500,
            "description": "Optional note for the assignee",
        },
    },
    "required": ["ticket_id", "assignee_id", "due_at"],
    "additionalProperties": False,
}


def contracts(simulator_base_url: str) -> dict[str, dict]:
    """The demo's tool contracts as ``register_tool`` keyword arguments, by name."""
    lookup = lookup_url(simulator_base_url)
    return {
        "create_follow_up": dict(
            description="Create a follow-up task on a support ticket. Idempotent by operation ID.",
            effect="write",
            idempotent=True,
            reconcilable=True,
            reconcile_url=lookup,
            max_attempts=3,
            max_reasks=2,
            retry=RetryPolicy(
                initial_interval=0.5,
                backoff_coefficient=2,
                maximum_interval=5,
                deadline_seconds=600,
            ),
            parameters=FOLLOW_UP_SCHEMA,
        ),
        "escalate_ticket": dict(
            description="Escalate a ticket to second-level support (the target does not dedupe).",
            effect="write",
            idempotent=False,
            reconcilable=True,
            reconcile_url=lookup,
            max_attempts=2,
            max_reasks=2,
            parameters=FOLLOW_UP_SCHEMA,
        ),
        "lookup_ticket": dict(
            description="Read one support ticket by id.",
            effect="read",
            max_attempts=3,
            max_reasks=2,
            parameters={
                "type": "object",
                "properties": {
                    "ticket_id": {
                        "type": "string",
                        "pattern": "^T-[0-9]+$",
                        "description": "Ticket id, e.g. T-7",
                        "examples": ["T-7"],
                    }
                },
                "required": ["ticket_id"],
            },
        ),
        "get_weather": dict(
            description="Weather for a city on a date.",
            effect="read",
            max_attempts=3,
            max_reasks=2,
            retry=RetryPolicy(initial_interval=0.2, backoff_coefficient=2, maximum_interval=2),
            parameters={
                "type": "object",
                "properties": {
                    "city": {
                        "type": "string",
                        "minLength": 1,
                        "description": "Full city name, e.g. 'Paris'",
                    },
                    "date": {
                        "type": "string",
                        "format": "date",
                        "description": "ISO 8601 date, e.g. 2026-06-15",
                        "examples": ["2026-06-15"],
                    },
                    "unit": {
                        "type": "string",
                        "enum": ["celsius", "fahrenheit"],
                        "default": "celsius",
                        "description": "Temperature unit",
                    },
                },
                "required": ["city"],
            },
        ),
        "search_products": dict(
            description="Search the product catalogue by name.",
            effect="read",
            max_attempts=4,
            max_reasks=2,
            parameters={
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "minLength": 1,
                        "description": "Words to search for",
                    },
                    "num_results": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 10,
                        "default": 5,
                        "description": "How many results, 1 to 10",
                    },
                },
                "required": ["query"],
            },
        ),
        "issue_payout": dict(
            description="Pay a customer a refund. A human approves every payout.",
            effect="write",
            idempotent=False,
            reconcilable=False,
            requires_approval=True,
            approval_timeout_seconds=3600,
            max_attempts=1,
            max_reasks=1,
            sensitive_fields=["iban"],
            parameters={
                "type": "object",
                "properties": {
                    "customer_id": {
                        "type": "string",
                        "pattern": "^C-[0-9]+$",
                        "description": "Customer id, e.g. C-12",
                    },
                    "amount_cents": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 500000,
                        "description": "Amount in euro cents",
                    },
                    "iban": {
                        "type": "string",
                        "minLength": 15,
                        "maxLength": 34,
                        "description": "Payee IBAN",
                    },
                },
                "required": ["customer_id", "amount_cents", "iban"],
            },
        ),
        "tag_tickets": dict(
            description="Add a tag to several support tickets in one call; the help desk "
            "answers per ticket (succeeded and failed ones).",
            effect="write",
            idempotent=True,
            max_attempts=2,
            max_reasks=2,
            parameters={
                "type": "object",
                "properties": {
                    "ticket_ids": {
                        "type": "array",
                        "items": {"type": "string", "pattern": "^T-[0-9]+$"},
                        "minItems": 1,
                        "maxItems": 50,
                        "description": "Ticket ids, e.g. ['T-1', 'T-2']",
                    },
                    "tag": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 40,
                        "description": "The tag to add, e.g. 'billing'",
                    },
                },
                "required": ["ticket_ids", "tag"],
            },
        ),
        "read_kb_article": dict(
            description="Read an article of the knowledge base (a workspace the integration "
            "sees only the pages shared with it).",
            effect="read",
            max_attempts=3,
            max_reasks=2,
            parameters={
                "type": "object",
                "properties": {
                    "article_id": {
                        "type": "string",
                        "pattern": "^KB-[0-9]+$",
                        "description": "Article id, e.g. KB-12",
                    }
                },
                "required": ["article_id"],
            },
        ),
        # badly described on purpose: the contract linter scores it low
        "do_stuff": dict(
            description="does stuff",
            effect="write",
            idempotent=False,
            reconcilable=False,
            max_attempts=2,
            max_reasks=1,
            parameters={
                "type": "object",
                "properties": {"x": {}, "y": {"type": "string"}, "n": {"type": "number"}},
            },
        ),
    }


# --------------------------------------------------------------------------- provider formats


def as_openai(tool: str, arguments: Any, call_id: str) -> dict:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": tool, "arguments": raw}}


def as_anthropic(tool: str, arguments: dict, call_id: str) -> dict:
    return {"type": "tool_use", "id": call_id, "name": tool, "input": arguments}


def as_gemini(tool: str, arguments: dict, call_id: str) -> dict:
    return {"functionCall": {"name": tool, "args": arguments}}


def as_mcp(tool: str, arguments: dict, call_id: str) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": call_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


def as_responses(tool: str, arguments: Any, call_id: str) -> dict:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "call_id": call_id, "name": tool, "arguments": raw}


FORMATS: dict[str, Callable[[str, Any, str], dict]] = {
    "openai": as_openai,
    "anthropic": as_anthropic,
    "gemini": as_gemini,
    "mcp": as_mcp,
    "openai_responses": as_responses,
}


# --------------------------------------------------------------------------- the fleet

ROLES = ("support-bot", "shop-bot", "finance-bot", "legacy-bot")
#: the tools each role registers and calls (an agent ``support-bot-2`` has its role's):
#: support works tickets, the shop answers shoppers, finance pays out, and the legacy bot
#: still runs its old catch-all tool beside two others it copied
AGENT_TOOLS: dict[str, tuple[str, ...]] = {
    "support-bot": (
        "lookup_ticket",
        "create_follow_up",
        "escalate_ticket",
        "tag_tickets",
        "read_kb_article",
    ),
    "shop-bot": ("get_weather", "search_products"),
    "finance-bot": ("issue_payout",),
    "legacy-bot": ("do_stuff", "create_follow_up", "get_weather"),
}


def role_of(agent_name: str) -> str:
    """The role of a demo agent's name (``support-bot-2`` → ``support-bot``)."""
    return next((role for role in ROLES if agent_name.startswith(role)), ROLES[0])


CITIES = ("Paris", "Lisbon", "Oslo", "Nairobi", "Osaka", "Lima", "Toronto", "Zagreb")
QUERIES = (
    "usb-c cable",
    "standing desk",
    "noise cancelling headphones",
    "laptop stand",
    "4k monitor",
)
CONDITIONS = ("sunny", "cloudy", "rain", "snow", "windy")


class VirtualTime:
    """The fleet's clock: ``sleep`` advances it at once (the demo never really waits) and
    runs the actions scheduled for "while the agent waits" (an operator deciding, say)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.on_sleep: list[Callable[[], None]] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
        while self.on_sleep:
            self.on_sleep.pop(0)()


class ScriptedModel:
    """A "model" that answers each observation with its next scripted proposal."""

    def __init__(self, *proposals: Any) -> None:
        self.proposals = list(proposals)
        self.observations: list[str] = []

    def __call__(self, observation: str) -> Any:
        self.observations.append(observation)
        return self.proposals.pop(0) if len(self.proposals) > 1 else self.proposals[0]


@dataclass
class FleetStats:
    calls: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    episodes: dict[str, int] = field(default_factory=dict)

    def add(self, episode: str, result: RunResult | None) -> None:
        self.calls += 1
        self.episodes[episode] = self.episodes.get(episode, 0) + 1
        status = result.status if result is not None else "abandoned"
        self.statuses[status] = self.statuses.get(status, 0) + 1


class Fleet:
    """Simulated agents running scripted episodes through the SDK.

    ``clients`` maps agent name -> ``CallgateClient`` (all on ``time``); ``sim`` is the
    target; ``operator`` is the user whose decisions the scripted operator makes.
    """

    def __init__(
        self,
        *,
        clients: dict[str, CallgateClient],
        sim: SimulatorService,
        rng,
        time_: VirtualTime,
        operator,
        run_tag: str,
    ) -> None:
        self.clients = clients
        self.sim = sim
        self.http = simulator_client(sim)
        self.rng = rng
        self.time = time_
        self.operator = operator
        self.run_tag = run_tag
        self.counter = 0
        self.covering = False  # True while the first episode of each reason runs
        self.stats = FleetStats()
        self.follow_up = follow_up_tool(self.http)
        self.lookup_ticket = ticket_tool(self.http)

    # --- helpers
    def agent(self, role: str) -> CallgateClient:
        # without an agent of the role, the first one (it registered the role's tools)
        names = [n for n in self.clients if n.startswith(role)] or [next(iter(self.clients))]
        return self.clients[self.rng.choice(sorted(names))]

    def ids(self) -> tuple[str, str]:
        self.counter += 1
        return f"{self.run_tag}-req-{self.counter}", f"call_{self.run_tag}_{self.counter}"

    def fmt(self) -> Format:
        return self.rng.choice(
            ["openai", "openai", "anthropic", "gemini", "mcp", "openai_responses"]
        )

    def proposal(
        self, tool: str, arguments: Any, call_id: str, fmt: Format | None = None
    ) -> tuple[Format, dict]:
        fmt = fmt or self.fmt()
        if isinstance(arguments, str) and fmt not in ("openai", "openai_responses"):
            fmt = "openai"
        return fmt, FORMATS[fmt](tool, arguments, call_id)

    def due(self) -> str:
        return f"2026-12-{self.rng.randint(1, 28):02d}T{self.rng.randint(8, 17):02d}:00:00Z"

    def follow_up_args(self, **changes: Any) -> dict:
        return {
            "ticket_id": self.rng.choice(["T-1", "T-2"]),
            "assignee_id": f"u-{self.rng.randint(1, 40)}",
            "due_at": self.due(),
            **changes,
        }

    def weather(self, arguments: dict, operation_id: str) -> dict:
        return {
            "city": arguments["city"],
            "temperature": self.rng.randint(-5, 31),
            "condition": self.rng.choice(CONDITIONS),
        }

    def search(self, arguments: dict, operation_id: str) -> list:
        if "unicorn" in arguments["query"]:
            return []
        n = arguments.get("num_results", 5)
        return [
            {"sku": f"SKU-{self.rng.randint(1000, 9999)}", "name": f"{arguments['query']} #{i + 1}"}
            for i in range(n)
        ]

    def payout(self, arguments: dict, operation_id: str) -> dict:
        return {
            "payout_id": f"P-{self.rng.randint(100, 999)}",
            "amount_cents": arguments["amount_cents"],
        }

    def run(
        self,
        role: str,
        tool: str,
        arguments: Any,
        execute,
        *,
        model: ScriptedModel | None = None,
        fmt: Format | None = None,
        operation_id: str | None = None,
        request_id: str | None = None,
        wait_limit: float = 30,
    ) -> RunResult:
        client = self.agent(role)
        rid, cid = self.ids()
        fmt, call = self.proposal(tool, arguments, cid, fmt)
        kwargs: dict[str, Any] = dict(
            request_id=request_id or rid,
            wait_limit=wait_limit,
            actor=f"user-{self.rng.randint(1, 9)}",
        )
        if operation_id:
            kwargs["operation_id"] = operation_id
        if model is not None:
            return SelfCorrector(client, model, max_reasks=5).run(fmt, call, execute, **kwargs)
        return client.run(fmt, call, execute, **kwargs)

    def attempt_once(self, role: str, tool: str, arguments: dict, execute) -> None:
        """An agent that checks, executes once, reports, and then gives up (its user left):
        the call stays where the answer put it (e.g. waiting to retry)."""
        client = self.agent(role)
        rid, cid = self.ids()
        fmt, call = self.proposal(tool, arguments, cid)
        answer = client.check(fmt, call, request_id=rid)
        if answer.verdict != "allow":
            return
        breaker = client.breaker(tool)
        if not breaker.allow():
            body = {
                "sent": False,
                "outcome": "circuit_open",
                "http_status": None,
                "error": f"circuit open for {tool}",
            }
        else:
            try:
                result = execute(dict(arguments), answer.operation_id)
                body = {
                    "sent": True,
                    "outcome": "success",
                    "http_status": None,
                    "error": None,
                    "result": result,
                }
                breaker.record_success()
            except ToolFailure as exc:
                body = {
                    "sent": exc.sent,
                    "outcome": exc.outcome,
                    "http_status": exc.http_status,
                    "error": exc.error,
                }
                breaker.record_failure()
        client.report_now(
            client.event(
                "attempt", operation_id=answer.operation_id, request_id=rid, attempt=1, **body
            )
        )

    def decide_when_waiting(self, decision: str, reason: str = "") -> None:
        """While the agent waits, the operator decides on the newest call waiting for a human."""
        from callgate.models import ToolCall
        from callgate.services import call_apply_decision, call_approval_expired

        def act() -> None:
            call = (
                ToolCall.objects.filter(
                    project__slug=PROJECT_SLUG, state__in=["pending_approval", "in_review"]
                )
                .order_by("-created_at", "-pk")
                .first()
            )
            if call is None:
                return
            if decision == "expire":
                call_approval_expired(call=call)
            else:
                call_apply_decision(call=call, decision=decision, reason=reason, user=self.operator)

        self.time.on_sleep.append(act)

    @staticmethod
    def failing(*failures: ToolFailure, then: Callable | None = None) -> Callable[[dict, str], Any]:
        script = list(failures)

        def execute(arguments: dict, operation_id: str) -> Any:
            if script:
                raise script.pop(0)
            if then is None:
                raise ToolFailure("still failing", sent=True, http_status=503)
            return then(arguments, operation_id)

        return execute

    # --- episodes: one per reason (at least), then a realistic mix
    def ep_ok(self):
        tool = self.rng.choice(
            ["get_weather", "create_follow_up", "lookup_ticket", "search_products"]
        )
        if tool == "get_weather":
            return self.run("shop-bot", tool, {"city": self.rng.choice(CITIES)}, self.weather)
        if tool == "search_products":
            return self.run(
                "shop-bot",
                tool,
                {"query": self.rng.choice(QUERIES), "num_results": self.rng.randint(1, 5)},
                self.search,
            )
        if tool == "lookup_ticket":
            return self.run(
                "support-bot",
                tool,
                {"ticket_id": self.rng.choice(["T-1", "T-2"])},
                self.lookup_ticket,
            )
        return self.run("support-bot", tool, self.follow_up_args(), self.follow_up)

    def ep_empty_result(self):
        return self.run("shop-bot", "search_products", {"query": "unicorn saddle"}, self.search)

    def ep_malformed_call(self):
        model = ScriptedModel(("plain", {"tool": "get_weather", "arguments": {"city": "Oslo"}}))
        client = self.agent("shop-bot")
        rid, _ = self.ids()
        return SelfCorrector(client, model, max_reasks=3).run(
            "plain",
            {"text": "Sure! Let me check the weather in Oslo for you."},
            self.weather,
            request_id=rid,
        )

    def ep_invalid_json(self):
        city = self.rng.choice(CITIES)
        model = ScriptedModel(("openai", as_openai("get_weather", {"city": city}, "call_fix")))
        return self.run(
            "shop-bot",
            "get_weather",
            f'{{"city": "{city}",}}',
            self.weather,
            model=model,
            fmt="openai",
        )

    def ep_missing_required(self):
        args = self.follow_up_args()
        broken = {k: v for k, v in args.items() if k != "due_at"}
        model = ScriptedModel(("anthropic", as_anthropic("create_follow_up", args, "toolu_fix")))
        return self.run(
            "support-bot", "create_follow_up", broken, self.follow_up, model=model, fmt="anthropic"
        )

    def ep_type_mismatch(self):
        query = self.rng.choice(QUERIES)
        model = ScriptedModel(
            ("openai", as_openai("search_products", {"query": query, "num_results": 5}, "c"))
        )
        return self.run(
            "shop-bot",
            "search_products",
            {"query": query, "num_results": "5"},
            self.search,
            model=model,
            fmt="openai",
        )

    def ep_enum_violation(self):
        city = self.rng.choice(CITIES)
        model = ScriptedModel(
            ("openai", as_openai("get_weather", {"city": city, "unit": "celsius"}, "c"))
        )
        return self.run(
            "shop-bot",
            "get_weather",
            {"city": city, "unit": "kelvin"},
            self.weather,
            model=model,
            fmt="openai",
        )

    def ep_constraint_violation(self):
        args = self.follow_up_args()
        bad = self.rng.choice(["next tuesday", "2026-02-30T09:00:00Z", "12/01/2026", "2026-12-01"])
        model = ScriptedModel(("openai", as_openai("create_follow_up", args, "c")))
        return self.run(
            "support-bot",
            "create_follow_up",
            {**args, "due_at": bad},
            self.follow_up,
            model=model,
            fmt="openai",
        )

    def ep_unknown_tool(self):
        args = self.follow_up_args()
        model = ScriptedModel(("openai", as_openai("create_follow_up", args, "c")))
        return self.run(
            "support-bot",
            "send_email",
            {"to": "customer@example.test", "body": "We are on it"},
            self.follow_up,
            model=model,
            fmt="openai",
        )

    def ep_unknown_argument(self):
        args = self.follow_up_args()
        model = ScriptedModel(("openai", as_openai("create_follow_up", args, "c")))
        return self.run(
            "support-bot",
            "create_follow_up",
            {**args, "priority": "high"},
            self.follow_up,
            model=model,
            fmt="openai",
        )

    def ep_reask_exhausted(self):
        model = ScriptedModel(
            *[
                ("openai", as_openai("get_weather", {"city": "Paris", "unit": u}, "c"))
                for u in ("Kelvin", "K", "kelvins", "rankine")
            ]
        )
        return self.run(
            "shop-bot",
            "get_weather",
            {"city": "Paris", "unit": "kelvin"},
            self.weather,
            model=model,
            fmt="openai",
        )

    def ep_reference_not_found(self):
        return self.run(
            "support-bot", "create_follow_up", self.follow_up_args(ticket_id="T-4"), self.follow_up
        )

    def ep_permission_denied(self):
        return self.run(
            "support-bot", "create_follow_up", self.follow_up_args(ticket_id="T-3"), self.follow_up
        )

    def ep_authentication_failed(self):
        self.sim.fail_next("unauthorized", on="read")
        return self.run(
            "support-bot", "lookup_ticket", {"ticket_id": "T-2"}, self.lookup_ticket, wait_limit=2
        )

    def ep_rate_limited(self):
        self.sim.fail_next("rate_limited")
        if self.covering or self.rng.random() < 0.5:
            return self.attempt_once(
                "support-bot", "create_follow_up", self.follow_up_args(), self.follow_up
            )
        return self.run("support-bot", "create_follow_up", self.follow_up_args(), self.follow_up)

    def ep_unavailable(self):
        self.sim.fail_next(self.rng.choice(["connect_error", "unavailable"]))
        if self.covering or self.rng.random() < 0.5:
            return self.attempt_once(
                "support-bot", "create_follow_up", self.follow_up_args(), self.follow_up
            )
        return self.run("support-bot", "create_follow_up", self.follow_up_args(), self.follow_up)

    def ep_circuit_open(self):
        role = "shop-bot"
        client = self.agent(role)
        breaker = client.breaker("search_products")
        for _ in range(breaker.failure_threshold):
            breaker.record_failure()
        # the catalogue is down: the breaker is open, the agent reports it and gives up for now
        rid, cid = self.ids()
        fmt, call = self.proposal("search_products", {"query": self.rng.choice(QUERIES)}, cid)
        answer = client.check(fmt, call, request_id=rid)
        client.report_now(
            client.event(
                "attempt",
                operation_id=answer.operation_id,
                request_id=rid,
                attempt=1,
                sent=False,
                outcome="circuit_open",
                http_status=None,
                error="circuit open for search_products",
            )
        )
        self.time.sleep(
            client.breaker_cooldown
        )  # later the breaker half-opens; the next call is the trial
        return None

    def ep_read_failure(self):
        failure = ToolFailure("ReadTimeout after 10s", sent=True, outcome="timeout")
        if self.covering or self.rng.random() < 0.5:
            return self.attempt_once(
                "shop-bot",
                "get_weather",
                {"city": self.rng.choice(CITIES)},
                self.failing(failure, then=self.weather),
            )
        return self.run(
            "shop-bot",
            "get_weather",
            {"city": self.rng.choice(CITIES)},
            self.failing(failure, then=self.weather),
        )

    def ep_outcome_unknown(self):
        # the write timed out and the target's look-up is down too: nobody can tell yet
        self.sim.fail_next("timeout_after_write")
        self.sim.fail_next("unavailable", count=5, on="lookup")
        return self.run(
            "support-bot", "create_follow_up", self.follow_up_args(), self.follow_up, wait_limit=2
        )

    def ep_not_reconcilable(self):
        failure = ToolFailure("ReadTimeout", sent=True, outcome="timeout")
        return self.run(
            "legacy-bot",
            "do_stuff",
            {"x": "reindex", "y": "all"},
            self.failing(failure),
            wait_limit=2,
        )

    def ep_tool_error(self):
        def geocode(arguments, operation_id):
            if arguments["city"] == "Narnia":
                raise ValueError("GeocodeError: no coordinates for 'Narnia'")
            return self.weather(arguments, operation_id)

        model = ScriptedModel(("openai", as_openai("get_weather", {"city": "Paris"}, "c")))
        return self.run(
            "shop-bot", "get_weather", {"city": "Narnia"}, geocode, model=model, fmt="openai"
        )

    def ep_partial_failure(self):
        # a batch write: T-5 is closed, the other tickets are tagged
        ids = self.rng.sample(["T-1", "T-2"], k=2) + ["T-5"]
        return self.run(
            "support-bot",
            "tag_tickets",
            {"ticket_ids": ids, "tag": self.rng.choice(["billing", "vip", "bug"])},
            tag_tool(self.http),
        )

    def ep_contract_drift(self):
        # the catalogue's MCP server was upgraded and renamed num_results; the contract lags
        drift = ToolFailure(
            "McpError: MCP error -32602: Invalid arguments for tool search_products: "
            "unknown property 'num_results'",
            sent=True,
        )
        return self.run(
            "shop-bot",
            "search_products",
            {"query": self.rng.choice(QUERIES), "num_results": self.rng.randint(1, 5)},
            self.failing(drift),
            fmt="mcp",
            wait_limit=2,
        )

    def ep_not_found_or_forbidden(self):
        # the knowledge base hides pages not shared with the integration behind a 404
        article = f"KB-{self.rng.randint(10, 99)}"
        hidden = ToolFailure(
            f"object_not_found: Could not find page with ID: {article}. Make sure the "
            "relevant pages and databases are shared with your integration.",
            sent=True,
            http_status=404,
        )
        return self.run(
            "support-bot",
            "read_kb_article",
            {"article_id": article},
            self.failing(hidden),
            wait_limit=2,
        )

    def ep_conflict(self):
        return self.run(
            "support-bot",
            "create_follow_up",
            self.follow_up_args(ticket_id="T-5"),
            self.follow_up,
            wait_limit=2,
        )

    def ep_duplicate_suppressed(self):
        client = self.agent("support-bot")
        rid, cid = self.ids()
        fmt, call = self.proposal("create_follow_up", self.follow_up_args(), cid)
        client.run(fmt, call, self.follow_up, request_id=rid)
        self.stats.add("duplicate_suppressed(first)", None)
        return client.run(fmt, call, self.follow_up, request_id=rid)  # the model repeats itself

    def ep_idempotency_mismatch(self):
        op = f"{self.run_tag}-op-{self.counter}-{self.rng.randint(1000, 9999)}"
        self.run(
            "support-bot",
            "create_follow_up",
            self.follow_up_args(),
            self.follow_up,
            operation_id=op,
        )
        self.stats.add("idempotency_mismatch(first)", None)
        # a buggy runtime reuses the operation ID for a different call
        return self.run(
            "support-bot",
            "create_follow_up",
            self.follow_up_args(),
            self.follow_up,
            operation_id=op,
        )

    def ep_retry_exhausted(self):
        failure = ToolFailure("Service Unavailable", sent=True, http_status=503)
        return self.run(
            "shop-bot",
            "get_weather",
            {"city": self.rng.choice(CITIES)},
            self.failing(failure, failure, failure, failure),
            wait_limit=2,
        )

    def ep_reconciled_applied(self):
        self.sim.fail_next("timeout_after_write")
        return self.run("support-bot", "create_follow_up", self.follow_up_args(), self.follow_up)

    def ep_reconciled_absent(self):
        self.sim.fail_next("timeout_no_write")
        if self.covering or self.rng.random() < 0.6:  # not idempotent: a human decides
            return self.run(
                "support-bot",
                "escalate_ticket",
                self.follow_up_args(note="customer is angry"),
                self.follow_up,
                wait_limit=2,
            )
        return self.run(
            "support-bot", "create_follow_up", self.follow_up_args(), self.follow_up
        )  # retried once

    def ep_reconcile_mismatch(self):
        # a buggy adapter sends another assignee than the validated arguments; the write times out
        self.sim.fail_next("timeout_after_write")
        tool = follow_up_tool(self.http, mangle=lambda a: {**a, "assignee_id": "u-0"})
        return self.run(
            "support-bot", "create_follow_up", self.follow_up_args(), tool, wait_limit=2
        )

    def payout_args(self) -> dict:
        return {
            "customer_id": f"C-{self.rng.randint(1, 99)}",
            "amount_cents": self.rng.randint(500, 50000),
            "iban": "DE89370400440532013000",
        }

    def ep_approval_pending(self):
        return self.run(
            "finance-bot", "issue_payout", self.payout_args(), self.payout, wait_limit=2
        )

    def ep_approval_rejected(self):
        self.decide_when_waiting(
            "reject", "Refund exceeds the order value; ask the customer for the invoice."
        )
        return self.run(
            "finance-bot", "issue_payout", self.payout_args(), self.payout, wait_limit=5
        )

    def ep_approval_expired(self):
        self.decide_when_waiting("expire")
        return self.run(
            "finance-bot", "issue_payout", self.payout_args(), self.payout, wait_limit=5
        )

    def ep_approved(self):
        self.decide_when_waiting("approve", "Checked against the order.")
        return self.run(
            "finance-bot", "issue_payout", self.payout_args(), self.payout, wait_limit=5
        )

    def ep_missing_call_id(self):
        # a streaming client lost the tool call's id while assembling the chunks
        client = self.agent("shop-bot")
        rid, _ = self.ids()
        call = {
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})},
        }
        client.check("openai", call, request_id=rid)

    def ep_parallel_turn(self):
        """One Claude message with four tool calls: the second reuses the first's ID
        (``duplicate_call_id``), the fourth repeats the third's write (``duplicate_in_flight``);
        the allowed ones run and report their attempts by operation ID."""
        client = self.agent("support-bot")
        rid, cid = self.ids()
        follow_up = self.follow_up_args()
        ticket = follow_up["ticket_id"]
        blocks = [
            ("lookup_ticket", {"ticket_id": ticket}, f"{cid}_a"),
            ("read_kb_article", {"article_id": f"KB-{self.rng.randint(1, 9)}"}, f"{cid}_a"),
            ("create_follow_up", follow_up, f"{cid}_b"),
            ("create_follow_up", dict(follow_up), f"{cid}_c"),
        ]
        response = {
            "role": "assistant",
            "content": [{"type": "text", "text": "Checking the ticket and scheduling."}]
            + [as_anthropic(tool, arguments, call_id) for tool, arguments, call_id in blocks],
        }
        answers = client.check_turn("anthropic", response, request_id=rid)
        tools = {"lookup_ticket": self.lookup_ticket, "create_follow_up": self.follow_up}
        for (tool, arguments, _), answer in zip(blocks, answers, strict=True):
            if answer.verdict != "allow":
                continue
            result = tools[tool](dict(arguments), answer.operation_id)
            client.report_now(
                client.event(
                    "attempt",
                    operation_id=answer.operation_id,
                    request_id=rid,
                    sent=True,
                    outcome="success",
                    result=result,
                )
            )

    def ep_loop_detected(self):
        # the model keeps asking for the same weather although it has the answer
        client = self.agent("shop-bot")
        rid, cid = self.ids()
        fmt, call = self.proposal("get_weather", {"city": self.rng.choice(CITIES)}, cid)
        result = client.run(fmt, call, self.weather, request_id=rid)
        for _ in range(3):
            client.check(fmt, call, request_id=rid)
        return result

    #: every reason once, in this order
    COVERAGE = (
        "ok",
        "empty_result",
        "malformed_call",
        "invalid_json",
        "missing_required",
        "type_mismatch",
        "enum_violation",
        "constraint_violation",
        "unknown_tool",
        "unknown_argument",
        "reference_not_found",
        "permission_denied",
        "authentication_failed",
        "rate_limited",
        "unavailable",
        "circuit_open",
        "read_failure",
        "outcome_unknown",
        "not_reconcilable",
        "tool_error",
        "partial_failure",
        "contract_drift",
        "not_found_or_forbidden",
        "conflict",
        "duplicate_suppressed",
        "idempotency_mismatch",
        "retry_exhausted",
        "reask_exhausted",
        "reconciled_applied",
        "reconciled_absent",
        "reconcile_mismatch",
        "approval_pending",
        "approval_rejected",
        "approval_expired",
        "approved",
        "missing_call_id",
        "parallel_turn",
        "loop_detected",
    )
    #: the realistic mix after that: mostly fine calls, some mistakes and failures
    MIX = {
        "ok": 40,
        "empty_result": 4,
        "invalid_json": 3,
        "missing_required": 3,
        "type_mismatch": 4,
        "enum_violation": 2,
        "constraint_violation": 5,
        "unknown_tool": 2,
        "unknown_argument": 3,
        "reference_not_found": 3,
        "permission_denied": 2,
        "rate_limited": 2,
        "unavailable": 3,
        "read_failure": 3,
        "tool_error": 2,
        "partial_failure": 2,
        "contract_drift": 1,
        "not_found_or_forbidden": 1,
        "duplicate_suppressed": 3,
        "reconciled_applied": 2,
        "reconciled_absent": 2,
        "conflict": 1,
        "retry_exhausted": 1,
        "approval_pending": 1,
        "approved": 1,
        "approval_rejected": 1,
        "reask_exhausted": 1,
        "outcome_unknown": 1,
        "not_reconcilable": 1,
        "malformed_call": 1,
        "reconcile_mismatch": 1,
        "parallel_turn": 2,
        "loop_detected": 1,
        "missing_call_id": 1,
    }

    def episode(self, name: str) -> None:
        """Run one episode. Between episodes some (virtual) time passes, so open circuit
        breakers cool down; while covering every reason, each starts with closed breakers."""
        if self.covering:
            for client in self.clients.values():
                client.breakers.clear()
        else:
            self.time.sleep(self.rng.uniform(5, 60))
        result = getattr(self, f"ep_{name}")()
        self.stats.add(name, result)

    def plan(self, calls: int) -> list[str]:
        names = list(self.COVERAGE)
        pool, weights = zip(*self.MIX.items(), strict=True)
        while len(names) < calls:
            names.append(self.rng.choices(pool, weights=weights)[0])
        head, tail = names[: len(self.COVERAGE)], names[len(self.COVERAGE) :]
        return head + tail


# --------------------------------------------------------------------------- set-up and run


@dataclass
class DemoSetup:
    project: Any
    operator_password: str
    manager_password: str
    keys: dict[str, str]
    admin_password: str = ""


def demo_setup(*, agents: int = 4) -> DemoSetup:
    """The ``demo`` project, users ``operator``, ``manager`` and ``admin`` (fresh passwords;
    ``admin`` is also a Django superuser, for the admin site), and ``agents`` agents with a
    fresh API key each. Idempotent apart from the new keys."""
    from django.contrib.auth import get_user_model

    from callgate.auth import api_key_issue
    from callgate.services import agent_get_or_create, membership_set, project_create

    project, _ = project_create(slug=PROJECT_SLUG, name="Demo")
    passwords = {}
    User = get_user_model()
    for username, role in (("operator", "operator"), ("manager", "manager"), ("admin", "admin")):
        password = secrets.token_urlsafe(12)
        user = User.objects.filter(username=username).first()
        if user is not None:  # an earlier demo run: a fresh password (hashing is slow, do it once)
            user.set_password(password)
            user.save(update_fields=["password"])
        membership_set(project_slug=PROJECT_SLUG, username=username, role=role, password=password)
        passwords[username] = password
    keys = {}
    for index in range(agents):
        name = ROLES[index % len(ROLES)] + (
            f"-{index // len(ROLES) + 1}" if index >= len(ROLES) else ""
        )
        agent = agent_get_or_create(project_slug=PROJECT_SLUG, name=name)
        keys[name] = api_key_issue(agent=agent, name="demo").plain
    User.objects.filter(username="admin").update(is_staff=True, is_superuser=True)
    return DemoSetup(
        project=project,
        operator_password=passwords["operator"],
        manager_password=passwords["manager"],
        keys=keys,
        admin_password=passwords["admin"],
    )


#: how far back a call still waiting on the agent or a clock may move (it stays current)
WAITING_SHIFT_LIMIT = 600  # seconds
#: states in which a call waits on the agent or a clock, not on a person
WAITING_STATES = ("pending_approval", "allowed", "retry_wait", "reconciling")


def spread_over_days(*, project, rng, days: int = 7, since=None) -> None:
    """Demo data only: move the demo's calls (created at or after ``since``) back over the
    last ``days`` days, so the reports show a history, then rebuild the project's rollups.

    Everything that happened to a call moves with it by the same amount: its times, its
    events, its review items and their audit trail (decisions included), so an item opened
    for a call of this morning says it was opened this morning and "decided today" counts
    only decisions made today. A call still waiting on the agent or a clock (an approval
    running out, a retry due) moves back at most ``WAITING_SHIFT_LIMIT`` seconds, and never
    past its approval's expiry: it is still current."""
    from datetime import timedelta

    from django.db import transaction
    from django.db.models import F
    from django.utils import timezone

    from callgate.models import CallEvent, ToolCall
    from callgate.reports.rollups import rollups_rebuild
    from callgate.reports.tallies import refusal_rollups_rebuild, review_rollups_rebuild
    from reviews.models import ReviewAudit, ReviewItem

    now = timezone.now()
    calls = ToolCall.objects.filter(project=project)
    if since is not None:
        calls = calls.filter(created_at__gte=since)
    call_times = (
        *("created_at", "updated_at", "receipt_at", "deadline", "approval_expires_at"),
        *("reconcile_requested_at", "decided_at"),
    )
    item_times = (
        *("created_at", "updated_at", "claimed_at", "lease_expires_at"),
        *("approval_expires_at", "resolved_at"),
    )
    with transaction.atomic():
        for call in calls.only("pk", "state", "approval_expires_at").order_by("pk"):
            seconds = rng.randint(0, days * 86400)
            if call.state in WAITING_STATES:
                limit = WAITING_SHIFT_LIMIT
                if call.approval_expires_at is not None:
                    left = (call.approval_expires_at - now).total_seconds() - 120
                    limit = max(0, min(limit, int(left)))
                seconds = min(seconds, limit)
            shift = timedelta(seconds=seconds)
            ToolCall.objects.filter(pk=call.pk).update(**{f: F(f) - shift for f in call_times})
            CallEvent.objects.filter(call_id=call.pk).update(
                occurred_at=F("occurred_at") - shift, received_at=F("received_at") - shift
            )
            ReviewItem.objects.filter(call_id=call.pk).update(
                **{f: F(f) - shift for f in item_times}
            )
            # the trail is append-only for the product (AuditQuerySet); the demo moves a
            # made-up history back in time as a whole, through the plain base manager
            ReviewAudit._base_manager.filter(item__call_id=call.pk).update(
                created_at=F("created_at") - shift
            )
    rollups_rebuild(project_id=project.pk)
    review_rollups_rebuild(project_id=project.pk)
    refusal_rollups_rebuild(project_id=project.pk)


def agent_tool_sets(agent_names: list[str]) -> dict[str, tuple[str, ...]]:
    """The tools each of ``agent_names`` registers: its role's (``AGENT_TOOLS``); the first
    agent also takes the tools of roles no agent has (a fleet of fewer than four agents),
    as ``Fleet.agent`` hands it their episodes."""
    sets = {name: AGENT_TOOLS[role_of(name)] for name in agent_names}
    present = {role_of(name) for name in agent_names}
    orphans = [t for role in ROLES if role not in present for t in AGENT_TOOLS[role]]
    if agent_names and orphans:
        first = agent_names[0]
        sets[first] = sets[first] + tuple(t for t in orphans if t not in sets[first])
    return sets


def _forget_other_tools(project, tool_sets: dict[str, tuple[str, ...]]) -> None:
    """Demo data only: drop the registrations of the fleet's agents outside their tool set
    (earlier demo versions registered every tool for every agent), keeping the tools the
    history gives them (``demo.history.TOOLS``)."""
    from callgate.models import AgentTool
    from demo.history import TOOLS

    stale = AgentTool.objects.filter(agent__project=project, agent__name__in=list(tool_sets))
    for tool in stale.select_related("agent"):
        name = tool.agent.name
        if tool.name not in tool_sets[name] and name not in TOOLS.get(tool.name, (0, ()))[1]:
            tool.delete()


def _fleet(
    *,
    setup: DemoSetup,
    sim: SimulatorService,
    rng,
    base_url: str,
    public_url: str,
    run_tag: str,
    **client_options: Any,
) -> Fleet:
    """A fleet of SDK clients (one per demo agent, in-process, on virtual time) with the demo's
    contracts registered; look-up URLs point at the simulator under ``public_url``."""
    from django.contrib.auth import get_user_model

    time_ = VirtualTime()
    transport = callgate_transport()
    clients = {
        name: CallgateClient(
            base_url,
            key,
            transport=transport,
            flush_interval=None,
            execute_timeout=None,
            sleep=time_.sleep,
            clock=time_.clock,
            wait_limit=30,
            **client_options,
        )
        for name, key in setup.keys.items()
    }
    specs = contracts(f"{public_url.rstrip('/')}{SIMULATOR_PATH}")
    tool_sets = agent_tool_sets(list(clients))
    for agent_name, client in clients.items():
        for name in tool_sets[agent_name]:
            client.register_tool(name, **specs[name])
    _forget_other_tools(setup.project, tool_sets)
    operator = get_user_model().objects.get(username="operator")
    return Fleet(clients=clients, sim=sim, rng=rng, time_=time_, operator=operator, run_tag=run_tag)


def demo_run(
    *,
    seed: int = 1,
    agents: int = 4,
    calls: int = 60,
    base_url: str = "http://localhost",
    public_url: str = "http://127.0.0.1:8000",
    spread_days: int = 7,
    progress: Callable[[int, int, str], None] | None = None,
    sim: SimulatorService | None = None,
) -> tuple[DemoSetup, FleetStats]:
    """Set up the demo and run ``calls`` scripted calls (at least one per reason) with
    ``agents`` agents, in-process, against ``sim`` (default: the process-wide demo simulator).
    Returns the set-up (passwords, keys) and the statistics."""
    import random

    from django.utils import timezone

    rng = random.Random(seed)
    random.seed(seed)  # callgate's own jitter (retry_after) too, so a seed replays the same run
    setup = demo_setup(agents=agents)
    started = timezone.now()
    sim = sim or default_service()
    fleet = _fleet(
        setup=setup,
        sim=sim,
        rng=rng,
        base_url=base_url,
        public_url=public_url,
        run_tag=f"s{seed}-{uuid.uuid4().hex[:6]}",
        poll_interval=1,
        breaker_threshold=3,
        breaker_cooldown=30,
    )
    clients = fleet.clients
    plan = fleet.plan(max(calls, len(Fleet.COVERAGE)))
    for done, name in enumerate(plan, start=1):
        fleet.covering = done <= len(Fleet.COVERAGE)
        fleet.episode(name)
        if progress is not None:
            progress(done, len(plan), name)
    for client in clients.values():
        client.close()
    if spread_days:
        spread_over_days(project=setup.project, rng=rng, days=spread_days, since=started)
    return setup, fleet.stats


def demo_trickle(
    *,
    setup: DemoSetup | None = None,
    interval: float = 5.0,
    agents: int = 4,
    base_url: str = "http://localhost",
    public_url: str = "http://127.0.0.1:8000",
    stop: threading.Event | None = None,
    on_call: Callable[[str], None] | None = None,
) -> None:
    """Keep a slow trickle of calls going (one every ``interval`` seconds, real time) until
    ``stop`` is set or the process is interrupted. ``setup`` is ``demo_run``'s (its keys are
    reused, the printed passwords stay valid); without it the demo is set up afresh."""
    import random

    stop = stop or threading.Event()
    rng = random.Random()
    setup = setup or demo_setup(agents=agents)
    sim = default_service()
    fleet = _fleet(
        setup=setup,
        sim=sim,
        rng=rng,
        base_url=base_url,
        public_url=public_url,
        run_tag=f"t-{uuid.uuid4().hex[:6]}",
    )
    clients = fleet.clients
    pool, weights = zip(*Fleet.MIX.items(), strict=True)
    while not stop.wait(interval):
        name = rng.choices(pool, weights=weights)[0]
        try:
            fleet.episode(name)
        except Exception as exc:  # keep trickling; print what went wrong
            print(f"demo trickle: {name} failed: {exc}", file=sys.stderr)
        if on_call is not None:
            on_call(name)
    for client in clients.values():
        client.close()
