"""Every filter and sort of the calls list and the review queue has an index to use: the
plans of their queries, with sequential scans disabled (``enable_seqscan = off``: a plan
that still holds one found no index), never scan the calls or review-item tables whole.

The reports, the overview and the queue's facets and bulk selection are held to more: no
sequential scan of any table that grows with the calls (calls, events, rollups, cubes,
review items, audit rows, inbox), and every index scan of one has an index condition (an
index read whole costs what every tenant's rows cost)."""

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
from tests.factories import review_item

SEQ_SCANNED = ("Seq Scan on callgate_toolcall", "Seq Scan on reviews_reviewitem")
#: Tables whose rows grow with the calls (of every tenant).
GROWING = (
    "callgate_toolcall",
    "callgate_callevent",
    "callgate_callrollup",
    "callgate_rollupcube",
    "callgate_inboxevent",
    "reviews_reviewitem",
    "reviews_reviewaudit",
)


def unbounded_scans(plan: str) -> list[str]:
    """The scan nodes of ``plan`` (EXPLAIN text) that read a growing table whole: a
    sequential scan, or an index scan without an index condition."""
    lines = plan.splitlines()
    bad = []
    for i, line in enumerate(lines):
        node = line.strip().removeprefix("-> ").strip()
        table = next((t for t in GROWING if f" on {t}" in node), None)
        if table is None or "Scan" not in node:
            continue
        if node.startswith(("Seq Scan", "Parallel Seq Scan")):
            bad.append(node)
            continue
        if "Bitmap Heap Scan" in node:
            continue  # its Bitmap Index Scan children carry the condition
        details = []
        for nxt in lines[i + 1 :]:
            if nxt.strip().startswith("->"):
                break
            details.append(nxt.strip())
        if not any(d.startswith("Index Cond:") for d in details):
            bad.append(node)
    for i, line in enumerate(lines):  # bitmap index scans: the index named must have a cond
        node = line.strip().removeprefix("-> ").strip()
        if node.startswith("Bitmap Index Scan"):
            details = []
            for nxt in lines[i + 1 :]:
                if nxt.strip().startswith("->"):
                    break
                details.append(nxt.strip())
            if not any(d.startswith("Index Cond:") for d in details):
                bad.append(node)
    return bad


