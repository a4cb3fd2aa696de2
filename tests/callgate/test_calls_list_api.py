"""``GET /api/v1/calls``: keyset pagination, filters, bad parameters and tenancy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from callgate.models import Agent, ToolCall
from tests.factories import BaseTestCase

URL = "/api/v1/calls"
T0 = datetime(2026, 6, 15, 9, 0, tzinfo=UTC)


class CallsListTests(BaseTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        cls.helper = Agent.objects.create(project=cls.project, name="helper-bot")
        cls.rows = []
        for n in range(23):
            cls.rows.append(
                cls.make_call(
                    n,
                    # several calls share a created_at: the cursor must break ties by id
                    created_at=T0 + timedelta(seconds=n // 3, microseconds=(n % 3 == 2)),
                    tool="lookup_order" if n % 2 else "send_email",
                    reason="ok" if n % 4 else "rate_limited",
                    category="ok" if n % 4 else "transient",
                    state="succeeded" if n % 4 else "retry_wait",
                    trace_id=f"{n % 5:032x}",
                    request_id=f"req-{n % 3}",
                    conversation_id="conv-a" if n < 10 else "conv-b",
                    agent=cls.helper if n % 7 == 0 else cls.agent,
                )
            )
        cls.foreign = ToolCall.objects.create(
            project=cls.other_project,
            agent=cls.other_agent,
            operation_id="op_foreign",
            tool_name="lookup_order",
            state="succeeded",
            reason="ok",
            category="ok",
            route="proceed",
            trace_id=f"{0:032x}",
            request_id="req-0",
            created_at=T0,
        )

    @classmethod
    def make_call(cls, n: int, **fields) -> ToolCall:
        return ToolCall.objects.create(
            project=cls.project,
            agent=fields.pop("agent"),
            operation_id=f"op_{n:04d}",
            tool_name=fields.pop("tool"),
            route="proceed" if fields["reason"] == "ok" else "retry",
            **fields,
        )

    def list(self, key=None, **params):
        response = self.api(key).get(URL, params)
        return response

    def ids(self, **params) -> list[str]:
        response = self.list(**params)
        self.assertEqual(response.status_code, 200, response.content)
        return [item["operation_id"] for item in response.json()["items"]]

    def test_pages_walk_every_call_once_newest_first_and_stay_stable(self):
        newest_first = [  # the key's agent's calls (helper-bot's are not this key's to read)
            c.operation_id
            for c in sorted(self.rows, key=lambda c: (c.created_at, c.id), reverse=True)
            if c.agent_id == self.agent.pk
        ]
        seen, cursor = [], None
        while True:
            params = {"limit": 4, **({"cursor": cursor} if cursor else {})}
            body = self.list(**params).json()
            seen += [item["operation_id"] for item in body["items"]]
            if len(seen) == 8:  # a call arriving between pages does not shift the next ones
                self.make_call(
                    99,
                    created_at=T0 + timedelta(hours=1),
                    tool="lookup_order",
                    reason="ok",
                    category="ok",
                    state="succeeded",
                    agent=self.agent,
                )
            cursor = body["next_cursor"]
            if cursor is None:
                break
        self.assertEqual(seen, newest_first)
        self.assertEqual(self.ids(limit=1), ["op_0099"])

    def test_items_have_the_shape_of_the_call_detail(self):
        [item] = self.list(limit=1).json()["items"]
        detail = self.api().get(f"{URL}/{item['operation_id']}").json()
        self.assertEqual(item, detail)
        self.assertEqual(item["agent"], "support-bot")
        self.assertEqual(item["trace_id"], f"{22 % 5:032x}")

    def test_filters(self):
        def expected(predicate) -> list[str]:
            rows = sorted(self.rows, key=lambda c: (c.created_at, c.id), reverse=True)
            return [c.operation_id for c in rows if c.agent_id == self.agent.pk and predicate(c)]

        cases = {
            "trace_id": (f"{3:032x}", lambda c: c.trace_id == f"{3:032x}"),
            "request_id": ("req-1", lambda c: c.request_id == "req-1"),
            "conversation_id": ("conv-a", lambda c: c.conversation_id == "conv-a"),
            "tool": ("lookup_order", lambda c: c.tool_name == "lookup_order"),
            "agent": ("support-bot", lambda c: True),
            "category": ("transient", lambda c: c.category == "transient"),
            "reason": ("rate_limited", lambda c: c.reason == "rate_limited"),
            "state": ("succeeded", lambda c: c.state == "succeeded"),
            "since": ("2026-06-15T09:00:05Z", lambda c: c.created_at >= T0 + timedelta(seconds=5)),
            "until": (
                "2026-06-15t11:00:02+02:00",  # RFC 3339 allows a lower-case t
                lambda c: c.created_at < T0 + timedelta(seconds=2),
            ),
        }
        for name, (value, predicate) in cases.items():
            with self.subTest(name):
                want = expected(predicate)
                self.assertTrue(0 < len(want) < len(self.rows))  # helper-bot's are never listed
                self.assertEqual(self.ids(limit=500, **{name: value}), want)
        # another agent of the project, named: none of its calls (GET /api/v1/calls/{id} is 404)
        self.assertEqual(self.ids(limit=500, agent="helper-bot"), [])
        self.assertEqual(
            self.ids(limit=500, tool="send_email", reason="rate_limited"),
            expected(lambda c: c.tool_name == "send_email" and c.reason == "rate_limited"),
        )

    def test_bad_parameters_are_400s_naming_the_field(self):
        cases = {
            "limit": ["0", "501", "ten", "-1", "٣"],
            "cursor": ["garbage", "MTIz", ""],
            "since": ["yesterday", "2026-06-15", "2026-06-15T09:00:00"],
            "until": ["1718441600", "2026-13-45T09:00:00Z", "2026-02-30T23:00:00+00:00"],
            "category": ["nope", ""],
            "reason": ["oops"],
            "state": ["done"],
            "trace_id": ["x" * 201, ""],
            "traceid": ["abc"],
        }
        for name, values in cases.items():
            for value in values:
                with self.subTest(name=name, value=value):
                    response = self.list(**{name: value})
                    self.assertEqual(response.status_code, 400, response.content)
                    body = response.json()
                    self.assertEqual(body["errors"][0]["loc"], name)
                    self.assertIn(name, body["error"])

    def test_a_key_lists_only_its_own_project(self):
        self.assertEqual(self.ids(key=self.other_key, limit=500), ["op_foreign"])
        self.assertEqual(self.ids(key=self.other_key, trace_id=f"{1:032x}"), [])
        self.assertNotIn("op_foreign", self.ids(limit=500, trace_id=f"{0:032x}"))
        self.assertEqual(self.api(self.other_key).get(f"{URL}/op_0001").status_code, 404)

    def test_without_a_key_it_is_a_401(self):
        self.assertEqual(self.client.get(URL).status_code, 401)

    def test_the_openapi_document_describes_the_parameters(self):
        from drf_spectacular.generators import SchemaGenerator

        schema = SchemaGenerator().get_schema(request=None, public=True)
        operation = schema["paths"]["/api/v1/calls"]["get"]
        names = {p["name"] for p in operation["parameters"]}
        self.assertTrue(
            {
                "cursor",
                "limit",
                "trace_id",
                "request_id",
                "conversation_id",
                "tool",
                "agent",
                "category",
                "reason",
                "state",
                "since",
                "until",
            }
            <= names
        )
        self.assertIn("/api/otlp/v1/traces", schema["paths"])


class CallsPageFiltersTests(BaseTestCase):
    """The calls page narrows with the same query set (``selectors.calls_filtered``)."""

    def test_the_page_filters_by_trace_id_and_the_detail_links_it(self):
        for n, trace in enumerate(("a" * 32, "b" * 32)):
            ToolCall.objects.create(
                project=self.project,
                agent=self.agent,
                operation_id=f"op_page_{n}",
                tool_name="lookup_order",
                state="succeeded",
                reason="ok",
                category="ok",
                route="proceed",
                trace_id=trace,
            )
        self.client.force_login(self.alice)
        page = self.client.get("/p/acme/calls/", {"trace_id": "a" * 32}).content.decode()
        self.assertIn("op_page_0", page)
        self.assertNotIn("op_page_1", page)
        detail = self.client.get("/p/acme/calls/op_page_1/").content.decode()
        self.assertIn(f"/p/acme/calls/?trace_id={'b' * 32}", detail)
