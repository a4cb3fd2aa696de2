"""Small factories and the named personas every test file uses.

``BaseTestCase`` builds two projects, A ("acme") and B ("globex"), and people with roles:
alice (operator of A), bob (second operator of A), victor (viewer of A), maria (manager of A),
olga (operator of B, the outsider). Each project has an agent with an API key.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

from django.contrib.auth import get_user_model
from django.test import TestCase

from callgate.auth import api_key_issue
from callgate.models import Agent, Membership, Project

PASSWORD = "correct horse battery staple"

#: The test vectors, part of the product: the repository's copy of
#: ``shared/cases/classification.jsonl`` (``.ci/run`` fails when the two differ);
#: ``CALLGATE_CASES`` names another file.
CASES_FILE = Path(
    os.environ.get(
        "CALLGATE_CASES", Path(__file__).resolve().parent / "cases" / "classification.jsonl"
    )
)


def load_cases() -> list[dict]:
    """The cases of ``CASES_FILE``, or an empty list when the file is not there."""
    if not CASES_FILE.exists():
        return []
    return [json.loads(line) for line in CASES_FILE.read_text().splitlines() if line.strip()]


def make_user(username: str):
    return get_user_model().objects.create_user(username=username, password=PASSWORD)


def make_event(type_: str, **fields) -> dict:
    """An API event envelope: a fresh event_id, occurred_at now, plus the body fields."""
    return {
        "event_id": str(uuid.uuid4()),
        "occurred_at": datetime.now(UTC).isoformat(),
        "type": type_,
        **fields,
    }


class BaseTestCase(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.project = Project.objects.create(slug="acme", name="Acme")
        cls.other_project = Project.objects.create(slug="globex", name="Globex")
        cls.alice = make_user("alice")
        cls.bob = make_user("bob")
        cls.victor = make_user("victor")
        cls.maria = make_user("maria")
        cls.olga = make_user("olga")
        Membership.objects.create(
            user=cls.alice, project=cls.project, role=Membership.Role.OPERATOR
        )
        Membership.objects.create(user=cls.bob, project=cls.project, role=Membership.Role.OPERATOR)
        Membership.objects.create(user=cls.victor, project=cls.project, role=Membership.Role.VIEWER)
        Membership.objects.create(user=cls.maria, project=cls.project, role=Membership.Role.MANAGER)
        Membership.objects.create(
            user=cls.olga, project=cls.other_project, role=Membership.Role.OPERATOR
        )
        cls.agent = Agent.objects.create(project=cls.project, name="support-bot")
        cls.other_agent = Agent.objects.create(project=cls.other_project, name="globex-bot")
        cls.key = api_key_issue(agent=cls.agent).plain
        cls.other_key = api_key_issue(agent=cls.other_agent).plain

    def api(self, key: str | None = None):
        """A test client that sends ``Authorization: Bearer <key>`` (project A's by default)."""
        from rest_framework.test import APIClient

        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key or self.key}")
        return client
