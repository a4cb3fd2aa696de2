"""Tenancy: nothing of project B (globex) is visible to or changeable by project A (acme).

Browser pages are found through the URL resolver, so every page added under
``/p/<project>/`` later is covered without touching this file. API tests speak the wire
format of ``/api/v1/`` (see the preamble / DESIGN.md)."""

from __future__ import annotations

import re

from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from callgate.models import ApiKey, CallEvent, Membership, ToolCall, ToolContract
from reviews.models import ReviewItem
from tests.factories import BaseTestCase, make_event, make_review_item, make_user

PROJECT_PREFIX = "p/<slug:project>/"
_PARAM = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>\w+)>")
#: a string that only project B's data contains; it must never reach project A
B_MARKER = "globex-confidential-7f3a"


def project_routes() -> list[tuple[str, dict[str, str], str]]:
    """Every URL pattern under ``p/<slug:project>/``: (route, {kwarg: converter}, name).

    Walks the root resolver, joining nested ``include()`` routes. Regex routes are
    reported with the kwargs of their named groups (converter ``"re"``)."""
    found = []

    def walk(patterns, prefix: str, namespace: str) -> None:
        for entry in patterns:
            route = prefix + str(entry.pattern)
            if isinstance(entry, URLResolver):
                ns = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
                walk(entry.url_patterns, route, ns)
            elif isinstance(entry, URLPattern) and route.startswith(PROJECT_PREFIX):
                params = {m["name"]: m["converter"] or "str" for m in _PARAM.finditer(route)}
                params.update(
                    {name: "re" for name in entry.pattern.regex.groupindex if name not in params}
                )
                found.append((route, params, f"{namespace}{entry.name or entry.lookup_str}"))

    walk(get_resolver().url_patterns, "", "")
    return found


def fill(route: str, values: dict[str, str]) -> str:
    """``/``-rooted path for ``route`` with each ``<conv:name>`` replaced from ``values``."""
    return "/" + _PARAM.sub(lambda m: str(values[m["name"]]), route)


class TenancyFixtureMixin:
    """Project B owns a call (with an event and an open review item) and a contract."""

    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        cls.admin_a = make_user("ada")
        Membership.objects.create(user=cls.admin_a, project=cls.project, role=Membership.Role.ADMIN)
        now = timezone.now()
        cls.b_contract = ToolContract.objects.create(
            project=cls.other_project,
            name="refund_order",
            version=1,
            parameters={"type": "object"},
            effect=ToolContract.Effect.WRITE,
            description=B_MARKER,
            digest="0" * 64,
        )
        cls.b_call = ToolCall.objects.create(
            project=cls.other_project,
            agent=cls.other_agent,
            operation_id="op-globex-1",
            tool_name="refund_order",
            contract=cls.b_contract,
            arguments={"order_id": B_MARKER},
            state=ToolCall.State.IN_REVIEW,
            reason="timeout_unknown",
            category="unknown_outcome",
            route="review",
            observation=B_MARKER,
            attempts=1,
            request_id="req-globex-1",
            call_id="call_b1",
            created_at=now,
            updated_at=now,
        )
        cls.b_event = CallEvent.objects.create(
            project=cls.other_project,
            call=cls.b_call,
            kind=CallEvent.Kind.ATTEMPT,
            body={"outcome": "timeout", "note": B_MARKER},
            occurred_at=now,
        )
        cls.b_key = ApiKey.objects.get(agent=cls.other_agent)
        cls.b_item = make_review_item(
            cls.b_call,
            kind=ReviewItem.Kind.ESCALATION,
            reason="timeout_unknown",
        )

    def b_object_values(self) -> dict[str, object]:
        """Values of project B's objects for any URL kwarg name we may meet."""
        return {
            "project": self.other_project.slug,
            "operation_id": self.b_call.operation_id,
            "op": self.b_call.operation_id,
            "call": self.b_call.pk,
            "call_id": self.b_call.pk,
            "pk": self.b_call.pk,
            "id": self.b_call.pk,
            "item": self.b_item.pk,
            "item_id": self.b_item.pk,
            "review_item": self.b_item.pk,
            "event": self.b_event.pk,
            "event_id": self.b_event.event_id,
            "contract": self.b_contract.pk,
            "name": self.b_contract.name,
            "tool": self.b_contract.name,
            "version": self.b_contract.version,
            "agent": self.other_agent.pk,
            "agent_id": self.other_agent.pk,
            "key": self.b_key.pk,
            "key_id": self.b_key.pk,
            "api_key": self.b_key.pk,
        }

    def value_for(self, name: str, converter: str) -> object:
        """B's object value for the kwarg ``name`` (falls back on the call's pk / op ID)."""
        values = self.b_object_values()
        if name in values:
            return values[name]
        return self.b_call.pk if converter == "int" else self.b_call.operation_id


