"""Words for people, codes for machines (shared/UI.md, issue 15): what the pages say about a
call's events, its reason, its review item and the item's audit trail reads as sentences,
and no page shows a stored code (a reason, category, route, state, decision or event slug)
as text; the slugs stay in tooltips, the CSV and the API."""

from __future__ import annotations

import re
from datetime import timedelta
from html.parser import HTMLParser

from django.utils import timezone

from callgate import labels
from callgate.escalation import review_audit
from callgate.models import CallEvent, ToolCall
from callgate.templatetags.callgate_tags import event_summary
from reviews import services
from reviews.models import ReviewItem
from tests.factories import make_call
from tests.reviews.fixtures import ReviewPageTestCase, add_reconciled, make_item

#: every stored code of more than one word: none of them may be read on a page
SLUGS = {
    slug
    for kind in ("reason", "category", "route", "state", "decision", "event", "format", "outcome")
    for slug in labels.TABLES[kind]
    if "_" in slug
}


class _Text(HTMLParser):
    """The text a person reads: no attributes (tooltips keep the slugs), no scripts, and
    none of the data shown verbatim (JSON in <pre>, code spans, operation IDs)."""

    SKIP = {"script", "style", "pre", "code", "template", "kbd"}

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.skipping: list[str] = []

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if tag in self.SKIP or {"op", "mono", "op-full"} & set(classes):
            self.skipping.append(tag)
        elif self.skipping and tag == self.skipping[-1]:
            self.skipping.append(tag)

    def handle_endtag(self, tag):
        if self.skipping and tag == self.skipping[-1]:
            self.skipping.pop()

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def visible_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return " ".join(" ".join(parser.parts).split())


def raw_codes(html: str) -> set[str]:
    text = visible_text(html)
    return {slug for slug in SLUGS if re.search(rf"(?<![\w-]){slug}(?![\w-])", text)}


def event(kind: str, **body) -> CallEvent:
    return CallEvent(kind=kind, body=body)


class EventSummaryTests(ReviewPageTestCase):
    def test_each_kind_of_event_reads_as_a_sentence(self):
        assert event_summary(event("proposed", format="openai")) == "Proposed in OpenAI format"
        assert event_summary(event("proposed", format="mcp")) == "Proposed in MCP format"
        assert event_summary(event("proposed")) == "Proposed"
        assert event_summary(event("attempt", attempt=1, outcome="success", sent=True)) == (
            "Attempt 1 succeeded"
        )
        assert event_summary(
            event("attempt", attempt=2, outcome="timeout", sent=True, http_status=504)
        ) == ("Attempt 2 timed out after it was sent · HTTP 504")
        assert event_summary(event("attempt", attempt=1, outcome="error", sent=False)) == (
            "Attempt 1 failed before it was sent"
        )
        assert event_summary(event("attempt", attempt=1, outcome="connection_reset")) == (
            "Attempt 1 lost its connection (sent or not: unknown)"
        )
        assert event_summary(event("reconciled", found=False)) == (
            "Reconciled: not found in the target"
        )
        assert event_summary(event("reconciled", found=None, detail={"detail": "502"})) == (
            "Reconciled: the look-up could not tell (502)"
        )
        assert event_summary(event("decision", decision="approve_retry", reason="checked")) == (
            "Decision: Approved retry (“checked”)"
        )
        assert event_summary(event("approval_expired")) == "Approval timed out"


