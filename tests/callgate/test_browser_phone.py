"""Every operator and manager page on a phone (390×844, touch), in a real browser: no page
scrolls sideways, the header's navigation folds behind a Menu button, and an operator claims,
reconciles, approves and rejects from the queue and the item page with 44 px touch targets.
Screenshots of every page go to ``test-artifacts/phone-*.png`` for a human to look at.

Not covered: the API docs page (``/api/docs/``, drf-spectacular's Swagger UI, third-party)."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

from django.urls import reverse
from django.utils import timezone

from alerts.models import AlertDelivery, AlertEvent, AlertRule
from callgate.models import Agent, ToolCall
from callgate.reports.rollups import hour_floor, rollups_rebuild
from mcp_gateway import services as gateway_services
from reviews.models import ReviewItem
from tests.browser_support import BrowserTestCase, artifact_path
from tests.factories import make_contracts, seed_calls
from tests.reviews.fixtures import make_contract, make_item, target_without_the_operation

PHONE = {"width": 390, "height": 844}
#: WCAG 2.5.5 (target size, enhanced) and Apple's HIG: 44 × 44 CSS px.
TOUCH_PX = 44

LOOKUP_TOOL = {
    "name": "lookup_order",
    "description": "Look up an order by its ID.",
    "inputSchema": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    },
    "annotations": {"readOnlyHint": True},
}


class PhoneBrowserTests(BrowserTestCase):
    viewport = PHONE

    def setUp(self):
        super().setUp()
        # a phone: touch, mobile viewport meta honoured (replaces the base class's desktop page)
        self.context.close()
        self.context = self.browser.new_context(
            viewport=PHONE,
            is_mobile=True,
            has_touch=True,
            locale="en-US",
            timezone_id="America/New_York",
        )
        self.page = self.context.new_page()
        self.console_errors = []
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda exc: self.console_errors.append(f"pageerror: {exc}"))
        self._seed()

    def _seed(self) -> None:
        """A small demo: a week of mixed calls by three agents, open review items of each
        kind, an alert that fired (with its deliveries) and an MCP upstream with a tool."""
        agents = [
            self.agent,
            *(
                Agent.objects.create(project=self.project, name=n)
                for n in ("travel-bot", "billing-bot")
            ),
        ]
        contracts = make_contracts(self.project)
        start = hour_floor(timezone.now()) - timedelta(days=7)
        self.calls = seed_calls(self.project, agents, contracts, n=240, start=start, hours=24 * 7)
        approval_contract = make_contract(
            self.project, "issue_refund", requires_approval=True, reconcile="none"
        )
        self.approval = make_item(
            self.project,
            self.agent,
            kind=ReviewItem.Kind.APPROVAL,
            contract=approval_contract,
            arguments={"order_id": "O-20931", "amount_cents": 4599},
        )
        self.unknown = make_item(self.project, self.agent, reason="outcome_unknown")
        self.exhausted = make_item(
            self.project,
            agents[1],
            reason="retry_exhausted",
            tool="create_follow_up",
            age=timedelta(hours=3),
        )
        rollups_rebuild()
        rule = AlertRule.objects.create(
            project=self.project,
            name="Argument errors on get_weather",
            metric=AlertRule.Metric.CATEGORY_COUNT,
            target="argument_error",
            tool="get_weather",
            threshold=5,
            clear_threshold=2,
            webhook_url="https://hooks.example.com/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX",
            emails="oncall@example.com, support-leads@example.com",
            state=AlertRule.State.FIRING,
            last_value=9,
            last_evaluated_at=timezone.now(),
        )
        event = AlertEvent.objects.create(
            project=self.project,
            rule=rule,
            kind=AlertEvent.Kind.FIRING,
            value=9,
            threshold=5,
            message="Argument errors on get_weather: 9 calls in the last 60 minutes "
            "(fires at 5, resolves below 2)",
        )
        AlertDelivery.objects.create(
            event=event,
            channel=AlertDelivery.Channel.WEBHOOK,
            target=rule.webhook_url,
            status=AlertDelivery.Status.FAILED,
            attempts=3,
            last_error="HTTPSConnectionPool(host='hooks.example.com', port=443): Read timed out.",
        )
        upstream = gateway_services.upstream_set(
            project=self.project, name="shop", target="https://shop.example.com/mcp"
        )
        gateway_services.tools_publish(
            upstream_id=upstream.pk, tools=[LOOKUP_TOOL], names={"lookup_order": "lookup_order"}
        )

    # --- helpers

    def pages(self) -> list[tuple[str, str]]:
        slug = self.project.slug
        call = next(c for c in self.calls if c.reason != "ok")
        return [
            ("overview", reverse("callgate:overview", args=[slug])),
            ("calls", reverse("callgate:calls", args=[slug])),
            ("call", reverse("callgate:call_detail", args=[slug, call.operation_id])),
            ("queue", reverse("reviews:queue", args=[slug])),
            ("item", reverse("reviews:item", args=[slug, self.approval.pk])),
            ("item-escalation", reverse("reviews:item", args=[slug, self.unknown.pk])),
            ("item-edit", reverse("reviews:item", args=[slug, self.approval.pk]) + "?confirm=edit"),
            (
                "search",
                reverse("callgate:calls", args=[slug])
                + "?q=tool%3Acreate_follow_up+-state%3Asucceeded",
            ),
            ("notifications", reverse("reviews:notifications", args=[slug])),
            ("contracts", reverse("callgate:contracts", args=[slug])),
            ("contract", reverse("callgate:contract_detail", args=[slug, "create_follow_up"])),
            ("agents", reverse("callgate:agents", args=[slug])),
            *(
                (f"reports-{section or 'overview'}", f"/p/{slug}/reports/{section}")
                for section in ("", "reasons/", "tools/", "agents/", "reliability/", "review/")
            ),
            ("alerts", reverse("alerts:rules", args=[slug])),
            ("alerts-history", reverse("alerts:history", args=[slug])),
            ("gateway", reverse("mcp_gateway:gateway", args=[slug])),
        ]

    def overflow(self) -> dict:
        """The page's width and the first elements that stick out on the right."""
        return self.page.evaluate(
            """() => ({
                scrollWidth: document.documentElement.scrollWidth,
                wide: [...document.querySelectorAll('body *')]
                    .filter((e) => e.getBoundingClientRect().right > innerWidth + 1)
                    .slice(0, 5).map((e) => `${e.tagName}.${e.className}`),
            })"""
        )

    def assert_touch_target(self, locator) -> None:
        box = locator.bounding_box()
        assert box is not None, locator
        assert box["width"] >= TOUCH_PX and box["height"] >= TOUCH_PX, (locator, box)

    def wait_until_htmx_idle(self) -> None:
        self.page.wait_for_function(
            "() => !document.querySelector('.htmx-added, .htmx-settling, .htmx-swapping, .htmx-request')"
        )

    # --- tests

    def test_no_page_scrolls_sideways_and_list_rows_are_labelled_cards(self):
        self.visit("/login/")
        assert self.overflow()["scrollWidth"] <= PHONE["width"], self.overflow()
        self.screenshot("phone-login")
        self.login("maria")
        for name, path in self.pages():
            response = self.visit(path)
            assert response.status == 200, (name, response.status)
            self.page.wait_for_load_state("networkidle")
            measured = self.overflow()
            assert measured["scrollWidth"] <= PHONE["width"], (name, measured)
            # list tables are stacked cards: no header row shown, each cell after its label
            for table in self.page.locator("main table.dense").all():
                if not table.is_visible():
                    continue
                assert table.evaluate(
                    "(t) => !t.tHead || t.tHead.getBoundingClientRect().height <= 1"
                ), name
                labelled = table.evaluate(
                    """(t) => [...t.querySelectorAll('tbody td')].filter((td) => !td.classList.contains('whole'))
                        .every((td) => td.hasAttribute('data-label'))"""
                )
                assert labelled, name
            self.screenshot(f"phone-{name}")
        calls = self.page.goto(self.url(self.pages()[1][1]))
        assert calls.status == 200
        first = self.page.locator("table.calls tbody tr").first
        label = (
            first.locator("td").nth(1).evaluate("(td) => getComputedStyle(td, '::before').content")
        )
        assert label == '"Tool"', label
        self.assert_no_console_errors()

    def test_the_menu_button_opens_and_closes_the_navigation(self):
        self.login("alice")
        self.visit(reverse("callgate:calls", args=[self.project.slug]))
        menu = self.page.get_by_role("button", name="Menu", exact=True)
        nav = self.page.locator("#mainnav")
        assert menu.get_attribute("aria-controls") == "mainnav"
        assert menu.get_attribute("aria-expanded") == "false" and not nav.is_visible()
        self.assert_touch_target(menu)

        menu.tap()
        assert menu.get_attribute("aria-expanded") == "true"
        links = nav.get_by_role("link")
        assert [link.inner_text().split()[0] for link in links.all()][:3] == [
            "Overview",
            "Calls",
            "Review",
        ]
        for link in links.all():
            assert link.is_visible()
            self.assert_touch_target(link)
        assert self.overflow()["scrollWidth"] <= PHONE["width"]
        self.screenshot("phone-menu-open", full_page=False)

        self.page.keyboard.press("Escape")
        assert menu.get_attribute("aria-expanded") == "false" and not nav.is_visible()
        assert menu.evaluate("(b) => b === document.activeElement")

        # keyboard: Enter opens, Tab walks into the navigation, a tap outside closes it
        self.page.keyboard.press("Enter")
        assert nav.is_visible()
        self.page.keyboard.press("Tab")
        assert self.page.evaluate("() => document.activeElement.closest('#mainnav') !== null")
        self.page.locator("main h1").tap()
        assert menu.get_attribute("aria-expanded") == "false" and not nav.is_visible()

        menu.tap()
        with self.page.expect_navigation():
            nav.get_by_role("link", name="Review").tap()
        assert self.page.url.endswith(reverse("reviews:queue", args=[self.project.slug]))
        assert not nav.is_visible()
        self.assert_no_console_errors()

    def test_the_navigation_stays_in_the_header_on_a_desktop(self):
        self.login("alice")
        desktop = self.browser.new_context(viewport={"width": 1440, "height": 900})
        desktop.add_cookies(self.context.cookies())
        page = desktop.new_page()
        page.goto(self.url(reverse("reviews:queue", args=[self.project.slug])))
        assert not page.get_by_role("button", name="Menu").is_visible()
        nav = page.locator("#mainnav")
        header = page.locator("header.topbar").bounding_box()
        assert nav.is_visible() and nav.get_by_role("link", name="Calls").is_visible()
        # one line: the navigation sits inside the header's single row
        assert header is not None and header["height"] < 60, header
        assert page.locator("table.queue thead th").first.is_visible()
        page.screenshot(path=str(artifact_path("desktop-queue")), full_page=True)
        desktop.close()

    def test_an_operator_claims_approves_reconciles_and_rejects_from_the_phone(self):
        self.login("alice")
        self.visit(reverse("reviews:queue", args=[self.project.slug]))

        # the queue: claim, then approve an approval request
        row = self.page.locator(f"#item-{self.approval.pk}")
        claim = row.get_by_role("button", name="Claim")
        self.assert_touch_target(claim)
        claim.tap()
        row.get_by_text("alice (you)").wait_for()
        self.wait_until_htmx_idle()
        # the row htmx swapped in is a labelled card too
        assert row.locator("td[data-label='Tool']").inner_text().startswith("issue_refund")
        approve = row.get_by_role("button", name="Approve", exact=True)
        self.assert_touch_target(approve)
        approve.tap()
        self.page.wait_for_function(
            f"() => !document.querySelector('#item-{self.approval.pk} [data-key=a]')"
        )
        call = ToolCall.objects.get(pk=self.approval.call_id)
        assert (call.decision, call.decided_by) == ("approve", self.alice)
        self.screenshot("phone-queue-approved", full_page=False)

        # the queue: claim and reconcile an unknown outcome (the target has no trace of it)
        row = self.page.locator(f"#item-{self.unknown.pk}")
        row.get_by_role("button", name="Claim").tap()
        row.get_by_text("alice (you)").wait_for()
        self.wait_until_htmx_idle()
        reconcile = row.get_by_role("button", name="Reconcile")
        self.assert_touch_target(reconcile)
        with mock.patch("callgate.reconcile.make_client", target_without_the_operation):
            reconcile.tap()
            self.page.wait_for_function(
                f"""() => {{
                    const b = document.querySelector('#item-{self.unknown.pk} [data-key=a]');
                    return b && !b.classList.contains('needs');
                }}"""
            )
        approve = row.get_by_role("button", name="Approve retry")
        self.assert_touch_target(approve)
        approve.tap()
        self.page.wait_for_function(
            f"() => !document.querySelector('#item-{self.unknown.pk} [data-key=a]')"
        )
        item = ReviewItem.objects.get(pk=self.unknown.pk)
        assert list(item.audit.values_list("action", flat=True)) == [
            "opened",
            "claim",
            "reconcile",
            "reason_changed",  # the look-up found nothing: outcome unknown -> reconciled absent
            "approve_retry",
        ]

        # the item page: claim, then reject with a written reason
        self.visit(reverse("reviews:item", args=[self.project.slug, self.exhausted.pk]))
        header = self.page.locator(".itemhead")
        claim = header.get_by_role("button", name="Claim")
        self.assert_touch_target(claim)
        claim.tap()
        self.page.get_by_text("Claimed. The claim lapses").wait_for()
        reject = header.get_by_role("link", name="Reject…")
        self.assert_touch_target(reject)
        reject.tap()
        reason = self.page.get_by_label("Reason (the agent reads it as the observation)")
        reason.fill("The customer closed the ticket by phone.")
        submit = header.locator("form.confirm").get_by_role("button", name="Reject")
        self.assert_touch_target(submit)
        self.screenshot("phone-item-reject-form", full_page=False)
        submit.tap()
        self.page.get_by_text("Rejected: the agent gets your reason").wait_for()
        call = ToolCall.objects.get(pk=self.exhausted.call_id)
        assert (call.decision, call.decision_reason) == (
            "reject",
            "The customer closed the ticket by phone.",
        )
        assert self.overflow()["scrollWidth"] <= PHONE["width"]
        self.screenshot("phone-item-rejected")
        self.assert_no_console_errors()
