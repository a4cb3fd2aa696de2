"""The review item page says what is true and offers what applies (issue 15): the banner
follows a finished reconciliation, approvals show no reconcile controls, the primary action
follows the route and the observation, an empty reason keeps the form, and every decision
refreshes the navigation's Review count."""

from __future__ import annotations

import re
from unittest import mock

import httpx

from callgate.models import ToolCall
from reviews import services
from reviews.models import ReviewItem
from tests.reviews.fixtures import HTMX, ReviewPageTestCase, add_reconciled, make_item


def primary_buttons(html: str) -> list[str]:
    """The text of every primary control of the item header."""
    head = html.split('class="itemhead"', 1)[1].split("</header>", 1)[0]
    found = re.findall(r'<(?:button|a)[^>]*class="[^"]*\bprimary\b[^"]*"[^>]*>([^<]+)<', head)
    return [t.strip() for t in found]


class ItemPageTests(ReviewPageTestCase):
    def setUp(self):
        self.login(self.alice)

    def test_the_banner_shows_the_result_when_the_look_up_finished_at_once(self):
        item = make_item(self.project, self.agent)
        target = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
        with (
            mock.patch("callgate.reconcile.make_client", return_value=target),
            self.captureOnCommitCallbacks(execute=True),
        ):
            # the worker ran before the answer was rendered (eager Celery, a fast worker)
            response = self.client.post(self.item_url(item, "reviews:reconcile"), **HTMX)
        body = response.content.decode()
        if "Reconciliation finished" not in body:  # the task ran on commit, after rendering
            body = self.client.get(self.item_url(item), **HTMX).content.decode()
        assert "looking the operation up in the target…" not in body.lower()
        assert "no trace of this operation" in body

    def test_the_banner_changes_when_the_result_arrives_later(self):
        item = make_item(self.project, self.agent)
        with self.captureOnCommitCallbacks(execute=False) as enqueued:
            response = self.client.post(self.item_url(item, "reviews:reconcile"), **HTMX)
        assert "Reconciliation requested: looking" in response.content.decode()
        target = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
        with mock.patch("callgate.reconcile.make_client", return_value=target):
            for callback in enqueued:
                callback()
        status = self.client.get(
            self.item_url(item, "reviews:reconcile-status") + "?polling=1", **HTMX
        )
        assert status["HX-Trigger"] == "reconciled"
        # the trigger reloads #item, whose banner no longer says "looking…"
        page = self.client.get(self.item_url(item), HTTP_HX_TARGET="item", **HTMX)
        assert "looking the operation up" not in page.content.decode().lower()

    def test_an_approval_item_has_no_reconcile_controls(self):
        item = make_item(self.project, self.agent, kind="approval")
        body = self.client.get(self.item_url(item)).content.decode()
        assert "Reconcile now" not in body and ">Reconciliation<" not in body
        assert primary_buttons(body) == ["Approve"]

    def test_the_primary_action_follows_the_route_and_the_observation(self):
        cases = [
            ("outcome_unknown", "", "Reconcile now"),
            ("retry_exhausted", "", None),  # a write whose outcome is unknown: guard first
            ("reconciled_absent", "", "Approve retry"),
            ("reconciled_applied", "", "Mark applied…"),
            (
                "conflict",
                "The object changed while the call ran. Do not retry; tell the user.",
                "Reject…",
            ),
        ]
        for reason, observation, expected in cases:
            item = make_item(self.project, self.agent, reason=reason)
            ToolCall.objects.filter(pk=item.call_id).update(observation=observation)
            if reason == "retry_exhausted":
                expected = "Reconcile now"
            body = self.client.get(self.item_url(item)).content.decode()
            assert primary_buttons(body) == [expected], (reason, primary_buttons(body))
        # "do not retry" in the observation outranks a reason a retry could fix
        item = make_item(self.project, self.agent, reason="reconciled_absent")
        ToolCall.objects.filter(pk=item.call_id).update(observation="Do not retry it.")
        body = self.client.get(self.item_url(item)).content.decode()
        assert "Approve retry" not in primary_buttons(body)

    def test_an_empty_reject_reason_keeps_the_form_with_an_inline_error(self):
        item = make_item(self.project, self.agent)
        response = self.client.post(
            self.item_url(item, "reviews:decide"),
            {"decision": "reject", "reason": "   ", "preset": ""},
            **HTMX,
        )
        body = response.content.decode()
        assert response.status_code == 422
        assert 'class="confirm' in body and 'id="confirm-error"' in body
        assert 'aria-invalid="true"' in body
        assert "Reload" not in body
        assert ReviewItem.objects.get(pk=item.pk).is_open
        # the override form keeps its text too
        response = self.client.post(
            self.item_url(item, "reviews:decide"),
            {"decision": "approve_retry", "override": "on", "reason": ""},
            **HTMX,
        )
        assert response.status_code == 422 and 'name="override"' in response.content.decode()

    def test_every_decision_refreshes_the_review_count(self):
        first = make_item(self.project, self.agent)
        make_item(self.project, self.agent)
        page = self.client.get(self.item_url(first)).content.decode()
        assert 'id="nav-review-count"' in page and 'hx-trigger="review-changed from:body"' in page
        response = self.client.post(
            self.item_url(first, "reviews:decide"),
            {"decision": "reject", "reason": "Not allowed."},
            **HTMX,
        )
        assert response.status_code == 200 and response["HX-Trigger"] == "review-changed"
        count = self.client.get(f"/p/{self.project.slug}/review/count/", **HTMX).content.decode()
        assert re.search(r'id="nav-review-count"[^>]*>1</span>', count)

    def test_a_conflict_offers_a_reload(self):
        item = make_item(self.project, self.agent, kind="approval")
        services.review_item_claim(item=item, user=self.bob)
        add_reconciled(item.call, found=False)
        response = self.client.post(
            self.item_url(item, "reviews:decide"), {"decision": "approve"}, **HTMX
        )
        assert response.status_code == 409 and "Reload" in response.content.decode()


class QueueNoRetryTests(ReviewPageTestCase):
    def test_the_queue_does_not_retry_what_the_observation_rules_out(self):
        item = make_item(self.project, self.agent, reason="conflict")
        ToolCall.objects.filter(pk=item.call_id).update(
            observation="The object changed while the call ran. Do not retry; tell the user."
        )
        self.login(self.alice)
        body = self.client.get(f"/p/{self.project.slug}/review/").content.decode()
        button = body[body.index(f'id="item-{item.pk}"') :].split('data-key="a"', 1)[1]
        assert "not to retry" in button.split(">", 1)[0]
        response = self.client.post(
            self.item_url(item, "reviews:decide"),
            {"decision": "approve_retry", "from": "queue"},
            **HTMX,
        )
        assert response.status_code == 422 and "not to retry" in response.content.decode()
        assert ReviewItem.objects.get(pk=item.pk).is_open