class CallPageWordingTests(ReviewPageTestCase):
    def setUp(self):
        self.login(self.alice)

    def test_the_call_page_reads_without_codes_or_doubled_labels(self):
        call = make_call(
            project=self.project,
            agent=self.agent,
            created_at=timezone.now(),
            reason="ok",
            provider_format="openai_responses",
        )
        now = timezone.now()
        for kind, body in (
            ("proposed", {"format": "openai_responses"}),
            ("attempt", {"attempt": 1, "outcome": "success", "sent": True}),
        ):
            CallEvent.objects.create(
                project=self.project,
                call=call,
                kind=kind,
                body=body,
                occurred_at=now,
                received_at=now,
                state_before="" if kind == "proposed" else "allowed",
                state_after="allowed" if kind == "proposed" else "succeeded",
            )
        html = self.client.get(f"/p/acme/calls/{call.operation_id}/").content.decode()
        text = visible_text(html)
        assert "Proposed in OpenAI Responses format" in text
        assert "Attempt 1 succeeded" in text
        assert "Format OpenAI Responses" in text
        assert "OK (OK)" not in text and "category OK" not in text
        assert not raw_codes(html)

    def test_a_category_that_says_more_than_the_reason_is_shown_once(self):
        call = make_call(
            project=self.project,
            agent=self.agent,
            created_at=timezone.now(),
            reason="reference_not_found",
            state=ToolCall.State.FAILED,
        )
        text = visible_text(self.client.get(f"/p/acme/calls/{call.operation_id}/").content.decode())
        assert "Reference not found · category Hallucination" in text


class ItemPageWordingTests(ReviewPageTestCase):
    def setUp(self):
        self.login(self.alice)

    def test_the_audit_trail_says_who_opened_the_item_in_words(self):
        item = make_item(self.project, self.agent)
        add_reconciled(item.call, found=False)
        services.review_item_claim(item=item, user=self.alice)
        html = self.client.get(f"/p/acme/review/{item.pk}/").content.decode()
        text = visible_text(html)
        assert "Review item opened by callgate: Outcome unknown" in text
        assert "new item, Open" in text
        assert "Open → Claimed" in text
        assert "· →" not in text and "route " not in text
        assert "Reconciled: not found in the target" in text
        assert not raw_codes(html)

    def test_a_settled_item_says_what_settled_it_once(self):
        item = make_item(self.project, self.agent)
        review_audit(
            item=item,
            action="settled",
            before="open",
            after="settled",
            reason="settled by a later event: reconciled_applied",
        )
        text = visible_text(self.client.get(f"/p/acme/review/{item.pk}/").content.decode())
        assert "Review item settled by a later event by callgate: Reconciled: it happened" in text
        assert "event: settled by a later event" not in text.lower()
        assert "Open → Settled by a later event" in text

    def test_an_approval_item_page_has_no_codes(self):
        item = make_item(self.project, self.agent, kind=ReviewItem.Kind.APPROVAL)
        html = self.client.get(f"/p/acme/review/{item.pk}/").content.decode()
        text = visible_text(html)
        assert re.search(r"(Urgent|High|Normal|Low) priority", text)
        assert not re.search(r"priority \d", text)
        assert not raw_codes(html)


class PagesSweepTests(ReviewPageTestCase):
    """Every page a person reads, with calls of many reasons and items of every kind."""

    def test_no_page_shows_a_stored_code(self):
        self.login(self.maria)
        now = timezone.now()
        reasons = ["outcome_unknown", "retry_exhausted", "reconciled_absent", "approval_pending"]
        calls = [
            make_call(
                project=self.project,
                agent=self.agent,
                created_at=now - timedelta(minutes=i),
                reason=r,
                state=ToolCall.State.IN_REVIEW,
            )
            for i, r in enumerate(
                reasons + ["ok", "duplicate_suppressed", "not_found_or_forbidden"]
            )
        ]
        items = [make_item(self.project, self.agent, reason=r) for r in reasons[:3]]
        services.review_item_claim(item=items[0], user=self.alice)
        items.append(make_item(self.project, self.agent, kind=ReviewItem.Kind.APPROVAL))
        pages = [
            "/p/acme/",
            "/p/acme/calls/",
            "/p/acme/review/",
            "/p/acme/review/?status=all",
            "/p/acme/agents/",
            "/p/acme/contracts/",
            "/p/acme/reports/",
            "/p/acme/reports/reasons/",
            "/p/acme/reports/reliability/",
            "/p/acme/reports/review/",
            "/p/acme/alerts/",
            "/p/acme/alerts/history/",
        ]
        pages += [f"/p/acme/calls/{c.operation_id}/" for c in calls]
        pages += [f"/p/acme/review/{i.pk}/" for i in items]
        for path in pages:
            response = self.client.get(path)
            assert response.status_code == 200, path
            assert not raw_codes(response.content.decode()), (
                path,
                raw_codes(response.content.decode()),
            )
