"""The review queue in a real browser (system Chromium via Playwright)."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from unittest import mock

from django.utils import timezone

from callgate.models import CallEvent, ToolCall
from reviews import services
from reviews.models import ReviewItem
from tests.browser_support import BrowserTestCase
from tests.reviews.fixtures import (
    add_reconciled,
    make_contract,
    make_item,
    target_without_the_operation,
)


class ReviewBrowserTests(BrowserTestCase):
    def snapshot(self, name: str) -> None:
        """Screenshot. Playwright's screenshot leaves empty ``style`` attributes on inputs (as a
        user resizing the comment box leaves one); htmx must not copy them on the next swap."""
        self.screenshot(name)

    def wait_until_htmx_idle(self) -> None:
        """No swap settling (htmx binds swapped-in buttons only once settled: a key pressed
        during the 5 s refresh's 20 ms settle would click a dead button) and no request."""
        self.page.wait_for_function(
            "() => !document.querySelector('.htmx-added, .htmx-settling, .htmx-swapping, .htmx-request')"
        )

    def item_path(self, item) -> str:
        return f"/p/{self.project.slug}/review/{item.pk}/"

    def test_it_claims_reconciles_and_approves_with_the_keyboard(self):
        item = make_item(self.project, self.agent, reason="outcome_unknown")
        self.login("alice")
        self.visit(self.item_path(item))
        header = self.page.locator(".itemhead")
        assert header.get_by_role("button", name="Approve retry").is_disabled()
        assert "Approve retry needs a reconciliation that found nothing" in header.inner_text()
        self.snapshot("review-item")

        self.page.keyboard.press("c")
        self.page.get_by_text("Claimed. The claim lapses").wait_for()
        with mock.patch("callgate.reconcile.make_client", target_without_the_operation):
            self.page.keyboard.press("r")
            self.page.get_by_text("the target has no trace of this operation").wait_for()
        approve = header.get_by_role("button", name="Approve retry")
        approve.wait_for()
        assert approve.is_enabled()
        self.page.keyboard.press("a")
        self.page.get_by_text("Retry approved").wait_for()
        call = ToolCall.objects.get(pk=item.call_id)
        assert (call.decision, call.decided_by) == ("approve_retry", self.alice)
        actions = list(item.audit.values_list("action", flat=True))
        # the look-up found nothing: the reason follows (outcome unknown → absent), audited
        assert actions == ["opened", "claim", "reconcile", "reason_changed", "approve_retry"]
        self.screenshot("review-item-decided")
        self.assert_no_console_errors()

    def test_it_rejects_with_a_written_reason_inline(self):
        item = make_item(self.project, self.agent, reason="retry_exhausted")
        self.login("bob")
        self.visit(self.item_path(item))
        self.page.keyboard.press("Shift+R")
        reason = self.page.get_by_label("Reason (the agent reads it as the observation)")
        reason.wait_for()
        assert reason.evaluate("el => el === document.activeElement")
        reason.type("The customer cancelled the order.")
        self.snapshot("review-item-reject-form")
        reason.press("Enter")
        self.page.get_by_text("Rejected: the agent gets your reason").wait_for()
        call = ToolCall.objects.get(pk=item.call_id)
        assert (
            call.decision == "reject"
            and call.decision_reason == "The customer cancelled the order."
        )
        assert "The customer cancelled the order." in self.page.locator("table.audit").inner_text()
        self.assert_no_console_errors()

    def test_it_shows_the_conflict_when_someone_else_decided_first(self):
        item = make_item(self.project, self.agent, reason="retry_exhausted")
        self.login("alice")
        self.visit(self.item_path(item))
        services.review_item_decide(
            item=ReviewItem.objects.get(pk=item.pk),
            user=self.bob,
            decision="mark_failed",
            reason="The target is gone.",
        )
        self.page.keyboard.press("Shift+R")
        reason = self.page.get_by_label("Reason (the agent reads it as the observation)")
        reason.fill("Too late.")
        reason.press("Enter")
        alert = self.page.get_by_role("alert")
        alert.wait_for()
        assert "bob already decided this item (mark_failed)" in alert.inner_text()
        assert "Resolved: Marked failed" in self.page.locator(".itemhead").inner_text()
        self.screenshot("review-item-conflict")
        assert ToolCall.objects.get(pk=item.call_id).decision == "mark_failed"

    def test_it_shows_a_viewer_no_action_buttons(self):
        item = make_item(self.project, self.agent)
        self.login("victor")
        self.visit(f"/p/{self.project.slug}/review/")
        self.page.locator(f"#item-{item.pk}").wait_for()
        assert (
            self.page.locator("[data-key]").count() == 0
            or self.page.locator("button[data-key], form#bulk").count() == 0
        )
        self.visit(self.item_path(item))
        assert self.page.get_by_role("toolbar").count() == 0
        assert self.page.get_by_role("button", name="Claim").count() == 0
        self.assert_no_console_errors()

    def test_it_clears_fifty_mixed_items_with_the_keyboard_alone(self):
        read = make_contract(self.project, "get_weather", effect="read", reconcile="none")
        items = []
        for n in range(50):
            if n % 3 == 0:
                items.append(
                    make_item(self.project, self.agent, kind="approval", age=timedelta(minutes=n))
                )
            elif n % 3 == 1:
                items.append(
                    make_item(
                        self.project,
                        self.agent,
                        reason="retry_exhausted",
                        contract=read,
                        tool="get_weather",
                        age=timedelta(minutes=n),
                    )
                )
            else:
                item = make_item(
                    self.project, self.agent, reason="outcome_unknown", age=timedelta(minutes=n)
                )
                add_reconciled(item.call, found=False)
                items.append(item)
        self.login("alice")
        failures: list[str] = []
        self.page.on(
            "response",
            lambda r: (
                failures.append(f"{r.status} {r.request.method} {r.url}")
                if r.status >= 400
                else None
            ),
        )
        self.visit(f"/p/{self.project.slug}/review/")
        self.page.locator("table.queue tbody tr").nth(49).wait_for()
        self.snapshot("review-queue")
        self.page.locator("table.queue tbody tr").nth(49).wait_for()
        started = time.monotonic()
        for _ in range(150):
            if not ReviewItem.objects.filter(
                project=self.project, status__in=["open", "claimed"]
            ).exists():
                break
            self.page.keyboard.press("j")
            selected = self.page.locator("tr[aria-selected=true]")
            if selected.count() != 1:
                continue
            row_id = selected.get_attribute("id")
            if selected.locator("button[data-key=a]:not([disabled]):not(.needs)").count() == 0:
                if selected.locator("button[data-key=c]:not([disabled])").count() == 0:
                    continue
                # an approval request: the list approves it only once claimed, so claim it first
                self.wait_until_htmx_idle()
                with self.page.expect_response(lambda r: "/claim/" in r.url, timeout=12_000):
                    self.page.keyboard.press("c")
                self.wait_until_htmx_idle()  # the claimed row swapped in and settled
                if (
                    self.page.locator(
                        f"#{row_id}[aria-selected=true] button[data-key=a]:not([disabled]):not(.needs)"
                    ).count()
                    == 0
                ):
                    continue
            # the answer swaps the row (or the 5 s refresh already dropped the decided row)
            try:
                self.wait_until_htmx_idle()
                with self.page.expect_response(lambda r: "/decide/" in r.url, timeout=12_000):
                    self.page.keyboard.press("a")
                self.wait_until_htmx_idle()
                self.page.wait_for_function(
                    "id => !document.querySelector(`#${id} button[data-key=a]:not([disabled]):not(.needs)`)",
                    arg=row_id,
                    timeout=12_000,
                )
            except Exception as exc:
                raise AssertionError(
                    f"{row_id} stuck; failed responses: {failures}; "
                    f"{ReviewItem.objects.get(pk=int(row_id.split('-')[1])).status}"
                ) from exc
        elapsed = time.monotonic() - started
        assert failures == []
        assert not ReviewItem.objects.filter(
            project=self.project, status__in=["open", "claimed"]
        ).exists()
        assert ReviewItem.objects.filter(project=self.project, resolved_by=self.alice).count() == 50
        assert elapsed < 60, f"took {elapsed:.1f} s"
        self.screenshot("review-queue-cleared")
        self.assert_no_console_errors()

    def test_it_moves_selects_and_opens_with_the_keyboard(self):
        first = make_item(self.project, self.agent, kind="approval")
        second = make_item(self.project, self.agent, age=timedelta(minutes=3))
        self.login("alice")
        self.visit(f"/p/{self.project.slug}/review/")
        self.page.keyboard.press("?")
        dialog = self.page.locator("dialog#shortcuts")
        dialog.wait_for()
        assert "Claim the selected item" in dialog.inner_text()
        self.page.keyboard.press("Escape")
        self.page.keyboard.press("j")
        self.page.keyboard.press("j")
        assert (
            self.page.locator("tr[aria-selected=true]").get_attribute("id") == f"item-{second.pk}"
        )
        self.page.keyboard.press("x")
        assert self.page.locator(f"#item-{second.pk} input[type=checkbox]").is_checked()
        self.page.keyboard.press("c")
        self.page.locator(f"#item-{second.pk} .rowflash").wait_for()
        # the 5 s refresh keeps the selection and the checked box
        time.sleep(6)
        assert (
            self.page.locator("tr[aria-selected=true]").get_attribute("id") == f"item-{second.pk}"
        )
        self.assert_no_console_errors()
        self.page.keyboard.press("?")
        self.screenshot("review-queue-help")
        self.page.keyboard.press("Escape")
        self.page.keyboard.press("k")
        with self.page.expect_navigation():
            self.page.keyboard.press("Enter")
        assert self.page.url.endswith(self.item_path(first))

    def test_it_renders_the_item_page_in_dark_mode_with_an_override_in_red(self):
        item = make_item(self.project, self.agent, reason="outcome_unknown")
        services.review_item_comment(
            item=item, user=self.bob, text="Customer says nothing arrived."
        )
        services.review_item_decide(
            item=item,
            user=self.bob,
            decision="approve_retry",
            override=True,
            reason="Checked the CRM by hand: no follow-up exists.",
        )
        approval = make_item(self.project, self.agent, kind="approval")
        self.page.emulate_media(color_scheme="dark")
        self.login("alice")
        self.visit(self.item_path(item))
        override = self.page.locator("table.audit tr.audit-override")
        assert "Checked the CRM by hand" in override.inner_text()
        assert override.locator("td").first.evaluate(
            "el => getComputedStyle(el).color"
        ) != self.page.locator("table.audit tr").nth(1).locator("td").first.evaluate(
            "el => getComputedStyle(el).color"
        )
        self.screenshot("review-item-dark")
        self.visit(f"/p/{self.project.slug}/review/?status=all")
        self.page.locator(f"#item-{approval.pk} [data-countdown]").wait_for()
        assert "left" in self.page.locator(f"#item-{approval.pk} [data-countdown]").inner_text()
        self.screenshot("review-queue-dark")
        self.assert_no_console_errors()

    def test_it_dates_local_times_that_are_not_today(self):
        item = make_item(self.project, self.agent, reason="not_reconcilable")
        yesterday = timezone.now() - timedelta(days=1)
        CallEvent.objects.filter(call=item.call).update(
            received_at=yesterday, occurred_at=yesterday
        )
        CallEvent.objects.create(
            project=self.project,
            call=item.call,
            kind=CallEvent.Kind.ATTEMPT,
            body={"type": "attempt", "attempt": 2, "outcome": "timeout", "sent": True},
            occurred_at=timezone.now(),
            received_at=timezone.now(),
        )
        ToolCall.objects.filter(pk=item.call_id).update(
            decision="approve_retry", decided_at=yesterday, decided_by=self.bob
        )
        self.login("alice")
        self.visit(self.item_path(item))
        times = self.page.locator("ol.timeline time[data-local]")
        self.page.wait_for_function(
            "() => /, /.test(document.querySelector('ol.timeline time[data-local]').textContent)"
        )
        texts = times.all_inner_texts()
        dated, clock = (
            r"^\d{1,2} [A-Z][a-z]{2}, \d{2}:\d{2}:\d{2}$",
            r"^\d{2}:\d{2}:\d{2}$",
        )  # en-GB, UTC
        assert re.match(dated, texts[0]), texts  # yesterday's proposal: with its date, first
        assert all(re.match(clock, t) for t in texts[1:]), texts  # today's: the time alone
        assert times.first.get_attribute("title").endswith(" UTC")
        decided = self.page.locator("dl.meta dd", has_text="Approved retry").locator(
            "time[data-local]"
        )
        assert re.match(dated, decided.inner_text()), decided.inner_text()
        assert decided.inner_text() == self.page.evaluate(
            "iso => window.callgate.localTime(new Date(iso))", yesterday.isoformat()
        )
        self.screenshot("review-item-dated-times")
        self.assert_no_console_errors()

    def visible_help_keys(self) -> list[str]:
        self.page.keyboard.press("?")
        dialog = self.page.locator("dialog#shortcuts")
        dialog.wait_for()
        keys = [dt.inner_text() for dt in dialog.locator("dt").all() if dt.is_visible()]
        self.page.keyboard.press("Escape")
        return keys

    def test_it_lists_exactly_the_keys_that_work_in_the_help(self):
        guarded = make_item(self.project, self.agent, reason="outcome_unknown")
        approval = make_item(self.project, self.agent, kind="approval")
        self.login("alice")
        self.visit(f"/p/{self.project.slug}/review/")
        self.page.locator(f"#item-{guarded.pk}").wait_for()
        assert self.visible_help_keys() == ["j / k", "Enter", "x", "c", "a", "r", "g c", "/", "?"]
        assert "claimed" in self.page.locator("dialog#shortcuts dd").nth(4).inner_text()
        # the guarded escalation: approve retry needs an override; its contract reconciles over HTTP
        self.visit(self.item_path(guarded))
        assert self.visible_help_keys() == [
            "c",
            "r",
            "Shift+A",
            "Shift+R",
            "m",
            "f",
            "n",
            "u",
            "?",
        ]
        self.page.keyboard.press("c")
        self.page.get_by_text("Claimed. The claim lapses").wait_for()
        assert self.visible_help_keys() == [
            "r",
            "Shift+A",
            "Shift+R",
            "m",
            "f",
            "n",
            "u",
            "?",
        ]  # after the swap too
        self.visit(self.item_path(approval))
        # an approval: nothing to reconcile, so no r; its arguments can be edited (w)
        assert self.visible_help_keys() == ["c", "a", "w", "Shift+R", "e", "n", "u", "?"]
        self.page.keyboard.press("?")
        self.page.locator("dialog#shortcuts").wait_for()
        self.screenshot("review-item-shortcuts")
        self.page.keyboard.press("Escape")
        # x selects a row on every page: on an item page (no rows) it does nothing
        self.page.keyboard.press("x")
        self.page.wait_for_timeout(300)
        assert self.page.locator("form.confirm").count() == 0
        self.page.keyboard.press("Shift+R")  # reject has its own key, as the help says
        self.page.get_by_label("Reason (the agent reads it as the observation)").wait_for()
        self.assert_no_console_errors()

    def test_it_opens_the_inline_forms_without_inline_styles(self):
        item = make_item(self.project, self.agent, reason="retry_exhausted")
        self.login("bob")
        self.visit(self.item_path(item))
        self.snapshot("review-item-before-confirm")  # leaves style="" on the inputs
        # an operator drags the comment box bigger: the browser sets its size as an inline style
        self.page.locator("form.commentform textarea").evaluate(
            "el => { el.style.height = '9rem'; }"
        )
        for key, label in (
            ("Shift+R", "Reason (the agent reads it as the observation)"),
            ("f", "Reason"),
        ):
            self.page.keyboard.press(key)
            reason = self.page.get_by_label(label, exact=True)
            reason.wait_for()
            self.page.wait_for_timeout(300)  # htmx settles after 20 ms
            self.page.get_by_role("link", name="Cancel").click()
            reason.wait_for(state="detached")
        self.assert_no_console_errors()