class ProjectPageTenancyTests(TenancyFixtureMixin, BaseTestCase):
    def project_only_routes(self) -> list[tuple[str, str]]:
        routes = [
            (route, name) for route, params, name in project_routes() if list(params) == ["project"]
        ]
        assert len(routes) >= 2, f"expected the overview and review queue at least, found {routes}"
        return routes

    def request_page(self, path: str):
        """GET the page; a page that only takes POST (405 on GET) is POSTed instead."""
        response = self.client.get(path)
        if response.status_code == 405:
            response = self.client.post(path, {})
        return response

    def test_it_finds_the_known_project_pages(self):
        names = {name for _, name in self.project_only_routes()}
        assert {"callgate:overview", "reviews:queue"} <= names

    def test_it_serves_every_project_page_to_its_own_members(self):
        # the control for the 404s below: the pages exist and answer for project A
        self.client.force_login(self.admin_a)
        for route, name in self.project_only_routes():
            response = self.request_page(fill(route, {"project": self.project.slug}))
            assert response.status_code not in (404, 500), (name, response.status_code)

    def test_it_answers_404_for_every_page_of_another_project(self):
        for user in (self.alice, self.victor, self.maria, self.admin_a):
            self.client.force_login(user)
            for route, name in self.project_only_routes():
                response = self.request_page(fill(route, {"project": self.other_project.slug}))
                assert response.status_code == 404, (user.username, name, response.status_code)
                assert B_MARKER.encode() not in response.content
                assert self.other_project.name.encode() not in response.content

    def test_it_answers_the_same_for_an_unknown_project_as_for_a_foreign_one(self):
        self.client.force_login(self.alice)
        for route, name in self.project_only_routes():
            foreign = self.request_page(fill(route, {"project": self.other_project.slug}))
            unknown = self.request_page(fill(route, {"project": "no-such-project"}))
            assert foreign.status_code == unknown.status_code == 404, name

    def test_it_sends_anonymous_visitors_to_the_login_page(self):
        for route, name in self.project_only_routes():
            response = self.client.get(fill(route, {"project": self.project.slug}))
            if response.status_code == 405:
                response = self.client.post(fill(route, {"project": self.project.slug}), {})
            assert response.status_code == 302, name
            assert response["Location"].startswith("/login/"), name

    def test_it_does_not_list_another_project_in_the_switcher(self):
        self.client.force_login(self.alice)
        response = self.client.get(f"/p/{self.project.slug}/")
        assert response.status_code == 200
        assert f"/p/{self.other_project.slug}/".encode() not in response.content


class ProjectObjectTenancyTests(TenancyFixtureMixin, BaseTestCase):
    """Pages that name an object (``/p/<project>/calls/<op>/`` …): B's objects are 404
    through B's URL and do not leak through A's URL either."""

    def object_routes(self):
        return [
            (route, params, name)
            for route, params, name in project_routes()
            if list(params) != ["project"]
        ]

    def test_it_hides_another_projects_objects(self):
        for user in (self.alice, self.maria, self.admin_a):
            self.client.force_login(user)
            for route, params, name in self.object_routes():
                values = {p: self.value_for(p, conv) for p, conv in params.items()}
                for project in (self.other_project, self.project):
                    path = fill(route, {**values, "project": project.slug})
                    response = self.client.get(path)
                    if response.status_code == 405:
                        response = self.client.post(path, {})
                    if project == self.other_project:
                        assert response.status_code == 404, (
                            user.username,
                            name,
                            path,
                            response.status_code,
                        )
                    else:
                        assert response.status_code < 500, (
                            user.username,
                            name,
                            path,
                            response.status_code,
                        )
                    assert B_MARKER.encode() not in response.content, (user.username, name, path)

    def test_it_does_not_change_another_projects_objects(self):
        self.client.force_login(self.admin_a)
        for route, params, _name in self.object_routes():
            values = {p: self.value_for(p, conv) for p, conv in params.items()}
            for project in (self.other_project, self.project):
                path = fill(route, {**values, "project": project.slug})
                self.client.post(
                    path,
                    {
                        "decision": "approve_retry",
                        "resolution": "approve_retry",
                        "reason": "tenancy test",
                        "note": "tenancy test",
                    },
                )
        self.b_item.refresh_from_db()
        self.b_call.refresh_from_db()
        assert self.b_item.status == ReviewItem.Status.OPEN
        assert self.b_item.assignee_id is None
        assert self.b_call.state == ToolCall.State.IN_REVIEW
        assert self.b_call.decision == ""
        self.b_key.refresh_from_db()
        assert self.b_key.revoked_at is None
        assert ApiKey.objects.filter(project=self.other_project).count() == 1  # none issued by A
        assert (
            ApiKey.objects.filter(project=self.project, agent__project=self.other_project).count()
            == 0
        )


