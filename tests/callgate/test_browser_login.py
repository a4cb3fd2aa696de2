"""Log in with a real browser and land on the project's overview."""

from __future__ import annotations

from tests.browser_support import BrowserTestCase


class LoginBrowserTests(BrowserTestCase):
    def test_it_logs_in_and_shows_the_overview(self):
        self.visit("/")
        assert "/login/" in self.page.url  # anonymous visitors are sent to the login form

        self.login("alice", next_path="/")

        assert self.page.url == self.url(f"/p/{self.project.slug}/")
        self.page.get_by_role("heading", level=1, name=self.project.name).wait_for()
        labels = self.page.locator(".tiles .tile").all_inner_texts()
        for label in ("tool calls", "not ok", "outcome unknown", "refused", "waiting for a human"):
            assert any(label in text for text in labels), (label, labels)
        nav = self.page.get_by_role("navigation", name="Main")
        assert nav.get_by_role("link", name="Overview").get_attribute("aria-current") == "page"
        # htmx and our own script loaded from our static files under the CSP
        assert self.page.evaluate("typeof window.htmx") == "object"
        self.screenshot("overview")
        self.assert_no_console_errors()

    def test_it_shows_an_error_for_a_wrong_password(self):
        self.visit("/login/")
        self.page.fill("#id_username", "alice")
        self.page.fill("#id_password", "wrong")
        with self.page.expect_navigation():
            self.page.click("form button[type=submit]")
        assert (
            self.page.get_by_role("alert")
            .inner_text()
            .startswith("Your username and password didn't match")
        )

    def test_it_does_not_show_another_projects_overview(self):
        self.login("alice")
        response = self.visit(f"/p/{self.other_project.slug}/")
        assert response.status == 404
        assert self.other_project.name not in self.page.content()
