"""The API docs (drf-spectacular's Swagger UI, served from the sidecar) in a real browser:
it renders the operations and breaks no Content-Security-Policy rule (our override of
``drf_spectacular/swagger_ui.html`` has no inline ``<style>``)."""

from __future__ import annotations

from tests.browser_support import BrowserTestCase


class BrowserDocsTests(BrowserTestCase):
    def test_it_renders_the_api_docs_without_console_errors(self):
        self.login("alice")
        response = self.visit("/api/docs/")
        assert response.status == 200
        assert "<style" not in response.text()
        self.page.locator(".opblock").first.wait_for()
        self.page.wait_for_load_state("networkidle")
        paths = self.page.locator(".opblock-summary-path").all_inner_texts()
        assert any("/api/v1/calls" in p for p in paths), paths
        assert any("/api/v1/reports/categories" in p for p in paths), paths
        self.screenshot("api-docs")
        self.assert_no_console_errors()
