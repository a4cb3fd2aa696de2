"""Review decisions from Slack (issue 31): the interactive message posted when an item
opens, and clicks on it sent back to ``POST /integrations/slack/actions`` exactly as Slack
sends them: a form-encoded ``payload`` (``block_actions`` JSON) signed the documented v0
way (``v0=`` + hex HMAC-SHA256 of ``v0:{timestamp}:{raw body}`` with the signing secret).
Outbound HTTP (the incoming webhook, ``response_url``) is an ``httpx.MockTransport``."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from unittest import mock
from urllib.parse import urlencode

import httpx
from django.core import signing
from django.test import override_settings

from callgate.models import Membership, ToolCall
from reviews import notifications, services, slack, tasks
from reviews.models import (
    ProjectNotifications,
    ReviewAudit,
    ReviewItem,
    SlackIdentity,
    SlackLinkRequest,
)
from tests.factories import WEATHER, BaseTestCase
from tests.reviews.fixtures import make_contract, make_item

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
#: A long first argument that a 300-character summary cuts before the ones that matter.
LONG_ARGUMENTS = {
    "memo": "Routine refund for order 1234, customer confirmed by phone. " * 5,
    "amount": 99999,
    "to_account": "EVIL-ACCT-1",
}
NO_RETRY_OBSERVATION = "Card declined. Do not retry this call."
WEBHOOK = "https://hooks.slack.com/services/T0ACME/B0REVIEW/abcdefghijklmnop"
RESPONSE_URL = "https://hooks.slack.com/actions/T0ACME/123/xyz"
BASE = "https://callgate.acme.test"
assert tasks.review_items_notify  # registered: escalation enqueues it by name


@override_settings(
    CALLGATE_SLACK_SIGNING_SECRET=SECRET,
    CALLGATE_BASE_URL=BASE,
    CALLGATE_OUTBOUND_ALLOW=["hooks.slack.com"],  # reached by name: no DNS look-up in the tests
)
class SlackTestCase(BaseTestCase):
    def setUp(self):
        self.posted: list[tuple[str, dict]] = []

        def handler(request: httpx.Request) -> httpx.Response:
            self.posted.append((str(request.url), json.loads(request.content)))
            return httpx.Response(200, text="ok")

        self._transport = slack.TRANSPORT
        slack.TRANSPORT = httpx.MockTransport(handler)
        ProjectNotifications.objects.create(project=self.project, slack_webhook_url=WEBHOOK)
        SlackIdentity.objects.create(user=self.alice, team_id="T0ACME", slack_user_id="U0ALICE")

    def tearDown(self):
        slack.TRANSPORT = self._transport

    def open_item(self, **kwargs) -> ReviewItem:
        with self.captureOnCommitCallbacks(execute=True):
            return make_item(self.project, self.agent, **kwargs)

    def message_of(self, item: ReviewItem) -> dict:
        [body] = [body for url, body in self.posted if url == WEBHOOK]
        return body

    def action_of(self, message: dict, action_id: str, option: int | None = None) -> dict:
        """The element of the posted message a click on which Slack reports."""
        [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
        [element] = [e for e in actions["elements"] if e.get("action_id") == action_id]
        action = {
            "action_id": element["action_id"],
            "block_id": actions["block_id"],
            "type": element["type"],
            "action_ts": f"{time.time():.6f}",
        }
        if option is None:
            action |= {"value": element["value"], "text": element["text"]}
        else:
            action["selected_option"] = element["options"][option]
        return action

    def payload(self, action: dict, *, user: str = "U0ALICE", team: str = "T0ACME") -> dict:
        return {
            "type": "block_actions",
            "user": {"id": user, "username": "someone", "name": "someone", "team_id": team},
            "api_app_id": "A0CALLGATE",
            "token": "legacy-verification-token",
            "container": {
                "type": "message",
                "message_ts": "1733443200.000100",
                "channel_id": "C0REVIEW",
                "is_ephemeral": False,
            },
            "trigger_id": "123.456.abc",
            "team": {"id": team, "domain": "acme"},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": "C0REVIEW", "name": "reviews"},
            "state": {"values": {}},
            "response_url": RESPONSE_URL,
            "actions": [action],
        }

    def click(self, payload: dict, *, secret: str = SECRET, age: int = 0, sign: bool = True):
        """POST ``payload`` as Slack does: form-encoded, signed over the raw body."""
        body = urlencode({"payload": json.dumps(payload)})
        timestamp = str(int(time.time()) - age)
        base = f"v0:{timestamp}:{body}".encode()
        signature = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
        headers = {"X-Slack-Request-Timestamp": timestamp}
        if sign:
            headers["X-Slack-Signature"] = signature
        with self.captureOnCommitCallbacks(execute=True):
            return self.client.post(
                "/integrations/slack/actions",
                data=body,
                content_type="application/x-www-form-urlencoded",
                headers=headers,
            )

    def responses(self) -> list[dict]:
        return [body for url, body in self.posted if url == RESPONSE_URL]


class SlackMessageTests(SlackTestCase):
    def test_it_posts_an_interactive_message_when_an_item_opens(self):
        item = self.open_item(arguments={"ticket_id": "T-4242", "card_number": "•••"})
        message = self.message_of(item)
        text = json.dumps(message, ensure_ascii=False)
        self.assertIn("create_follow_up", text)
        self.assertIn("support-bot", text)
        self.assertIn("Outcome unknown", text)  # the reason's label, not its slug
        self.assertIn("T-4242", text)
        self.assertIn(f"{BASE}/p/acme/review/{item.pk}/", text)
        [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
        reject = [e for e in actions["elements"] if e["action_id"] == slack.ACTION_REJECT][0]
        self.assertEqual(reject["options"][0]["value"], f"reject:{item.pk}:0")
        # an unknown outcome not looked up yet: no approve retry offered in Slack
        self.assertNotIn(slack.ACTION_APPROVE, [e["action_id"] for e in actions["elements"]])

    def test_an_approval_request_gets_an_approve_button_carrying_the_item_id(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        button = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        self.assertEqual(button["value"], f"approve:{item.pk}")

    def test_an_approval_asked_at_the_gate_is_posted_and_approved_from_slack(self):
        api = self.api()
        contract = {**WEATHER, "requires_approval": True}
        self.assertEqual(api.put("/api/v1/tools/pay", contract, format="json").status_code, 201)
        body = {"format": "plain", "call": {"tool": "pay", "arguments": {"city": "Oslo"}}}
        with self.captureOnCommitCallbacks(execute=True):
            answer = api.post("/api/v1/calls", body, format="json").json()
        self.assertEqual(answer["verdict"], "pending_approval")
        item = ReviewItem.objects.get(call__operation_id=answer["operation_id"])
        self.assertIn("Oslo", json.dumps(self.message_of(item)))
        self.click(self.payload(self.action_of(self.message_of(item), slack.ACTION_APPROVE)))
        decided = api.get(f"/api/v1/calls/{answer['operation_id']}").json()
        self.assertEqual(
            (decided["decision"]["decision"], decided["state"]), ("approve", "allowed")
        )

    def test_a_project_without_a_webhook_posts_nothing(self):
        ProjectNotifications.objects.filter(project=self.project).delete()
        self.open_item()
        self.assertEqual(self.posted, [])

    def test_a_refused_webhook_address_posts_nothing(self):
        ProjectNotifications.objects.filter(project=self.project).update(
            slack_webhook_url="http://10.0.0.5/hook"
        )
        self.open_item()
        self.assertEqual(self.posted, [])

    def test_a_failed_post_is_retried_by_celery(self):
        answers = iter([503, 200])

        def handler(request: httpx.Request) -> httpx.Response:
            self.posted.append((str(request.url), json.loads(request.content)))
            return httpx.Response(next(answers))

        slack.TRANSPORT = httpx.MockTransport(handler)
        self.open_item()
        self.assertEqual(len(self.posted), 2)  # the 503, then Celery's retry

    def test_cut_arguments_offer_no_approve_only_reject_and_open(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL, arguments=LONG_ARGUMENTS)
        message = self.message_of(item)
        text = json.dumps(message, ensure_ascii=False)
        self.assertNotIn("EVIL-ACCT-1", text)  # the summary is cut before it …
        self.assertIn(notifications.ARGUMENTS_CUT, text)  # … and says so
        [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
        ids = [e["action_id"] for e in actions["elements"]]
        self.assertEqual(ids, [slack.ACTION_REJECT, "callgate.open"])

    def no_retry_item(self, observation: str) -> ReviewItem:
        contract = make_contract(self.project, "lookup", effect="read")
        item = make_item(
            self.project, self.agent, tool="lookup", contract=contract, reason="retry_exhausted"
        )
        ToolCall.objects.filter(pk=item.call_id).update(observation=observation)
        item.refresh_from_db()
        return item

    def test_a_retry_the_observation_rules_out_is_not_offered(self):
        offered = self.no_retry_item("Timed out after 3 attempts.")
        self.assertEqual(notifications.offered_decisions(offered), ["approve_retry", "reject"])
        refused = self.no_retry_item(NO_RETRY_OBSERVATION)
        self.assertEqual(notifications.offered_decisions(refused), ["reject"])
        self.assertNotIn(slack.ACTION_APPROVE, json.dumps(slack.slack_message(refused)))


class SlackActionTests(SlackTestCase):
    def test_a_signed_click_approves_as_the_linked_user(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        response = self.click(self.payload(action))
        self.assertEqual(response.status_code, 200)
        item.refresh_from_db()
        self.assertEqual((item.status, item.resolution), ("resolved", "approve"))
        self.assertEqual(item.resolved_by, self.alice)
        self.assertEqual(item.call.state, ToolCall.State.ALLOWED)
        audit = ReviewAudit.objects.get(item=item, action=ReviewAudit.Action.APPROVE)
        self.assertEqual((audit.actor, audit.detail), (self.alice, {"via": "slack"}))
        [reply] = self.responses()
        self.assertTrue(reply["replace_original"])
        self.assertIn("Approved by alice", json.dumps(reply))
        self.assertNotIn("actions", [b["type"] for b in reply["blocks"]])
        self.client.force_login(self.bob)
        page = self.client.get(f"/p/acme/review/{item.pk}/")
        self.assertContains(page, '<span class="muted">in Slack</span>')

    def test_a_rejection_takes_the_preset_reason_the_agent_reads(self):
        item = self.open_item()
        action = self.action_of(self.message_of(item), slack.ACTION_REJECT, option=1)
        self.click(self.payload(action))
        item.refresh_from_db()
        self.assertEqual(item.resolution, "reject")
        self.assertEqual(item.resolution_reason, services.REJECT_PRESETS[1])
        self.assertIn(services.REJECT_PRESETS[1], item.call.observation)

    def test_a_bad_signature_is_401_and_decides_nothing(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        response = self.click(self.payload(action), secret="not-the-secret")
        self.assertEqual(response.status_code, 401)
        response = self.click(self.payload(action), sign=False)
        self.assertEqual(response.status_code, 401)
        with override_settings(CALLGATE_SLACK_SIGNING_SECRET=""):  # not configured: all refused
            self.assertEqual(self.click(self.payload(action)).status_code, 401)
        item.refresh_from_db()
        self.assertEqual(item.status, "open")
        self.assertEqual(self.responses(), [])

    def test_a_timestamp_older_than_five_minutes_is_401(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        response = self.click(self.payload(action), age=6 * 60)
        self.assertEqual(response.status_code, 401)
        item.refresh_from_db()
        self.assertEqual(item.status, "open")

    def test_an_unreadable_payload_is_400_naming_the_field(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        payload = self.payload(action)
        del payload["response_url"]
        response = self.click(payload)
        self.assertEqual(response.status_code, 400)
        self.assertIn("response_url", response.json()["detail"])
        payload = self.payload({**action, "value": "approve:not-a-number"})
        response = self.click(payload)
        self.assertEqual(response.status_code, 400)
        self.assertIn("actions[0].value", response.json()["detail"])

    def test_a_payload_nested_too_deep_for_json_is_400_naming_payload(self):
        for raw in ("[" * 50000 + "]" * 50000, '{"a":' * 5000 + "1" + "}" * 5000):
            body = urlencode({"payload": raw})
            timestamp = str(int(time.time()))
            signature = hmac.new(
                SECRET.encode(), f"v0:{timestamp}:{body}".encode(), hashlib.sha256
            ).hexdigest()
            response = self.client.post(
                "/integrations/slack/actions",
                data=body,
                content_type="application/x-www-form-urlencoded",
                headers={
                    "X-Slack-Request-Timestamp": timestamp,
                    "X-Slack-Signature": f"v0={signature}",
                },
            )
            self.assertEqual(response.status_code, 400)
            self.assertEqual(response.json()["error"], "payload")

    def forged_click(self, value: str) -> dict:
        """A click on a button the message did not offer (an old message, a crafted value)."""
        return self.payload(
            {"action_id": slack.ACTION_APPROVE, "block_id": "b", "type": "button", "value": value}
        )

    def test_an_approve_of_cut_arguments_is_refused_if_clicked_anyway(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL, arguments=LONG_ARGUMENTS)
        self.click(self.forged_click(f"approve:{item.pk}"))
        self.assert_ephemeral_and_open(item, "could not show every argument")

    def test_a_retry_the_observation_rules_out_is_refused_if_clicked_anyway(self):
        contract = make_contract(self.project, "lookup", effect="read")
        item = self.open_item(tool="lookup", contract=contract, reason="retry_exhausted")
        ToolCall.objects.filter(pk=item.call_id).update(observation=NO_RETRY_OBSERVATION)
        self.click(self.forged_click(f"approve_retry:{item.pk}"))
        self.assert_ephemeral_and_open(item, "says not to retry")
        self.assertFalse(ReviewAudit.objects.filter(item=item, action="approve_retry").exists())

    def assert_ephemeral_and_open(self, item: ReviewItem, words: str) -> None:
        [reply] = self.responses()
        self.assertEqual(reply["response_type"], "ephemeral")
        self.assertFalse(reply["replace_original"])
        self.assertIn(words, reply["text"])
        item.refresh_from_db()
        self.assertTrue(item.is_open)

    def test_an_unlinked_slack_user_gets_an_ephemeral_reply(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        self.click(self.payload(action, user="U0STRANGER"))
        self.assert_ephemeral_and_open(item, "not linked")
        self.assertIn(f"<{BASE}/integrations/slack/link/", self.responses()[0]["text"])

    def test_the_same_member_id_in_another_workspace_is_not_linked(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        self.click(self.payload(action, team="T0OTHER"))
        self.assert_ephemeral_and_open(item, "not linked")

    def test_a_viewer_decides_nothing(self):
        SlackIdentity.objects.create(user=self.victor, team_id="T0ACME", slack_user_id="U0VICTOR")
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        self.click(self.payload(action, user="U0VICTOR"))
        self.assert_ephemeral_and_open(item, "needs the operator role")

    def test_another_tenants_operator_decides_nothing_and_learns_nothing(self):
        SlackIdentity.objects.create(user=self.olga, team_id="T0ACME", slack_user_id="U0OLGA")
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        self.click(self.payload(action, user="U0OLGA"))
        self.assert_ephemeral_and_open(item, "No such review item")

    def test_an_item_claimed_by_someone_else_is_not_decided(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        services.review_item_claim(item=item, user=self.bob)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        self.click(self.payload(action))
        self.assert_ephemeral_and_open(item, "bob claimed this item")

    def test_a_second_click_says_who_decided_already(self):
        SlackIdentity.objects.create(user=self.bob, team_id="T0ACME", slack_user_id="U0BOB")
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        self.click(self.payload(action, user="U0BOB"))
        self.posted.clear()
        self.click(self.payload(action))
        [reply] = self.responses()
        self.assertEqual(reply["response_type"], "ephemeral")
        self.assertIn("bob already decided this item", reply["text"])
        item.refresh_from_db()
        self.assertEqual(item.resolved_by, self.bob)
        self.assertEqual(
            ReviewAudit.objects.filter(item=item, action=ReviewAudit.Action.APPROVE).count(), 1
        )

    def test_a_demoted_operator_decides_nothing(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        Membership.objects.filter(user=self.alice, project=self.project).update(
            role=Membership.Role.VIEWER
        )
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        self.click(self.payload(action))
        self.assert_ephemeral_and_open(item, "needs the operator role")


class NotificationSettingsTests(SlackTestCase):
    def url(self) -> str:
        return "/p/acme/review/notifications/"

    def test_the_page_shows_the_linked_member_unlinks_and_takes_no_typed_id(self):
        self.client.force_login(self.alice)
        page = self.client.get(self.url())
        self.assertContains(page, "U0ALICE")
        self.assertContains(page, "How to link")
        self.assertNotContains(page, 'name="slack_user_id"')
        # the typed-ID form is gone: posting one links nothing
        self.client.force_login(self.bob)
        response = self.client.post(
            self.url(), {"form": "slack", "team_id": "T0ACME", "slack_user_id": "U0BOB"}
        )
        self.assertEqual(response.status_code, 400)
        self.assertFalse(SlackIdentity.objects.filter(user=self.bob).exists())
        self.client.force_login(self.alice)
        self.assertEqual(self.client.post(self.url(), {"form": "slack_remove"}).status_code, 302)
        self.assertFalse(SlackIdentity.objects.filter(user=self.alice).exists())

    def test_a_manager_sets_the_projects_webhook_and_a_refused_address_is_422(self):
        self.client.force_login(self.maria)
        response = self.client.post(
            self.url(),
            {"form": "project", "slack_webhook_url": "http://169.254.169.254/x", "emails": ""},
        )
        self.assertContains(response, "callgate may not post to this address", status_code=422)
        response = self.client.post(
            self.url(),
            {"form": "project", "slack_webhook_url": WEBHOOK, "emails": "ops@acme.test, nope"},
        )
        self.assertContains(response, "is not an email address", status_code=422)
        response = self.client.post(
            self.url(), {"form": "project", "slack_webhook_url": WEBHOOK, "emails": "ops@acme.test"}
        )
        self.assertEqual(response.status_code, 302)
        self.assertEqual(
            ProjectNotifications.objects.get(project=self.project).emails, "ops@acme.test"
        )

    def test_an_operator_cannot_change_the_projects_settings(self):
        self.client.force_login(self.alice)
        response = self.client.post(
            self.url(), {"form": "project", "slack_webhook_url": "", "emails": "me@evil.test"}
        )
        self.assertEqual(response.status_code, 403)
        self.assertEqual(ProjectNotifications.objects.get(project=self.project).emails, "")

    def test_an_unknown_form_is_400_and_another_tenant_is_404(self):
        self.client.force_login(self.alice)
        self.assertEqual(self.client.post(self.url(), {"form": "nope"}).status_code, 400)
        self.assertEqual(self.client.get("/p/globex/review/notifications/").status_code, 404)

    def test_a_decision_taken_in_the_browser_shows_no_via(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        services.review_item_decide(item=item, user=self.alice, decision="approve")
        audit = ReviewAudit.objects.get(item=item, action=ReviewAudit.Action.APPROVE)
        self.assertEqual(audit.detail, {})


class SlackLinkTests(SlackTestCase):
    """Linking by proof: only a Slack-signed click of the member earns the link."""

    def link_of_click(self, user: str, team: str = "T0ACME") -> str:
        """The path of the link an unlinked member's click is answered with."""
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        action = self.action_of(self.message_of(item), slack.ACTION_APPROVE)
        self.posted.clear()
        self.click(self.payload(action, user=user, team=team))
        [reply] = self.responses()
        self.posted.clear()
        [url] = re.findall(r"<(\S+?)\|", reply["text"])
        self.assertTrue(url.startswith(f"{BASE}/integrations/slack/link/"))
        return url.removeprefix(BASE)

    def test_a_signed_click_earns_a_link_that_links_the_member_to_who_confirms(self):
        link = self.link_of_click("U0BOB")
        item = ReviewItem.objects.get()
        self.assertTrue(item.is_open)  # the click decided nothing
        self.assertEqual(self.client.get(link).status_code, 302)  # the login page first
        self.client.force_login(self.bob)
        page = self.client.get(link)
        self.assertContains(page, "U0BOB")
        self.assertContains(page, "Link to bob")
        self.assertFalse(SlackIdentity.objects.filter(user=self.bob).exists())  # GET links nothing
        done = self.client.post(link)
        self.assertContains(done, "is linked to bob")
        identity = SlackIdentity.objects.get(user=self.bob)
        self.assertEqual((identity.team_id, identity.slack_user_id), ("T0ACME", "U0BOB"))
        self.assertContains(self.client.post(link), "a link links once", status_code=410)
        # the member's next click decides as bob
        action = self.action_of(slack.slack_message(item), slack.ACTION_APPROVE)
        self.click(self.payload(action, user="U0BOB"))
        item.refresh_from_db()
        self.assertEqual((item.resolution, item.resolved_by), ("approve", self.bob))

    def test_a_member_linked_to_another_user_is_refused_and_nothing_changes(self):
        link = self.link_of_click("U0BOB")
        SlackIdentity.objects.create(user=self.victor, team_id="T0ACME", slack_user_id="U0BOB")
        self.client.force_login(self.bob)
        page = self.client.get(link)
        self.assertContains(page, "linked to another callgate user", status_code=409)
        self.assertNotContains(page, "Link to bob", status_code=409)
        response = self.client.post(link)
        self.assertContains(response, "linked to another callgate user", status_code=409)
        self.assertEqual(SlackIdentity.objects.get(slack_user_id="U0BOB").user, self.victor)
        self.assertFalse(SlackIdentity.objects.filter(user=self.bob).exists())

    def test_a_tampered_expired_or_foreign_token_links_nothing(self):
        link = self.link_of_click("U0BOB")
        self.client.force_login(self.bob)
        token = link.rstrip("/").rsplit("/", 1)[1]
        tampered = link.replace(token, token[:-2] + ("AA" if token[-2:] != "AA" else "BB"))
        self.assertContains(self.client.post(tampered), "not valid", status_code=400)
        # an email decision link's token (another salt) is no Slack link
        nonce = SlackLinkRequest.objects.get().nonce
        forged = signing.dumps({"n": nonce}, salt=notifications.EMAIL_LINK_SALT, compress=True)
        self.assertEqual(self.client.post(f"/integrations/slack/link/{forged}/").status_code, 400)
        later = time.time() + notifications.SLACK_LINK_MAX_AGE + 60
        with mock.patch("django.core.signing.time.time", return_value=later):
            self.assertContains(self.client.post(link), "expired", status_code=410)
        self.assertFalse(SlackIdentity.objects.filter(user=self.bob).exists())

    def test_linking_replaces_the_users_previous_member(self):
        link = self.link_of_click("U0ALICE2")
        self.client.force_login(self.alice)
        self.assertContains(self.client.get(link), "This replaces your link")
        self.client.post(link)
        self.assertEqual(
            list(SlackIdentity.objects.filter(user=self.alice).values_list("slack_user_id")),
            [("U0ALICE2",)],
        )
