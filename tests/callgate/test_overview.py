"""The overview answers "what needs me now" (issue 15): 7-day trends per category with the
change against the week before, reasons new or rising, the oldest open review item,
approvals about to expire and the inbox lag, each linking in."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from html import unescape

from django.utils import timezone

from callgate.models import InboxEvent
from callgate.reports import overview
from callgate.reports.rollups import rollups_rebuild
from callgate.taxonomy import Reason
from tests.factories import BaseTestCase, make_call
from tests.reviews.fixtures import make_item


class OverviewTests(BaseTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        now = timezone.now()
        for day in range(14):  # steady ok traffic over two weeks
            make_call(
                project=cls.project, agent=cls.agent, created_at=now - timedelta(days=day, hours=1)
            )
        for i in range(6):  # a reason new this week
            make_call(
                project=cls.project,
                agent=cls.agent,
                reason=Reason.TYPE_MISMATCH,
                created_at=now - timedelta(days=1, minutes=i),
            )
        for i in range(2):  # rising: 1 the week before, 2 now
            make_call(
                project=cls.project,
                agent=cls.agent,
                reason=Reason.RATE_LIMITED,
                created_at=now - timedelta(hours=3 + i),
            )
        make_call(
            project=cls.project,
            agent=cls.agent,
            reason=Reason.RATE_LIMITED,
            created_at=now - timedelta(days=9),
        )
        cls.old_item = make_item(cls.project, cls.agent, age=timedelta(hours=5))
        make_item(cls.project, cls.agent, age=timedelta(minutes=5))
        cls.approval = make_item(
            cls.project, cls.agent, kind="approval", approval_in=timedelta(minutes=4)
        )
        InboxEvent.objects.create(
            project=cls.project,
            agent=cls.agent,
            event_id=uuid.uuid4(),
            body={},
            received_at=now - timedelta(seconds=90),
        )
        rollups_rebuild()

    def test_the_selectors_find_what_needs_attention(self):
        trends = {r["category"]: r for r in overview.category_trends(project=self.project)["rows"]}
        assert len(trends["argument_error"]["counts"]) in (7, 8)
        assert trends["argument_error"]["total"] == 6 and trends["argument_error"]["previous"] == 0
        rising = overview.rising_reasons(project=self.project)
        by_reason = {r["reason"]: r for r in rising}
        assert by_reason["type_mismatch"]["new"] and by_reason["type_mismatch"]["calls"] == 6
        assert not by_reason["rate_limited"]["new"] and by_reason["rate_limited"]["change"] == 1
        assert rising.index(by_reason["type_mismatch"]) < rising.index(by_reason["rate_limited"])
        assert "ok" not in by_reason
        attention = overview.attention(project=self.project)
        assert attention["oldest_review"].pk == self.old_item.pk
        assert [i.pk for i in attention["expiring"]] == [self.approval.pk]
        assert 85 <= attention["inbox_lag_seconds"] < 600 and attention["inbox_pending"] == 1

    def test_the_page_shows_and_links_each(self):
        self.client.force_login(self.alice)
        html = self.client.get("/p/acme/").content.decode()
        assert f'/p/acme/review/{self.old_item.pk}/" data-number="oldest-review"' in html
        assert f"/p/acme/review/{self.approval.pk}/" in html
        assert re.search(r'data-number="inbox-lag"><strong>(9\d|1\d\d) s</strong>', html)
        assert "Wrong argument type" in html and ">new<" in html
        assert html.count('<svg class="spark') >= 3
        # the trend links land on exactly the calls counted
        href, n = re.search(
            r'<td class="num"><a href="([^"]+reason=type_mismatch[^"]*)">(\d+)</a>', html
        ).groups()
        listed = self.client.get(unescape(href))
        assert listed.context["total"] == int(n) == 6
