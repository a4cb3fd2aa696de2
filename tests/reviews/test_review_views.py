from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from unittest import mock

import httpx
from django.urls import reverse
from django.utils import timezone

from callgate.models import Membership, ToolCall
from reviews import services
from reviews.models import ReviewItem
from tests.factories import make_user
from tests.reviews.fixtures import (
    HTMX,
    ReviewPageTestCase,
    add_reconciled,
    make_contract,
    make_item,
)


class ReviewQueuePageTests(ReviewPageTestCase):
    def test_it_lists_open_items_most_urgent_first(self):
        old_low = make_item(
            self.project,
            self.agent,
            reason="authentication_failed",
            tool="sync_crm",
            age=timedelta(hours=3),
        )
        urgent = make_item(self.project, self.agent, kind="approval")
        self.login(self.alice)
        response = self.client.get(self.queue_url())
        assert response.status_code == 200
        body = response.content.decode()
        assert body.index(f'id="item-{urgent.pk}"') < body.index(f'id="item-{old_low.pk}"')
        assert 'hx-trigger="every 5s"' in body
        assert 'data-countdown="' in body
        assert "j</kbd>/<kbd>k</kbd> move" in body

    def test_it_filters_and_counts(self):
        make_item(self.project, self.agent, reason="outcome_unknown", tool="create_follow_up")
        make_item(self.project, self.agent, reason="outcome_unknown", tool="create_follow_up")
        make_item(self.project, self.agent, reason="retry_exhausted", tool="get_weather")
        self.login(self.alice)
        response = self.client.get(self.queue_url("tool=get_weather"))
        assert response.context["matching"] == 1
        facets = dict(response.context["facets"]["tool"])
        assert facets == {
            "create_follow_up": 2,
            "get_weather": 1,
        }  # the tool facet ignores the tool filter
        assert dict(response.context["facets"]["reason"]) == {"retry_exhausted": 1}
        # the active filter's chip reads in words; the slug stays in the URL
        response = self.client.get(self.queue_url("reason=retry_exhausted"))
        assert "reason: Retries exhausted ✕" in response.content.decode()

    def test_pages_follow_queue_order_by_cursor_and_the_count_is_exact(self):
        from reviews import selectors

        items = [
            make_item(self.project, self.agent, reason="outcome_unknown", tool=f"t{i % 3}")
            for i in range(7)
        ]
        expected = sorted(items, key=lambda i: (i.priority, i.created_at, i.pk))
        self.login(self.alice)
        seen, query = [], ""
        with mock.patch.object(selectors, "PAGE_SIZE", 3):
            while True:
                page = self.client.get(self.queue_url(query)).context["page"]
                seen += page.rows
                if page.next is None:
                    break
                query = f"after={page.next}"
            assert [i.pk for i in seen] == [i.pk for i in expected]
            last = self.client.get(self.queue_url("last=1")).context["page"]
            assert [i.pk for i in last.rows] == [i.pk for i in expected[-3:]]
            back = self.client.get(self.queue_url(f"before={last.previous}")).context["page"]
            assert [i.pk for i in back.rows] == [i.pk for i in expected[1:4]]
            response = self.client.get(self.queue_url())
        assert response.context["matching"] == 7
        assert '"match-count">7</span> matching' in response.content.decode()
        # a cursor that is not ours is ignored: the first page
        assert self.client.get(self.queue_url("after=x.y")).context["page"].previous is None

    def test_it_links_similar_items(self):
        for _ in range(3):
            make_item(self.project, self.agent, reason="outcome_unknown", tool="create_follow_up")
        self.login(self.alice)
        body = self.client.get(self.queue_url()).content.decode()
        assert "2 similar" in body

    def test_it_filters_by_assignee_treating_lapsed_claims_as_unassigned(self):
        mine = make_item(self.project, self.agent)
        lapsed = make_item(self.project, self.agent)
        free = make_item(self.project, self.agent)
        services.review_item_claim(item=mine, user=self.alice)
        services.review_item_claim(item=lapsed, user=self.bob)
        ReviewItem.objects.filter(pk=lapsed.pk).update(
            lease_expires_at=lapsed.claimed_at - timedelta(seconds=1)
        )
        self.login(self.alice)
        me = self.client.get(self.queue_url("assignee=me")).context["page"].rows
        unassigned = self.client.get(self.queue_url("assignee=unassigned")).context["page"].rows
        assert [i.pk for i in me] == [mine.pk]
        assert {i.pk for i in unassigned} == {lapsed.pk, free.pk}

    def test_it_paginates(self):
        for _ in range(55):
            make_item(self.project, self.agent)
        self.login(self.alice)
        first = self.client.get(self.queue_url()).context["page"]
        response = self.client.get(self.queue_url(f"after={first.next}"))
        assert len(response.context["page"].rows) == 5
        assert "Next →" not in response.content.decode()

    def test_it_serves_the_table_fragment_marking_new_rows_and_keeping_selection(self):
        old = make_item(self.project, self.agent, age=timedelta(minutes=5))
        self.login(self.alice)
        seen = (old.created_at + timedelta(minutes=1)).isoformat()
        new = make_item(self.project, self.agent)
        response = self.client.get(
            self.queue_url(),
            {"seen": seen, "ids": [str(old.pk)]},
            HTTP_HX_TARGET="queue-table",
            **HTMX,
        )
        body = response.content.decode()
        assert "<html" not in body and 'id="queue-table"' in body
        assert f'id="item-{new.pk}" data-row data-href="{self.item_url(new)}" class="new' in body
        assert (
            f'value="{old.pk}" form="bulk" data-keep aria-label="Select item {old.pk}" checked'
            in body
        )

    def test_it_reads_a_seen_time_without_offset_as_utc_and_ignores_an_invalid_one(self):
        old = make_item(self.project, self.agent, age=timedelta(minutes=5))
        new = make_item(self.project, self.agent)
        self.login(self.alice)
        naive_utc = (old.created_at + timedelta(minutes=1)).astimezone(UTC).replace(tzinfo=None)
        for seen in (naive_utc.isoformat(), "2026-01-01T00:00:00"):
            response = self.client.get(
                self.queue_url(), {"seen": seen}, HTTP_HX_TARGET="queue-table", **HTMX
            )
            assert response.status_code == 200
        body = self.client.get(
            self.queue_url(), {"seen": naive_utc.isoformat()}, HTTP_HX_TARGET="queue-table", **HTMX
        ).content.decode()
        assert f'id="item-{new.pk}" data-row data-href="{self.item_url(new)}" class="new' in body
        assert f'id="item-{old.pk}" data-row data-href="{self.item_url(old)}" class=""' in body
        for seen in (
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00",
            "2026-01-01T25:00:00+00:00",
            "yesterday",
            "x" * 500,
        ):
            response = self.client.get(
                self.queue_url(), {"seen": seen}, HTTP_HX_TARGET="queue-table", **HTMX
            )
            assert response.status_code == 200, seen
            assert 'class="new' not in response.content.decode()
            assert self.client.get(self.queue_url(), {"seen": seen}).status_code == 200

    def test_it_colours_each_badge_by_the_category_of_the_reason_it_shows(self):
        item = make_item(self.project, self.agent, reason="not_reconcilable")
        approval = make_item(self.project, self.agent, kind="approval")
        # the call moved on (a reconciliation found nothing); the item keeps the reason it was opened for
        ToolCall.objects.filter(pk=item.call_id).update(
            reason="reconciled_absent", category="reconciliation"
        )
        ToolCall.objects.filter(pk=approval.call_id).update(category="")
        self.login(self.alice)
        body = self.client.get(self.queue_url()).content.decode()
        # the human label shows, the slug is in the tooltip
        assert (
            '<span class="badge cat-unknown_outcome" title="not_reconcilable · Unknown outcome">'
            "Outcome unknown, no look-up</span>" in body
        )
        assert (
            '<span class="badge cat-approval" title="approval_pending · Approval">'
            "Waiting for approval</span>" in body
        )
        assert "cat-reconciliation" not in body
        page = self.client.get(self.item_url(item)).content.decode()
        assert (
            'class="badge cat-reconciliation" title="reconciled_absent · Reconciliation">'
            "Reconciled: it did not happen</span>" in page
        )

    def test_it_says_when_the_queue_is_empty(self):
        self.login(self.alice)
        body = self.client.get(self.queue_url()).content.decode()
        assert "The queue is empty" in body
        assert reverse("callgate:calls", args=["acme"]) in body

    def test_it_hides_actions_from_viewers(self):
        make_item(self.project, self.agent)
        self.login(self.victor)
        body = self.client.get(self.queue_url()).content.decode()
        assert 'data-key="c"' not in body and 'id="bulk"' not in body

    def test_it_404s_for_operators_of_another_project(self):
        item = make_item(self.project, self.agent)
        self.login(self.olga)
        assert self.client.get(self.queue_url()).status_code == 404
        assert self.client.get(self.item_url(item)).status_code == 404
        assert self.client.post(self.item_url(item, "reviews:claim")).status_code == 404

    def test_it_keeps_other_projects_items_out(self):
        make_item(self.other_project, self.other_agent)
        self.login(self.alice)
        assert self.client.get(self.queue_url()).context["matching"] == 0

    def test_it_pins_the_query_count_of_the_polled_fragment(self):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        self.login(self.alice)
        totals = []
        for n in (3, 12):  # the same count whatever the number of rows
            while ReviewItem.objects.count() < n:
                k = ReviewItem.objects.count()
                item = make_item(
                    self.project,
                    self.agent,
                    tool=f"tool_{k % 3}",
                    kind=ReviewItem.Kind.APPROVAL if k % 4 == 1 else ReviewItem.Kind.ESCALATION,
                )
                if k % 4 == 2:  # a claimed row draws its holder
                    services.review_item_claim(item=item, user=self.alice)
                elif k % 4 == 3:  # a closed row draws its resolution
                    services.review_item_decide(
                        item=item, user=self.alice, decision="reject", reason="Not ours."
                    )
            with CaptureQueriesContext(connection) as queries:
                response = self.client.get(
                    self.queue_url("status=all"), HTTP_HX_TARGET="queue-table", **HTMX
                )
            assert response.content.decode().count("data-row") >= n
            ours = [
                q["sql"]
                for q in queries.captured_queries
                if 'FROM "reviews_reviewitem"' in q["sql"]
                and 'COUNT(*) AS "__count" FROM "reviews_reviewitem" WHERE' not in q["sql"]
            ]
            # the page's rows (the columns a row shows, ROW_FIELDS: a column left out would
            # cost a query per row) and the match count (one statement: the items grouped,
            # with ClosedItemCount's; the rows' "similar" counts come from it); the
            # navigation's count is the core's
            assert len(ours) == 2, ours
            totals.append(len(queries.captured_queries))
        assert totals[0] == totals[1]


