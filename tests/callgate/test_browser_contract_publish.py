"""A project admin publishes a contract version from the contract page, in a real browser."""

from __future__ import annotations

import json

from callgate import services
from callgate.models import Membership, ToolContract
from callgate.schemas import ContractIn
from tests.browser_support import BrowserTestCase
from tests.factories import PAYMENT


class ContractPublishBrowserTests(BrowserTestCase):
    def test_an_admin_publishes_a_stricter_version(self):
        services.contract_register(
            agent=self.agent, name="pay", payload=ContractIn.model_validate(PAYMENT)
        )
        Membership.objects.filter(user=self.maria, project=self.project).update(role="admin")
        self.login("maria")
        self.visit(f"/p/{self.project.slug}/contracts/pay/")
        self.page.get_by_text("Publish a version…").click()
        draft = json.loads(self.page.locator("#contract-json").input_value())
        self.assertTrue(draft["requires_approval"])
        self.page.locator("#contract-json").fill(json.dumps({**draft, "max_attempts": 1}))
        self.screenshot("contract-publish-form")
        self.page.get_by_role("button", name="Publish as v2").click()
        self.page.get_by_text("by user maria").wait_for()
        self.screenshot("contract-published")
        self.assertEqual(
            ToolContract.objects.get(project=self.project, name="pay", version=2).max_attempts, 1
        )
        self.assert_no_console_errors()
