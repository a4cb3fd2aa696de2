"""Management commands: create_project, add_member, create_agent_key."""

from __future__ import annotations

import io

from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from callgate.auth import KEY_PATTERN, _digest, api_key_verify
from callgate.models import Agent, ApiKey, Membership, Project
from tests.factories import BaseTestCase


def run(*args: str) -> tuple[str, str]:
    """Run a command; returns (stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


class CreateProjectCommandTests(BaseTestCase):
    def test_it_creates_a_project(self):
        out, _ = run("create_project", "support", "Customer support")
        assert out.strip() == "Created: project support (Customer support)"
        assert Project.objects.get(slug="support").name == "Customer support"

    def test_it_defaults_the_name_to_the_slug(self):
        run("create_project", "billing")
        assert Project.objects.get(slug="billing").name == "billing"

    def test_it_is_idempotent(self):
        out, _ = run("create_project", "acme", "Renamed")
        assert out.strip() == "Exists: project acme (Acme)"
        assert Project.objects.filter(slug="acme").count() == 1
        assert Project.objects.get(slug="acme").name == "Acme"

    def test_it_rejects_a_bad_slug(self):
        for slug in ("Not A Slug", "UPPER", "a/b"):
            with self.assertRaisesMessage(CommandError, "project slug must be lowercase"):
                run("create_project", slug)
        assert not Project.objects.exclude(slug__in=["acme", "globex"]).exists()


class AddMemberCommandTests(BaseTestCase):
    def test_it_creates_a_user_with_a_password_and_a_role(self):
        out, _ = run("add_member", "acme", "nina", "operator", "--password", "a long password 42")
        assert out.strip() == "nina is operator in acme"
        user = get_user_model().objects.get(username="nina")
        assert user.check_password("a long password 42")
        assert Membership.objects.get(user=user, project=self.project).role == "operator"

    def test_it_changes_the_role_of_an_existing_member(self):
        run("add_member", "acme", "victor", "manager")
        assert Membership.objects.get(user=self.victor, project=self.project).role == "manager"
        assert Membership.objects.filter(user=self.victor).count() == 1

    def test_it_adds_an_existing_user_to_another_project(self):
        run("add_member", "globex", "alice", "viewer")
        assert set(
            Membership.objects.filter(user=self.alice).values_list("project__slug", "role")
        ) == {("acme", "operator"), ("globex", "viewer")}

    def test_it_does_not_create_a_user_without_a_password(self):
        with self.assertRaisesMessage(
            CommandError, "no user 'nobody'; pass --password to create one"
        ):
            run("add_member", "acme", "nobody", "viewer")
        assert not get_user_model().objects.filter(username="nobody").exists()

    def test_it_rejects_an_unknown_project_or_role(self):
        with self.assertRaisesMessage(CommandError, "no project with slug 'nope'"):
            run("add_member", "nope", "alice", "viewer")
        with self.assertRaises(CommandError):
            run("add_member", "acme", "alice", "superuser")


class CreateAgentKeyCommandTests(BaseTestCase):
    def test_it_prints_the_key_once_and_stores_only_its_digest(self):
        out, err = run("create_agent_key", "acme", "billing-bot", "--name", "laptop")
        plain = out.strip()
        assert KEY_PATTERN.match(plain)
        assert out == plain + "\n"  # stdout is the key alone, for scripts
        assert "not stored and cannot be shown again" in err
        assert plain not in err
        row = ApiKey.objects.get(prefix=plain.split("_")[1])
        assert row.name == "laptop"
        assert row.digest == _digest(plain) and row.last4 == plain[-4:]
        assert plain not in {row.digest, row.prefix, row.name, row.last4}
        assert row.agent.name == "billing-bot" and row.project == self.project
        assert api_key_verify(plain) == row

    def test_it_creates_the_agent_once_and_a_new_key_each_time(self):
        first, _ = run("create_agent_key", "acme", "billing-bot")
        second, _ = run("create_agent_key", "acme", "billing-bot")
        assert first != second
        agent = Agent.objects.get(project=self.project, name="billing-bot")
        assert ApiKey.objects.filter(agent=agent).count() == 2

    def test_it_reuses_an_existing_agent(self):
        run("create_agent_key", "acme", self.agent.name)
        assert Agent.objects.filter(project=self.project, name=self.agent.name).count() == 1
        assert ApiKey.objects.filter(agent=self.agent).count() == 2

    def test_it_rejects_an_unknown_project(self):
        with self.assertRaisesMessage(CommandError, "no project with slug 'nope'"):
            run("create_agent_key", "nope", "bot")
        assert not Agent.objects.filter(name="bot").exists()