class ReviewBulkViewTests(ReviewPageTestCase):
    def test_it_rejects_checked_rows(self):
        a, b, c = (make_item(self.project, self.agent) for _ in range(3))
        self.login(self.alice)
        response = self.client.post(
            reverse("reviews:bulk", args=["acme"]),
            {"action": "reject", "ids": [a.pk, b.pk], "preset": services.REJECT_PRESETS[0]},
            **HTMX,
        )
        assert response.status_code == 200
        assert "2 done" in response.content.decode()
        assert set(ReviewItem.objects.filter(status="resolved").values_list("pk", flat=True)) == {
            a.pk,
            b.pk,
        }
        assert ToolCall.objects.get(pk=a.call_id).decision_reason == services.REJECT_PRESETS[0]

    def test_it_acts_on_all_items_matching_the_filter_at_execution(self):
        weather = [
            make_item(self.project, self.agent, tool="get_weather", reason="retry_exhausted")
            for _ in range(3)
        ]
        other = make_item(self.project, self.agent, tool="create_follow_up")
        self.login(self.alice)
        late = make_item(
            self.project, self.agent, tool="get_weather", reason="retry_exhausted"
        )  # after page load
        response = self.client.post(
            reverse("reviews:bulk", args=["acme"]),
            {"action": "assign", "all_matching": "1", "tool": "get_weather", "assignee": "bob"},
        )
        assert response.status_code == 302
        assigned = set(ReviewItem.objects.filter(assignee=self.bob).values_list("pk", flat=True))
        assert assigned == {i.pk for i in weather} | {late.pk}
        assert ReviewItem.objects.get(pk=other.pk).assignee is None

    def test_it_forbids_viewers(self):
        item = make_item(self.project, self.agent)
        self.login(self.victor)
        response = self.client.post(
            reverse("reviews:bulk", args=["acme"]),
            {"action": "reject", "ids": [item.pk], "reason": "x"},
        )
        assert response.status_code == 403


