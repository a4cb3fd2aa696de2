"""The core app's browser pages: calls list and detail, contracts, agents."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta
from unittest import mock

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from callgate import metrics, selectors
from callgate.models import AgentTool, ApiKey, CallEvent, Membership, ToolCall, ToolContract
from callgate.reports import rollups
from callgate.taxonomy import TABLE, Reason
from tests.factories import BaseTestCase, make_event, make_review_item, make_user


def make_contract(project, name="create_follow_up", version=1, **fields) -> ToolContract:
    defaults = {
        "parameters": {"type": "object", "properties": {"ticket_id": {"type": "string"}}},
        "digest": uuid.uuid4().hex,
        "effect": "write",
        "max_attempts": 3,
    }
    return ToolContract.objects.create(
        project=project, name=name, version=version, **{**defaults, **fields}
    )


def make_call(agent, *, reason="ok", minutes_ago=0, contract=None, **fields) -> ToolCall:
    category, route = TABLE[Reason(reason)]
    created = timezone.now() - timedelta(minutes=minutes_ago)
    values = {
        "operation_id": uuid.uuid4().hex,
        "tool_name": contract.name if contract else "get_weather",
        "state": "succeeded",
        "reason": reason,
        "category": category.value,
        "route": route.value,
        "created_at": created,
        "updated_at": created,
        "attempts": 1,
        "contract": contract,
        "arguments": {"city": "Paris"},
    }
    values.update(fields)
    return ToolCall.objects.create(project=agent.project, agent=agent, **values)


class CallsListTests(BaseTestCase):
    def setUp(self):
        self.client.force_login(self.alice)
        self.url = reverse("callgate:calls", args=["acme"])

    def rows(self, response) -> list[str]:
        return [call.operation_id for call in response.context["page"].rows]

    def test_it_lists_the_projects_calls_newest_first(self):
        old = make_call(self.agent, minutes_ago=30, operation_id="op-old")
        new = make_call(self.agent, minutes_ago=1, operation_id="op-new")
        make_call(self.other_agent, operation_id="op-globex")
        response = self.client.get(self.url)
        assert response.status_code == 200
        assert self.rows(response) == [new.operation_id, old.operation_id]
        assert b"op-globex" not in response.content
        assert b'class="badge cat-ok"' in response.content
        assert b"data-relative" in response.content

    def test_it_filters_by_each_parameter(self):
        contract = make_contract(self.project)
        target = make_call(
            self.agent, reason="outcome_unknown", contract=contract, state="reconciling"
        )
        make_call(self.agent, reason="ok")
        make_call(self.agent, reason="retry_exhausted", state="in_review")
        other_agent = self.project.agents.create(name="travel-bot")
        make_call(other_agent, reason="outcome_unknown", state="reconciling")
        cases = {
            f"reason=outcome_unknown&agent={self.agent.pk}": [target],
            "category=unknown_outcome&tool=create_follow_up": [target],
            f"route=reconcile&agent={self.agent.pk}": [target],
            "state=reconciling&tool=create_follow_up": [target],
        }
        for query, expected in cases.items():
            response = self.client.get(f"{self.url}?{query}")
            assert self.rows(response) == [c.operation_id for c in expected], query

    def test_it_filters_by_time_range_and_presets(self):
        recent = make_call(self.agent, minutes_ago=0)
        yesterday = make_call(self.agent, minutes_ago=60 * 30)
        make_call(self.agent, minutes_ago=60 * 24 * 40)
        assert self.rows(self.client.get(self.url + "?since=1h")) == [recent.operation_id]
        assert self.rows(self.client.get(self.url + "?since=7d")) == [
            recent.operation_id,
            yesterday.operation_id,
        ]
        since = (timezone.now() - timedelta(hours=48)).isoformat()
        until = (timezone.now() - timedelta(hours=1)).isoformat()
        response = self.client.get(self.url, {"since": since, "until": until})
        assert self.rows(response) == [yesterday.operation_id]

    def test_its_last_hour_is_the_past_60_minutes_just_after_the_hour(self):
        # at 2 minutes past a UTC hour: a call from 30 minutes ago (the previous hour) is in
        # "the last hour", one from 61 minutes ago is not
        frozen = metrics.hour_floor(timezone.now()) + timedelta(minutes=2)
        with mock.patch("django.utils.timezone.now", return_value=frozen):
            half_hour = make_call(self.agent, minutes_ago=30)
            make_call(self.agent, minutes_ago=61)
            response = self.client.get(self.url + "?since=1h")
        assert self.rows(response) == [half_hour.operation_id]
        assert response.context["filters"].since == frozen - timedelta(hours=1)
        counts = {c["value"]: c["n"] for c in response.context["category_counts"]}
        assert counts.get("ok") == 1

    def test_it_accepts_an_unescaped_plus_in_an_offset(self):
        call = make_call(self.agent, minutes_ago=10)
        since = (timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S+00:00")
        response = self.client.get(f"{self.url}?since={since}")  # '+' arrives as a space
        assert self.rows(response) == [call.operation_id]
        assert response.context["errors"] == []

    def test_it_searches_by_operation_id_prefix(self):
        make_call(self.agent, operation_id="3f9c2e11aa")
        make_call(self.agent, operation_id="77a1000000")
        response = self.client.get(self.url + "?q=3f9c")
        assert self.rows(response) == ["3f9c2e11aa"]

    def test_it_ignores_unknown_filter_values_and_says_so(self):
        make_call(self.agent)
        response = self.client.get(self.url + "?reason=nonsense&agent=abc&since=yesterday")
        assert len(self.rows(response)) == 1
        assert len(response.context["errors"]) == 3
        assert b"Unknown reason" in response.content

    def test_it_counts_calls_per_category_ignoring_the_category_filter(self):
        for _ in range(3):
            make_call(self.agent, reason="rate_limited")
        make_call(self.agent, reason="unknown_tool")
        rollups.rollups_rebuild(project_id=self.project.pk)  # what the counts read
        make_call(self.other_agent, reason="rate_limited")  # another project's
        with CaptureQueriesContext(connection) as queries:
            response = self.client.get(self.url + "?category=transient")
        counts = {c["value"]: c["n"] for c in response.context["category_counts"]}
        assert counts == {"transient": 3, "hallucination": 1}
        assert response.context["total"] == 3
        assert not [q for q in queries if "COUNT(" in q["sql"] and "callgate_toolcall" in q["sql"]]

    def test_counts_over_filters_the_rollups_lack_stop_at_the_cap(self):
        for _ in range(4):
            make_call(self.agent, reason="rate_limited", state=ToolCall.State.RETRY_WAIT)
        make_call(self.agent, reason="unknown_tool", state=ToolCall.State.REJECTED)
        response = self.client.get(self.url + "?state=retry_wait")
        assert {c["value"]: c["n"] for c in response.context["category_counts"]} == {"transient": 4}
        assert not response.context["capped"]
        with mock.patch.object(selectors, "COUNT_CAP", 2):
            response = self.client.get(self.url + "?state=retry_wait")
        assert response.context["capped"] and response.context["total"] == 3
        assert "3+</span> matching" in response.content.decode()

    def test_it_offers_a_one_click_clear_for_each_filter(self):
        make_call(self.agent, reason="rate_limited")
        response = self.client.get(self.url + "?reason=rate_limited&tool=get_weather")
        chips = {chip["name"]: chip["clear_query"] for chip in response.context["chips"]}
        assert chips == {"reason": "tool=get_weather", "tool": "reason=rate_limited"}
        assert b'href="/p/acme/calls/?tool=get_weather"' in response.content
        # a chip reads in words; the slug stays in the URL
        values = {chip["name"]: chip["value"] for chip in response.context["chips"]}
        assert values["reason"] == "Rate limited"

    def test_it_paginates_with_cursors(self):
        calls = [make_call(self.agent, minutes_ago=i) for i in range(120)]
        first = self.client.get(self.url)
        assert self.rows(first) == [c.operation_id for c in calls[:50]]
        page = first.context["page"]
        assert page.newer is None and page.older
        second = self.client.get(self.url, {"before": page.older})
        assert self.rows(second) == [c.operation_id for c in calls[50:100]]
        third = self.client.get(self.url, {"before": second.context["page"].older})
        assert self.rows(third) == [c.operation_id for c in calls[100:]]
        assert third.context["page"].older is None
        back = self.client.get(self.url, {"after": third.context["page"].newer})
        assert self.rows(back) == [c.operation_id for c in calls[50:100]]
        assert b'hx-trigger="every 5s"' not in second.content  # only the newest page polls

    def test_it_treats_a_garbled_cursor_as_the_first_page(self):
        call = make_call(self.agent)
        response = self.client.get(self.url, {"before": "not-a-cursor"})
        assert response.status_code == 200
        assert self.rows(response) == [call.operation_id]

    def test_it_keeps_ties_in_created_at_apart(self):
        now = timezone.now()
        calls = [make_call(self.agent, created_at=now) for _ in range(55)]
        first = self.client.get(self.url)
        second = self.client.get(self.url, {"before": first.context["page"].older})
        seen = self.rows(first) + self.rows(second)
        assert sorted(seen) == sorted(c.operation_id for c in calls)

    def test_it_uses_the_same_number_of_queries_for_many_rows(self):
        contract = make_contract(self.project)
        make_call(self.agent, contract=contract)

        def count() -> int:
            with CaptureQueriesContext(connection) as ctx:
                assert self.client.get(self.url).status_code == 200
            return len(ctx.captured_queries)

        few = count()
        for i in range(60):
            make_call(self.agent, contract=contract, reason="rate_limited" if i % 2 else "ok")
        with self.assertNumQueries(few):
            self.client.get(self.url)
        with self.assertNumQueries(few):
            self.client.get(self.url + "?reason=rate_limited&since=24h")

    def test_it_pins_the_query_count(self):
        for _ in range(60):
            make_call(self.agent)
        # session, user, membership, calls page, category counts, agents, tools, the
        # user's saved views, navigation: projects, the open review count and the firing
        # alerts nobody handles
        with self.assertNumQueries(11):
            self.client.get(self.url)
        # the htmx poll: session, user, membership, calls page (the navigation's counts
        # are lazy and fragments do not render them)
        with self.assertNumQueries(4):
            self.client.get(self.url, HTTP_HX_REQUEST="true")

    def test_it_returns_only_the_rows_to_htmx(self):
        old = make_call(self.agent, minutes_ago=5)
        new = make_call(self.agent)
        response = self.client.get(
            self.url, {"reason": "ok", "seen": old.pk}, HTTP_HX_REQUEST="true"
        )
        body = response.content.decode()
        assert body.lstrip().startswith('<tbody id="call-rows"')
        assert "<form" not in body and "<html" not in body
        assert f'id="call-{new.pk}" data-row' in body
        assert (
            f'<tr id="call-{new.pk}" data-row data-href="/p/acme/calls/{new.operation_id}/" class="new"'
            in body
        )
        assert (
            f'<tr id="call-{old.pk}" data-row data-href="/p/acme/calls/{old.operation_id}/">'
            in body
        )
        assert 'hx-get="/p/acme/calls/?reason=ok"' in body
        assert f'"seen": "{new.pk}"' in body
        assert "HX-Request" in response["Vary"]

    def test_its_row_links_match_reverse_for_any_operation_id(self):
        # the detail path is reversed once per page (PathOf) and each ID quoted into it
        awkward = [
            "req-1/get_weather/abc",
            "op with spaces",
            "op?x=1#frag",
            "op%41",
            "opérätion/ü",
            "op&<b>\"'",
            "~:@!$&'()*+,;=",
        ]
        for operation_id in awkward:
            make_call(self.agent, operation_id=operation_id)
        response = self.client.get(self.url)
        links = {row.call.operation_id: row.url for row in response.context["rows"]}
        for operation_id in awkward:
            expected = reverse("callgate:call_detail", args=["acme", operation_id])
            assert links[operation_id] == expected, operation_id
            detail = self.client.get(expected)
            assert detail.status_code == 200, operation_id
            assert detail.context["call"].operation_id == operation_id
        # drawn escaped, in the link, the tooltip and the copy button alike
        body = response.content.decode()
        assert "op&amp;&lt;b&gt;&quot;&#x27;" in body and "op&<b>" not in body

    def test_it_renders_the_full_page_for_boosted_requests(self):
        response = self.client.get(self.url, HTTP_HX_REQUEST="true", HTTP_HX_BOOSTED="true")
        assert b"<form" in response.content

    def test_it_shows_attempts_against_the_contract(self):
        make_call(self.agent, contract=make_contract(self.project), attempts=2)
        assert b'<td class="num">2/3</td>' in self.client.get(self.url).content

    def test_it_is_404_for_non_members(self):
        self.client.force_login(self.olga)
        assert self.client.get(self.url).status_code == 404

    def test_it_says_when_nothing_matches(self):
        response = self.client.get(self.url + "?reason=conflict")
        assert b"No calls match these filters." in response.content


class CallDetailTests(BaseTestCase):
    def setUp(self):
        self.client.force_login(self.victor)
        self.contract = make_contract(
            self.project,
            lint_score=42,
            lint_findings=[{"path": "properties.ticket_id", "message": "has no description"}],
        )
        self.call = make_call(
            self.agent,
            reason="outcome_unknown",
            contract=self.contract,
            state="in_review",
            arguments={"ticket_id": "T-1042", "card": "•••"},
            observation="It may have been created.",
            receipt={"task_id": "F-1"},
        )

    def url(self, operation_id=None, project="acme"):
        return reverse(
            "callgate:call_detail", args=[project, operation_id or self.call.operation_id]
        )

    def test_it_shows_arguments_with_redactions_labelled(self):
        body = self.client.get(self.url()).content.decode()
        assert "&quot;T-1042&quot;" in body
        assert 'class="redacted"' in body and ">redacted</span>" in body
        assert "It may have been created." in body
        assert "&quot;F-1&quot;" in body

    def test_it_shows_the_contract_with_lint_findings(self):
        body = self.client.get(self.url()).content.decode()
        assert "create_follow_up v1" in body
        assert "lint 42" in body
        assert "has no description" in body

    def test_it_shows_backticked_names_in_lint_messages_as_code(self):
        self.contract.lint_findings = [
            {"path": "note", "message": "`note` has no <b>description</b>"}
        ]
        self.contract.save(update_fields=["lint_findings"])
        body = self.client.get(self.url()).content.decode()
        assert "<code>note</code> has no &lt;b&gt;description&lt;/b&gt;" in body

    def test_it_shows_the_timeline_in_received_order(self):
        t0 = timezone.now()
        for kind, seconds, body in [
            ("attempt", 5, {"attempt": 1, "sent": True, "outcome": "timeout"}),
            ("proposed", 0, {"format": "anthropic"}),
        ]:
            CallEvent.objects.create(
                project=self.project,
                call=self.call,
                kind=kind,
                body=body,
                occurred_at=t0,
                received_at=t0 + timedelta(seconds=seconds),
                reason="outcome_unknown" if kind == "attempt" else "",
            )
        response = self.client.get(self.url())
        assert [e.kind for e in response.context["events"]] == ["proposed", "attempt"]
        body = response.content.decode()
        # sentences for people, not the body's codes
        assert "Attempt 1 timed out after it was sent" in body
        assert "Proposed in Anthropic format" in body
        assert "(anthropic)" not in body and "· timeout" not in body
        assert "data-local" in body

    def test_it_links_the_open_review_item_when_there_is_one(self):
        item = make_review_item(self.call, kind="escalation", reason="outcome_unknown")
        response = self.client.get(self.url())
        assert response.context["review_item"] == item
        assert f'href="/p/acme/review/{item.pk}/"'.encode() in response.content

    def test_it_shows_no_review_link_once_the_item_is_resolved(self):
        make_review_item(
            self.call,
            kind="escalation",
            reason="outcome_unknown",
            status="resolved",
        )
        response = self.client.get(self.url())
        assert response.context["review_item"] is None
        assert b"Open review item" not in response.content

    def test_it_is_404_for_another_projects_call(self):
        foreign = make_call(self.other_agent)
        assert self.client.get(self.url(foreign.operation_id)).status_code == 404
        self.client.force_login(self.olga)
        assert self.client.get(self.url()).status_code == 404
        assert self.client.get(self.url(project="globex")).status_code == 404

    def test_it_serves_operation_ids_with_slashes(self):
        call = make_call(self.agent, operation_id="req-1/get_weather/abc")
        assert self.client.get(self.url(call.operation_id)).status_code == 200


class ContractsPageTests(BaseTestCase):
    def setUp(self):
        self.client.force_login(self.victor)

    def test_it_lists_the_latest_version_with_error_rates(self):
        make_contract(self.project, version=1, lint_score=40)
        v2 = make_contract(
            self.project, version=2, lint_score=90, idempotent=True, reconcile_method="http"
        )
        make_call(self.agent, contract=v2, reason="missing_required")
        make_call(self.agent, contract=v2, reason="unknown_argument")
        make_call(self.agent, contract=v2, reason="ok")
        make_call(self.agent, contract=v2, reason="ok")
        make_contract(self.other_project, name="globex_tool")
        rollups.rollups_rebuild(project_id=self.project.pk)  # the counts read the rollups
        response = self.client.get(reverse("callgate:contracts", args=["acme"]))
        [row] = response.context["rows"]
        assert row["contract"] == v2 and row["versions"] == 2
        assert (row["calls"], row["argument_errors"], row["hallucinations"]) == (4, 1, 1)
        body = response.content.decode()
        assert "50.0 %" in body and "HTTP look-up" in body and "globex_tool" not in body

    def test_it_shows_every_version_with_findings_and_changes(self):
        make_contract(
            self.project,
            version=1,
            lint_findings=[{"path": "properties.ticket_id", "message": "has no description"}],
        )
        make_contract(
            self.project,
            version=2,
            parameters={
                "type": "object",
                "properties": {
                    "ticket_id": {"type": "string", "description": "Ticket"},
                    "due_at": {"type": "string"},
                },
            },
        )
        response = self.client.get(
            reverse("callgate:contract_detail", args=["acme", "create_follow_up"])
        )
        body = response.content.decode()
        assert "v2" in body and "v1" in body
        assert "has no description" in body
        assert "added due_at" in body
        assert "&quot;description&quot;" in body

    def test_it_is_404_for_an_unknown_or_foreign_contract(self):
        make_contract(self.other_project, name="globex_tool")
        assert (
            self.client.get(
                reverse("callgate:contract_detail", args=["acme", "globex_tool"])
            ).status_code
            == 404
        )
        assert (
            self.client.get(reverse("callgate:contract_detail", args=["acme", "nope"])).status_code
            == 404
        )


class AgentsPageTests(BaseTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        cls.ada = make_user("ada")
        Membership.objects.create(user=cls.ada, project=cls.project, role=Membership.Role.ADMIN)

    def setUp(self):
        self.url = reverse("callgate:agents", args=["acme"])

    def test_it_lists_agents_with_keys_tools_and_recent_calls(self):
        AgentTool.objects.create(agent=self.agent, name="get_weather")
        make_call(self.agent)
        make_call(self.agent, minutes_ago=60 * 30)
        rollups.rollups_rebuild(project_id=self.project.pk)  # the page reads the rollups
        self.client.force_login(self.victor)
        response = self.client.get(self.url)
        body = response.content.decode()
        key = ApiKey.objects.get(agent=self.agent)
        assert f"cg_{key.prefix}_…{key.last4}" in body
        assert "get_weather" in body
        assert "1 call in 24 h" in body
        assert "globex-bot" not in body
        assert "Create key" not in body and "Revoke" not in body

    def test_it_lists_events_the_rules_refused_with_the_reason(self):
        orphan = make_event("attempt", operation_id="op_never_seen", sent=True, outcome="success")
        assert self.api().post("/api/v1/events", orphan, format="json").status_code == 200
        hidden = make_event("attempt", operation_id="op_globex_only", sent=True, outcome="success")
        assert (
            self.api(self.other_key).post("/api/v1/events", hidden, format="json").status_code
            == 200
        )
        self.client.force_login(self.victor)
        body = self.client.get(self.url).content.decode()
        assert orphan["event_id"] in body and "op_never_seen" in body
        assert "no call with operation_id" in body
        assert hidden["event_id"] not in body and "op_globex_only" not in body

    def test_it_shows_a_new_key_once_and_stores_only_its_digest(self):
        self.client.force_login(self.ada)
        response = self.client.post(
            reverse("callgate:agent_key_create", args=["acme", self.agent.pk]), {"name": "ci"}
        )
        assert response.status_code == 200
        plain = response.context["issued"].plain
        assert plain.encode() in response.content
        assert response["Cache-Control"] == "no-store"
        row = ApiKey.objects.get(agent=self.agent, name="ci")
        assert row.digest == hashlib.sha256(plain.encode()).hexdigest()
        assert plain not in str(ApiKey.objects.filter(pk=row.pk).values().first())
        again = self.client.get(self.url)
        assert plain.encode() not in again.content
        assert f"cg_{row.prefix}_…{row.last4}".encode() in again.content

    def test_it_revokes_a_key_after_typed_confirmation(self):
        self.client.force_login(self.ada)
        key = ApiKey.objects.get(agent=self.agent)
        url = reverse("callgate:agent_key_revoke", args=["acme", key.pk])
        response = self.client.post(url, {"confirm": "wrong"})
        assert response.status_code == 400
        assert b"was not revoked" in response.content
        key.refresh_from_db()
        assert key.revoked_at is None
        response = self.client.post(url, {"confirm": key.prefix})
        assert response.status_code == 302
        key.refresh_from_db()
        assert key.revoked_at is not None
        assert self.api().get("/api/v1/calls/whatever").status_code == 401

    def test_it_forbids_key_changes_to_non_admins(self):
        key = ApiKey.objects.get(agent=self.agent)
        for user in (self.maria, self.alice, self.victor):
            self.client.force_login(user)
            assert (
                self.client.post(
                    reverse("callgate:agent_key_create", args=["acme", self.agent.pk])
                ).status_code
                == 403
            )
            assert (
                self.client.post(
                    reverse("callgate:agent_key_revoke", args=["acme", key.pk]),
                    {"confirm": key.prefix},
                ).status_code
                == 403
            )
        assert ApiKey.objects.filter(agent=self.agent).count() == 1
        key.refresh_from_db()
        assert key.revoked_at is None

    def test_it_is_404_for_another_projects_agent_or_key(self):
        self.client.force_login(self.ada)
        other_key = ApiKey.objects.get(agent=self.other_agent)
        assert (
            self.client.post(
                reverse("callgate:agent_key_create", args=["acme", self.other_agent.pk])
            ).status_code
            == 404
        )
        assert (
            self.client.post(
                reverse("callgate:agent_key_revoke", args=["acme", other_key.pk]),
                {"confirm": other_key.prefix},
            ).status_code
            == 404
        )

    def test_it_shows_the_admin_buttons_to_admins(self):
        self.client.force_login(self.ada)
        body = self.client.get(self.url).content.decode()
        assert "Create key" in body and "Revoke…" in body
        assert "confirm()" not in body