@skipUnless(connection.vendor == "postgresql", "PostgreSQL query plans")
class QueryPlanTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.project = seed_scale(slug="plans", calls=400).project
        cls.agent = Agent.objects.filter(project=cls.project).first()
        cls.call = ToolCall.objects.filter(project=cls.project).first()
        cls.user = queue.operators(project=cls.project).first()
        cls.crowd_other_tenant()

    @classmethod
    def crowd_other_tenant(cls, n: int = 3000) -> None:
        """Another tenant with many open review items and calls: an index of every tenant's
        rows (the one-open-item-per-call index, say) stops looking as cheap as one that
        starts with the project, as it does at scale."""
        import uuid

        from callgate.models import Project

        other = Project.objects.create(name="crowd", slug="crowd")
        agent = Agent.objects.create(project=other, name="crowd-bot")
        now = timezone.now()
        calls = ToolCall.objects.bulk_create(
            [
                ToolCall(
                    project=other,
                    agent=agent,
                    operation_id=str(uuid.uuid4()),
                    tool_name="issue_refund",
                    state=ToolCall.State.IN_REVIEW,
                    reason="outcome_unknown",
                    created_at=now - timedelta(minutes=i),
                    updated_at=now,
                )
                for i in range(n)
            ]
        )
        ReviewItem.objects.bulk_create(
            [
                review_item(call, reason="outcome_unknown", created_at=call.created_at)
                for call in calls
            ]
        )

    def plans_of(self, run) -> list[tuple[str, str]]:
        with CaptureQueriesContext(connection) as queries:
            run()
        out = []
        with connection.cursor() as cursor:
            # statistics of this data (earlier tests' rows, committed and flushed, can leave
            # the planner believing the tables empty, where any index looks as cheap)
            cursor.execute(f"ANALYZE {', '.join(GROWING)}")
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

    def assert_bounded(self, run) -> None:
        """No query of ``run`` reads a growing table whole (``unbounded_scans``)."""
        plans = self.plans_of(run)
        assert plans
        for sql, plan in plans:
            assert not unbounded_scans(plan), f"{sql}\n{plan}"

    def test_the_reports_and_the_overview_read_bounded_ranges_of_this_project(self):
        from callgate.reports import overview
        from callgate.reports import selectors as reports

        agent = str(self.agent.pk)
        month_ago = (timezone.now() - timedelta(days=30)).strftime("%Y-%m-%dT%H:00:00Z")
        for params in (
            {"since": month_ago},
            {},
            {"tool": "issue_refund"},
            {"agent": agent},
            {"tool": "issue_refund", "agent": agent},
            {"granularity": "hour"},
        ):
            f = reports.report_filters_parse(params, project=self.project)
            for name in (
                "report_categories",
                "report_reasons",
                "report_tools",
                "report_agents",
                "report_routes",
                "report_duplicates",
                "report_retries",
                "report_unknown_outcomes",
                "report_contracts",
                "report_review",
            ):
                with self.subTest(report=name, params=params):
                    self.assert_bounded(
                        lambda n=name, f=f: getattr(reports, n)(project=self.project, f=f)
                    )
        self.assert_bounded(lambda: overview.project_overview(project=self.project))
        self.assert_bounded(lambda: overview.category_trends(project=self.project))
        self.assert_bounded(lambda: overview.rising_reasons(project=self.project))
        self.assert_bounded(lambda: overview.attention(project=self.project))
        self.assert_bounded(lambda: selectors.agents_with_keys(project=self.project))
        self.assert_bounded(lambda: selectors.contracts_latest(project=self.project))
        self.assert_bounded(
            lambda: selectors.calls_category_counts(project=self.project, filters=CallFilters())
        )

    def test_the_queue_facets_read_no_calls(self):
        for filters in (
            queue.QueueFilters(),
            queue.QueueFilters(status="all"),
            queue.QueueFilters(tool="issue_refund"),
            queue.QueueFilters(agent=self.agent.name, status="resolved"),
        ):
            with self.subTest(filters=filters):
                plans = self.plans_of(
                    lambda f=filters: queue.QueueCounts.read(
                        project=self.project, filters=f, user=self.user
                    ).facets()
                )
                for sql, plan in plans:
                    assert "callgate_toolcall" not in sql, sql
                    assert not unbounded_scans(plan), f"{sql}\n{plan}"

    def test_the_search_reads_the_id_and_error_text_indexes(self):
        """Free text is an OR of the ID columns and the error text: each branch has its
        index (the trigram GIN index ``toolcall_observation_trgm`` of the upper-cased error
        text, migration 0024), so PostgreSQL answers with a BitmapOr over them, not by
        reading the project's calls (the search's count reads the same)."""
        import uuid

        now = timezone.now()
        ToolCall.objects.bulk_create(  # a project whose calls far outnumber the matches
            ToolCall(
                project=self.project,
                agent=self.agent,
                operation_id=str(uuid.uuid4()),
                tool_name="search_orders",
                state=ToolCall.State.FAILED,
                reason="unavailable",
                observation=f"HTTP 503 from the target, try {i} later",
                created_at=now - timedelta(seconds=i),
                updated_at=now,
            )
            for i in range(60_000)
        )
        for query in ('"timed out"', self.call.operation_id, "rate -tool:issue_refund"):
            with self.subTest(query=query):
                filters = CallFilters(search=selectors.search_parse(query))
                plans = self.plans_of(
                    lambda f=filters: selectors.calls_filtered(
                        project=self.project, filters=f
                    ).count()
                )
                for sql, plan in plans:
                    assert not unbounded_scans(plan), f"{sql}\n{plan}"
                    assert "toolcall_observation_trgm" in plan, f"{sql}\n{plan}"
                    assert "BitmapOr" in plan, f"{sql}\n{plan}"
        filters = CallFilters(search=selectors.search_parse("conversation:conv-1"))
        self.assert_bounded(lambda: selectors.calls_page(project=self.project, filters=filters))
        for query in ('"timed out" is:claimed', "tool:issue_refund -assignee:me"):
            with self.subTest(queue=query):
                found = queue.QueueFilters.from_query({"q": query})
                self.assert_bounded(
                    lambda f=found: queue.queue_page(
                        project=self.project, filters=f, user=self.user
                    )
                )

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
            CallFilters(operation=self.call.operation_id[:6]),
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

    def test_the_engine_finds_calls_by_the_operation_id_they_were_proposed_under(self):
        """``ingest._calls_locked`` also matches the ID an operator's edit renamed a call
        from: through the partial index, never a scan of the project's calls."""
        from callgate import ingest

        ToolCall.objects.filter(pk=self.call.pk).update(
            proposed_operation_id="op-proposed", operation_id="op-edited"
        )
        wanted = ["op-proposed", "op-unknown"]
        params = [wanted, self.project.pk, wanted, self.project.pk, ["r"], ["c"], self.project.pk]
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {', '.join(GROWING)}")
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + ingest._CALLS_LOCKED, params)
            plan = "\n".join(line for (line,) in cursor.fetchall())
            cursor.execute("SET LOCAL enable_seqscan = on")
        assert "toolcall_proposed_operation" in plan, plan
        assert not unbounded_scans(plan), plan
        found = ingest._calls_locked(self.project, set(wanted), set())
        assert [c.pk for c in found] == [self.call.pk]

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

    def test_a_queue_page_filtered_by_tool_reason_or_agent_reads_that_filters_index(self):
        item = ReviewItem.objects.filter(project=self.project, status="open").first()
        assert item is not None and item.agent is not None
        for name, filters in (
            ("tool", queue.QueueFilters(tool=item.tool_name)),
            ("reason", queue.QueueFilters(reason=item.reason)),
            ("agent", queue.QueueFilters(agent=item.agent.name)),
        ):
            with self.subTest(filter=name):
                [(sql, plan)] = self.plans_of(
                    lambda f=filters: list(
                        queue.queue_items(project=self.project, filters=f, user=self.user)[:51]
                    )
                )
                # the index hands the rows over in queue order: no sort of every match
                assert f"reviewitem_open_{name}" in plan, f"{sql}\n{plan}"
                assert "Sort" not in plan.split(f"reviewitem_open_{name}")[0], plan
