"""Throttling (issue 16): per API key and per project with RateLimit headers and a 429 in the
API's error shape, failed key look-ups limited per address, and login lockout (django-axes)."""

from __future__ import annotations

from django.core.cache import cache
from django.test import override_settings

from callgate.auth import api_key_issue
from callgate.models import ApiKey
from tests.factories import PASSWORD, BaseTestCase


class ApiThrottleTests(BaseTestCase):
    def setUp(self):
        # the cache outlives each test's transaction (Redis when CELERY_BROKER_URL is set)
        keys = ["authfail:127.0.0.1"] + [
            f"throttle:{kind}:{pk}"
            for kind, pks in (
                ("project", [self.project.pk, self.other_project.pk]),
                ("key", list(ApiKey.objects.values_list("pk", flat=True))),
            )
            for pk in pks
        ]
        cache.delete_many(keys)
        self.addCleanup(cache.delete_many, keys)

    @override_settings(CALLGATE_THROTTLE_KEY="3/min")
    def test_a_key_over_its_rate_gets_429_with_rate_limit_headers(self):
        api = self.api()
        remaining = []
        for _ in range(3):
            response = api.get("/api/v1/calls/op_nothing")
            self.assertEqual(response.status_code, 404)
            self.assertEqual(response["RateLimit-Limit"], "3")
            remaining.append(response["RateLimit-Remaining"])
        self.assertEqual(remaining, ["2", "1", "0"])
        refused = api.get("/api/v1/calls/op_nothing")
        self.assertEqual(refused.status_code, 429)
        self.assertEqual(set(refused.json()), {"error", "errors"})
        self.assertIn("throttled", refused.json()["error"].lower())
        self.assertGreater(int(refused["Retry-After"]), 0)
        # another project's key is counted apart
        self.assertEqual(self.api(self.other_key).get("/api/v1/calls/op_x").status_code, 404)

    @override_settings(CALLGATE_THROTTLE_PROJECT="3/min")
    def test_a_projects_keys_share_the_project_rate(self):
        second = self.api(api_key_issue(agent=self.agent).plain)
        for client in (self.api(), second, self.api()):
            self.assertEqual(client.get("/api/v1/calls/op_x").status_code, 404)
        self.assertEqual(second.get("/api/v1/calls/op_x").status_code, 429)

    @override_settings(CALLGATE_AUTH_FAILURES_PER_MINUTE=5)
    def test_key_guessing_is_cut_off_per_address(self):
        guess = self.api("cg_0123abcd_" + "x" * 43)
        for _ in range(5):
            self.assertEqual(guess.get("/api/v1/calls/op_x").status_code, 401)
        refused = guess.get("/api/v1/calls/op_x")
        self.assertEqual(refused.status_code, 429)
        self.assertEqual(set(refused.json()), {"error", "errors"})
        self.assertEqual(self.api().get("/api/v1/calls/op_x").status_code, 429)  # this minute


@override_settings(AXES_FAILURE_LIMIT=3)
class LoginLockoutTests(BaseTestCase):
    def setUp(self):
        from axes.utils import reset

        reset(ip="127.0.0.1", username="alice")
        self.addCleanup(reset, ip="127.0.0.1", username="alice")

    def test_wrong_passwords_lock_the_user_out_even_for_the_right_one(self):
        for _ in range(3):
            response = self.client.post("/login/", {"username": "alice", "password": "wrong"})
            self.assertIn(response.status_code, (200, 429))
        response = self.client.post("/login/", {"username": "alice", "password": PASSWORD})
        self.assertEqual(response.status_code, 429)
        self.assertNotIn("_auth_user_id", self.client.session)
        # another user is not locked out
        response = self.client.post("/login/", {"username": "bob", "password": PASSWORD})
        self.assertEqual(response.status_code, 302)
