"""Every filter and sort of the calls list and the review queue has an index to use: the
plans of their queries, with sequential scans disabled (``enable_seqscan = off``: a plan
that still holds one found no index), never scan the calls or review-item tables whole."""

from __future__ import annotations

from datetime import timedelta
from unittest import skipUnless

from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from callgate import selectors
from callgate.models import Agent, ToolCall
from callgate.selectors import CallFilters, Cursor
from demo.seeding import seed_scale
from reviews import selectors as queue
from reviews.models import ReviewItem

SEQ_SCANNED = ("Seq Scan on callgate_toolcall", "Seq Scan on reviews_reviewitem")


@skipUnless(connection.vendor == "postgresql", "PostgreSQL query plans")
class QueryPlanTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.project = seed_scale(slug="plans", calls=400).project
        cls.agent = Agent.objects.filter(project=cls.project).first()
        cls.call = ToolCall.objects.filter(project=cls.project).first()
        cls.user = queue.operators(project=cls.project).first()

    def plans_of(self, run) -> list[tuple[str, str]]:
        with CaptureQueriesContext(connection) as queries:
            run()
        out = []
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            for query in queries.captured_queries:
                sql = query["sql"]
                if not sql.startswith("SELECT"):
                    continue
                cursor.execute("EXPLAIN " + sql)
                out.append((sql, "\n".join(line for (line,) in cursor.fetchall())))
            cursor.execute("SET LOCAL enable_seqscan = on")
        return out

    def assert_indexed(self, run) -> None:
        plans = self.plans_of(run)
        assert plans
        for sql, plan in plans:
            assert not any(s in plan for s in SEQ_SCANNED), f"{sql}\n{plan}"

    def test_the_calls_list_has_an_index_for_every_filter(self):
        now = timezone.now()
        cases = [
            CallFilters(),
            CallFilters(reason="ok"),
            CallFilters(category="hallucination"),
            CallFilters(route="review"),
            CallFilters(tool="issue_refund"),
            CallFilters(agent=self.agent.pk),
            CallFilters(state="in_review"),
            CallFilters(since=now - timedelta(hours=24)),
            CallFilters(since=now - timedelta(days=7), until=now - timedelta(days=1)),
            CallFilters(q=self.call.operation_id[:6]),
            CallFilters(tool="search_orders", state="succeeded", reason="ok"),
        ]
        cursor = Cursor(created_at=self.call.created_at, id=self.call.pk)
        for filters in cases:
            with self.subTest(filters=filters):
                self.assert_indexed(
                    lambda f=filters: selectors.calls_page(project=self.project, filters=f)
                )
                self.assert_indexed(
                    lambda f=filters: selectors.calls_page(
                        project=self.project, filters=f, before=cursor
                    )
                )
                self.assert_indexed(
                    lambda f=filters: selectors.calls_category_counts(
                        project=self.project, filters=f
                    )
                )

    def test_the_call_detail_and_the_agents_and_contracts_pages_read_no_calls_whole(self):
        self.assert_indexed(
            lambda: selectors.call_for_detail(
                project=self.project, operation_id=self.call.operation_id
            )
        )
        self.assert_indexed(lambda: selectors.agents_with_keys(project=self.project))
        self.assert_indexed(lambda: selectors.contracts_latest(project=self.project))

    def test_the_review_queue_has_an_index_for_every_status_and_its_pages(self):
        item = ReviewItem.objects.filter(project=self.project).first()
        for status in queue.STATUS_CHOICES:
            filters = queue.QueueFilters(status=status)
            with self.subTest(status=status):
                for kwargs in ({}, {"last": True}, {"after": queue.QueueCursor.of(item)}):
                    self.assert_indexed(
                        lambda f=filters, k=kwargs: queue.queue_page(
                            project=self.project, filters=f, user=self.user, **k
                        )
                    )
