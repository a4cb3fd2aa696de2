"""Saved views: a user saves the calls list's or the queue's filters and search under a
name, lists, opens and deletes them; nobody sees, opens or deletes another's."""

from __future__ import annotations

from django.test import Client

from callgate.models import SavedView
from tests.factories import BaseTestCase


class SavedViewTests(BaseTestCase):
    def setUp(self):
        self.client.force_login(self.alice)
        self.base = f"/p/{self.project.slug}"

    def save(self, client=None, **fields):
        data = {"page": "calls", "name": "Refund failures", "query": "tool=issue_refund", **fields}
        return (client or self.client).post(f"{self.base}/views/", data)

    def test_it_saves_opens_lists_and_deletes_a_view(self):
        response = self.save(query="?q=tool%3Aissue_refund+-state%3Asucceeded&before=abc")
        view = SavedView.objects.get(user=self.alice)
        # the page's position is not part of a view
        self.assertEqual(view.query, "q=tool%3Aissue_refund+-state%3Asucceeded")
        self.assertRedirects(
            response, f"{self.base}/calls/?{view.query}", fetch_redirect_response=False
        )
        page = self.client.get(f"{self.base}/calls/")
        self.assertContains(page, f"{self.base}/views/{view.pk}/")
        self.assertContains(page, "Refund failures")
        opened = self.client.get(f"{self.base}/views/{view.pk}/")
        self.assertRedirects(
            opened, f"{self.base}/calls/?{view.query}", fetch_redirect_response=False
        )
        deleted = self.client.post(f"{self.base}/views/{view.pk}/delete/")
        self.assertRedirects(deleted, f"{self.base}/calls/", fetch_redirect_response=False)
        self.assertFalse(SavedView.objects.exists())

    def test_the_same_name_replaces_the_view(self):
        self.save(query="tool=a")
        self.save(query="tool=b")
        self.assertEqual(list(SavedView.objects.values_list("query", flat=True)), ["tool=b"])

    def test_queue_views_open_the_queue_and_show_in_its_menu(self):
        self.save(page="queue", name="Mine", query="assignee=me&q=is%3Aclaimed")
        view = SavedView.objects.get()
        opened = self.client.get(f"{self.base}/views/{view.pk}/")
        self.assertRedirects(
            opened, f"{self.base}/review/?assignee=me&q=is%3Aclaimed", fetch_redirect_response=False
        )
        self.assertContains(self.client.get(f"{self.base}/review/"), "Mine")
        self.assertNotContains(self.client.get(f"{self.base}/calls/"), "Mine</a>")

    def test_another_users_view_is_a_404_and_is_never_listed(self):
        self.save()
        view = SavedView.objects.get()
        bob = Client()
        bob.force_login(self.bob)
        self.assertEqual(bob.get(f"{self.base}/views/{view.pk}/").status_code, 404)
        self.assertEqual(bob.post(f"{self.base}/views/{view.pk}/delete/").status_code, 404)
        self.assertNotContains(bob.get(f"{self.base}/calls/"), "Refund failures")
        self.assertTrue(SavedView.objects.filter(pk=view.pk).exists())
        # a view of another project is not found under this one either
        olga = Client()
        olga.force_login(self.olga)
        other = f"/p/{self.other_project.slug}/views/{view.pk}/"
        self.assertEqual(olga.get(other).status_code, 404)

    def test_bad_fields_are_a_400_naming_the_field(self):
        for fields, name in (
            ({"page": "reports"}, "page"),
            ({"name": "   "}, "name"),
            ({"name": "x" * 81}, "name"),
            ({"query": "q=" + "x" * 2001}, "query"),
            ({"name": "a\x00b"}, "name"),
            ({"query": "q=a\x00"}, "query"),
        ):
            with self.subTest(fields=fields):
                response = self.save(**fields)
                self.assertEqual(response.status_code, 400)
                self.assertIn(f"not saved: {name} ", response.content.decode())
        self.assertFalse(SavedView.objects.exists())

    def test_posts_need_the_csrf_token(self):
        client = Client(enforce_csrf_checks=True)
        client.force_login(self.alice)
        self.assertEqual(self.save(client=client).status_code, 403)
        self.assertFalse(SavedView.objects.exists())

    def test_opening_needs_get_and_saving_post(self):
        self.assertEqual(self.client.get(f"{self.base}/views/").status_code, 405)