class ApiTenancyTests(TenancyFixtureMixin, BaseTestCase):
    """A key of project A can neither read nor write project B's objects."""

    def b_call_snapshot(self) -> tuple:
        call = ToolCall.objects.get(pk=self.b_call.pk)
        return (
            call.state,
            call.attempts,
            call.reason,
            call.receipt,
            call.updated_at,
            CallEvent.objects.filter(call=call).count(),
        )

    def test_it_reads_a_call_of_its_own_project(self):
        a_call = ToolCall.objects.create(
            project=self.project,
            agent=self.agent,
            operation_id="op-acme-1",
            tool_name="lookup_order",
            state=ToolCall.State.SUCCEEDED,
            category="ok",
            route="proceed",
        )
        response = self.api().get(f"/api/v1/calls/{a_call.operation_id}")
        assert response.status_code == 200, response.content
        assert response.json()["operation_id"] == "op-acme-1"

    def test_it_answers_404_for_a_call_of_another_project(self):
        response = self.api().get(f"/api/v1/calls/{self.b_call.operation_id}")
        assert response.status_code == 404
        assert response.json()["error"]
        assert B_MARKER not in response.content.decode()

    def test_it_answers_404_for_a_call_of_the_other_direction(self):
        a_call = ToolCall.objects.create(
            project=self.project,
            agent=self.agent,
            operation_id="op-acme-2",
            tool_name="lookup_order",
            state=ToolCall.State.SUCCEEDED,
        )
        response = self.api(self.other_key).get(f"/api/v1/calls/{a_call.operation_id}")
        assert response.status_code == 404

    def test_it_does_not_write_to_another_projects_call_through_events(self):
        before = self.b_call_snapshot()
        events = [
            make_event(
                "attempt",
                operation_id=self.b_call.operation_id,
                tool_name="refund_order",
                sent=True,
                outcome="success",
                http_status=200,
                result={"refund_id": "r1"},
            ),
            make_event(
                "receipt", operation_id=self.b_call.operation_id, receipt={"refund_id": "r1"}
            ),
            make_event(
                "decision",
                operation_id=self.b_call.operation_id,
                decision="approve_retry",
                reason="tenancy test",
            ),
        ]
        response = self.api().post("/api/v1/events", events, format="json")
        assert response.status_code in (200, 207, 400, 404), response.content
        assert self.b_call_snapshot() == before
        assert B_MARKER not in response.content.decode()
        # whatever A's key created, it belongs to A
        assert (
            not CallEvent.objects.filter(project=self.other_project)
            .exclude(pk=self.b_event.pk)
            .exists()
        )

    def test_it_does_not_write_to_another_projects_call_through_the_gate(self):
        before = self.b_call_snapshot()
        response = self.api().post(
            "/api/v1/calls",
            {
                "format": "plain",
                "operation_id": self.b_call.operation_id,
                "call": {"tool": "refund_order", "arguments": {"order_id": "A-1"}},
            },
            format="json",
        )
        assert response.status_code < 500, response.content
        assert self.b_call_snapshot() == before
        assert B_MARKER not in response.content.decode()

    def test_it_does_not_change_another_projects_contract(self):
        response = self.api().put(
            "/api/v1/tools/refund_order",
            {
                "description": "Refund an order (project A's contract).",
                "effect": "write",
                "idempotent": True,
                "reconcilable": False,
                "max_attempts": 2,
                "max_reasks": 1,
                "parameters": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string", "description": "The order."}},
                    "required": ["order_id"],
                },
            },
            format="json",
        )
        assert response.status_code in (200, 201), response.content
        assert response.json()["version"] == 1  # A's first version, B's history is separate
        b_contracts = list(
            ToolContract.objects.filter(project=self.other_project).values_list("pk", "description")
        )
        assert b_contracts == [(self.b_contract.pk, B_MARKER)]
        assert ToolContract.objects.filter(project=self.project, name="refund_order").count() == 1