class ReviewItemPageTests(ReviewPageTestCase):
    def test_it_shows_the_call(self):
        item = make_item(self.project, self.agent)
        self.login(self.alice)
        body = self.client.get(self.item_url(item)).content.decode()
        assert item.call.operation_id in body
        assert "create_follow_up v1" in body and "lint 82" in body
        assert "&quot;•••&quot;" in body and "redacted" in body and "card_number" in body
        assert "data-local" in body  # timeline in local time, UTC on hover
        assert "Approve retry needs a reconciliation that found nothing" in body
        assert 'data-key="c"' in body and 'data-key="R"' in body

    def test_it_shows_viewers_no_action_buttons_and_forbids_posts(self):
        item = make_item(self.project, self.agent)
        self.login(self.victor)
        body = self.client.get(self.item_url(item)).content.decode()
        assert 'role="toolbar"' not in body and "Claim</button>" not in body
        for name in ("reviews:claim", "reviews:reconcile", "reviews:decide", "reviews:comment"):
            assert (
                self.client.post(
                    self.item_url(item, name), {"decision": "reject", "reason": "x"}
                ).status_code
                == 403
            )

    def test_it_disables_reconcile_without_an_http_method_and_says_why(self):
        contract = make_contract(self.project, "send_invoice", reconcile="none")
        item = make_item(
            self.project,
            self.agent,
            contract=contract,
            tool="send_invoice",
            reason="not_reconcilable",
        )
        self.login(self.alice)
        body = self.client.get(self.item_url(item)).content.decode()
        assert 'data-key="r" disabled' in body
        assert "has no HTTP reconcile method" in body
        response = self.client.post(self.item_url(item, "reviews:reconcile"), **HTMX)
        assert response.status_code == 422

    def test_it_claims_and_decides_with_htmx(self):
        item = make_item(self.project, self.agent, reason="retry_exhausted")
        self.login(self.alice)
        response = self.client.post(self.item_url(item, "reviews:claim"), **HTMX)
        assert response.status_code == 200 and "Claimed" in response.content.decode()
        add_reconciled(item.call, found=False)
        response = self.client.post(
            self.item_url(item, "reviews:decide"), {"decision": "approve_retry"}, **HTMX
        )
        assert response.status_code == 200
        assert "Retry approved" in response.content.decode()
        assert ToolCall.objects.get(pk=item.call_id).decision == "approve_retry"

    def test_it_answers_409_with_the_current_state_when_someone_else_decided(self):
        item = make_item(self.project, self.agent)
        self.login(self.alice)
        services.review_item_decide(
            item=item, user=self.bob, decision="mark_failed", reason="Target is down for good."
        )
        response = self.client.post(
            self.item_url(item, "reviews:decide"), {"decision": "reject", "reason": "No."}, **HTMX
        )
        assert response.status_code == 409
        body = response.content.decode()
        assert "bob already decided this item (mark_failed)" in body
        assert 'id="item"' in body and "Resolved" in body

    def test_it_opens_the_inline_reason_form(self):
        item = make_item(self.project, self.agent)
        self.login(self.alice)
        body = self.client.get(
            self.item_url(item) + "?confirm=reject", HTTP_HX_TARGET="item", **HTMX
        ).content.decode()
        assert 'class="confirm' in body and 'name="reason" autofocus' in body
        assert "confirm(" not in body

    def test_it_records_an_override_in_red(self):
        item = make_item(self.project, self.agent)
        self.login(self.alice)
        response = self.client.post(
            self.item_url(item, "reviews:decide"),
            {"decision": "approve_retry", "override": "on", "reason": "Checked: absent."},
            **HTMX,
        )
        assert response.status_code == 200
        assert 'class="audit-override"' in response.content.decode()

    def test_it_reconciles_now_and_shows_progress_then_the_result(self):
        item = make_item(self.project, self.agent)
        self.login(self.alice)
        with self.captureOnCommitCallbacks(execute=False) as enqueued:
            response = self.client.post(self.item_url(item, "reviews:reconcile"), **HTMX)
        assert response.status_code == 200
        assert 'hx-trigger="every 1s"' in response.content.decode()
        status_url = self.item_url(item, "reviews:reconcile-status") + "?polling=1"
        pending = self.client.get(status_url, **HTMX)
        assert (
            "Looking the operation up" in pending.content.decode() and "HX-Trigger" not in pending
        )
        # the worker runs callgate.tasks.reconcile_call; the target answers 404
        target = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
        with mock.patch("callgate.reconcile.make_client", return_value=target):
            for callback in enqueued:
                callback()
        done = self.client.get(status_url, **HTMX)
        assert "no trace of this operation" in done.content.decode()
        assert done["HX-Trigger"] == "reconciled"
        assert services.approve_retry_guard(ToolCall.objects.get(pk=item.call_id)) == ""

    def test_it_says_when_a_reconciliation_could_not_tell(self):
        item = make_item(self.project, self.agent)
        self.login(self.alice)
        target = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(401)))
        with (
            mock.patch("callgate.reconcile.make_client", return_value=target),
            self.captureOnCommitCallbacks(execute=True),
        ):
            self.client.post(self.item_url(item, "reviews:reconcile"), **HTMX)
        body = self.client.get(
            self.item_url(item, "reviews:reconcile-status"), **HTMX
        ).content.decode()
        assert "could not tell" in body
        assert services.approve_retry_guard(ToolCall.objects.get(pk=item.call_id))

    def test_it_comments(self):
        item = make_item(self.project, self.agent)
        self.login(self.bob)
        response = self.client.post(
            self.item_url(item, "reviews:comment"), {"text": "Calling the customer."}, **HTMX
        )
        assert "Calling the customer." in response.content.decode()

    def test_it_exports_the_audit_trail_as_csv(self):
        item = make_item(self.project, self.agent)
        services.review_item_claim(item=item, user=self.alice)
        services.review_item_decide(
            item=item, user=self.alice, decision="reject", reason="=HYPERLINK(1)"
        )
        self.login(self.maria)
        response = self.client.get(self.item_url(item, "reviews:audit-csv"))
        rows = list(csv.reader(io.StringIO(response.content.decode())))
        assert rows[0][:5] == ["When (UTC)", "Who", "What", "Item before", "Item after"]
        # labels, never codes; the time carries the year (ISO 8601, UTC)
        assert [r[2] for r in rows[1:]] == ["Opened", "Claimed", "Rejected"]
        assert rows[-1][1] == "alice" and rows[-1][3:5] == ["Claimed", "Resolved"]
        assert datetime.fromisoformat(rows[-1][0]).utcoffset() == timedelta(0)
        assert rows[-1][7] == "'=HYPERLINK(1)"

    def test_it_guards_every_text_column_of_the_csv_against_formulas(self):
        item = make_item(self.project, self.agent)
        for name in ("=cmd", "+mallory", "-trudy", "@eve"):
            user = make_user(name)
            Membership.objects.create(
                user=user, project=self.project, role=Membership.Role.OPERATOR
            )
            services.review_item_comment(item=item, user=user, text="-1+2")
        self.login(self.maria)
        rows = list(
            csv.reader(
                io.StringIO(
                    self.client.get(self.item_url(item, "reviews:audit-csv")).content.decode()
                )
            )
        )
        assert [r[1] for r in rows[2:]] == ["'=cmd", "'+mallory", "'-trudy", "'@eve"]
        assert {r[7] for r in rows[2:]} == {"'-1+2"}
        assert all(not cell.startswith(("=", "+", "-", "@")) for r in rows[1:] for cell in r)

    def test_it_acts_from_a_queue_row(self):
        item = make_item(self.project, self.agent, kind="approval")
        services.review_item_claim(item=item, user=self.alice)
        self.login(self.alice)
        response = self.client.post(
            self.item_url(item, "reviews:decide"), {"decision": "approve", "from": "queue"}, **HTMX
        )
        body = response.content.decode()
        assert response.status_code == 200 and body.lstrip().startswith("<tr")
        assert "Approved" in body

    def test_it_approves_an_approval_from_the_queue_only_once_claimed_by_me(self):
        item = make_item(self.project, self.agent, kind="approval")
        self.login(self.alice)
        row = f'id="item-{item.pk}"'
        body = self.client.get(self.queue_url()).content.decode()
        button = body[body.index(row) :].split('data-key="a"', 1)[1].split(">", 1)[0]
        # `a` is not a dead key: the button stays pressable and the answer says why not
        assert "disabled" not in button and "Claim it first" in button
        decide = self.item_url(item, "reviews:decide")
        response = self.client.post(decide, {"decision": "approve", "from": "queue"}, **HTMX)
        assert response.status_code == 422 and "Claim it first" in response.content.decode()
        services.review_item_claim(item=ReviewItem.objects.get(pk=item.pk), user=self.bob)
        response = self.client.post(
            decide, {"decision": "approve", "from": "queue"}, **HTMX
        )  # bob's claim
        assert response.status_code == 422
        assert ToolCall.objects.get(pk=item.call_id).state == "pending_approval"
        assert ReviewItem.objects.get(pk=item.pk).status == "claimed"

        services.review_item_release(item=ReviewItem.objects.get(pk=item.pk), user=self.bob)
        response = self.client.post(self.item_url(item, "reviews:claim"), {"from": "queue"}, **HTMX)
        button = response.content.decode().split('data-key="a"', 1)[1].split(">", 1)[0]
        assert "disabled" not in button
        response = self.client.post(decide, {"decision": "approve", "from": "queue"}, **HTMX)
        assert response.status_code == 200 and "Approved" in response.content.decode()
        # the item page approves without a claim: the operator sees the arguments there
        other = make_item(self.project, self.agent, kind="approval")
        assert (
            self.client.post(
                self.item_url(other, "reviews:decide"), {"decision": "approve"}, **HTMX
            ).status_code
            == 200
        )


class QueueFacetsAgreeTests(ReviewPageTestCase):
    """Every facet count and the match count (``QueueCounts``: open items grouped, closed
    ones from ``ClosedItemCount`` with the young ones' ages corrected) equal the number of
    items the queue lists when that value is picked with the other filters kept."""

    def test_each_facet_count_is_what_clicking_it_lists(self):
        import itertools
        import random

        from callgate.models import Agent
        from callgate.reports import tallies
        from reviews import selectors

        rng = random.Random(5)
        other = Agent.objects.create(project=self.project, name="second-bot")
        now = timezone.now()
        for _ in range(40):
            item = make_item(
                self.project,
                rng.choice([self.agent, other]),
                reason=rng.choice(["outcome_unknown", "retry_exhausted", "conflict"]),
                tool=rng.choice(["create_follow_up", "get_weather", "issue_refund"]),
                age=timedelta(minutes=rng.choice([1, 30, 90, 60 * 30])),
            )
            status = rng.choice(["open", "claimed", "claimed", "resolved", "settled"])
            if status == "claimed":
                mine = rng.random() < 0.5
                lapsed = rng.random() < 0.3
                ReviewItem.objects.filter(pk=item.pk).update(
                    status="claimed",
                    assignee=self.alice if mine else self.bob,
                    lease_expires_at=now + timedelta(minutes=-5 if lapsed else 10),
                )
            elif status != "open":
                ReviewItem.objects.filter(pk=item.pk).update(status=status, resolved_at=now)
        # closed above by UPDATE, not through a writer that counts them: recount the tallies
        tallies.review_rollups_rebuild(project_id=self.project.pk)
        choices = {
            "tool": ["", "get_weather"],
            "reason": ["", "conflict"],
            "agent": ["", other.name],
            "age": ["", "1h"],
            "assignee": ["anyone", "me", "unassigned"],
            "status": ["open", "claimed", "resolved", "settled", "all"],
        }
        names = list(choices)
        every = {
            "tool": ["create_follow_up", "get_weather", "issue_refund"],
            "reason": ["outcome_unknown", "retry_exhausted", "conflict"],
            "agent": [self.agent.name, other.name],
        }
        for values in itertools.product(*(choices[n] for n in names)):
            filters = selectors.QueueFilters(**dict(zip(names, values, strict=True)))
            counts = selectors.QueueCounts.read(
                project=self.project, filters=filters, user=self.alice, now=now
            )
            facets = counts.facets()

            def listed(filters=filters, **change) -> int:
                f = selectors.QueueFilters(**{**filters.as_dict(), **change})
                return selectors.queue_items(
                    project=self.project, filters=f, user=self.alice, now=now
                ).count()

            assert counts.matching == listed(), filters
            for name in ("tool", "reason", "agent"):
                for value in every[name]:
                    # every value that lists items has its count, and only those
                    assert dict(facets[name]).get(value, 0) == listed(**{name: value}), (
                        filters,
                        name,
                        value,
                    )
            for value, n in facets["status"]:
                assert n == listed(status=value), (filters, "status", value)
            for value, n in facets["assignee"]:
                assert n == listed(assignee=value), (filters, "assignee", value)
            for value, n in facets["age"]:
                assert n == listed(age=value), (filters, "age", value)
