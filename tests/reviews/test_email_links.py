"""Review decisions from email links (issue 31): the notification email goes through
Django's SMTP backend to a real SMTP server (aiosmtpd) started here; the links are parsed
from the received message and followed: GET only confirms, POST decides once, a second
POST is 410, a tampered link 400, an expired one 410, a user who lost the role 403."""

from __future__ import annotations

import email
import email.policy
import re
import socket
import time
from email.message import EmailMessage
from unittest import mock

from aiosmtpd.controller import Controller
from django.core import signing
from django.test import override_settings

from callgate.models import Membership, ToolCall
from reviews import notifications, services, tasks
from reviews.models import (
    DecisionLink,
    EmailSubscription,
    ProjectNotifications,
    ReviewAudit,
    ReviewItem,
)
from tests.factories import BaseTestCase
from tests.reviews.fixtures import make_contract, make_item

BASE = "https://callgate.acme.test"
LINK = re.compile(re.escape(BASE) + r"(/\S+/)")
assert tasks.review_items_notify  # registered: escalation enqueues it by name


class _Inbox:
    """aiosmtpd handler: keeps every message it receives."""

    def __init__(self):
        self.received: list[tuple[list[str], EmailMessage]] = []

    async def handle_DATA(self, server, session, envelope):
        self.received.append(
            (
                list(envelope.rcpt_tos),
                email.message_from_bytes(envelope.content, policy=email.policy.default),
            )
        )
        return "250 Message accepted for delivery"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmailLinkTests(BaseTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.inbox = _Inbox()
        cls.port = _free_port()
        cls.smtp = Controller(cls.inbox, hostname="127.0.0.1", port=cls.port)
        cls.smtp.start()

    @classmethod
    def tearDownClass(cls):
        cls.smtp.stop()
        super().tearDownClass()

    def setUp(self):
        self.inbox.received.clear()
        self.settings_override = override_settings(
            EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
            EMAIL_HOST="127.0.0.1",
            EMAIL_PORT=self.port,
            EMAIL_USE_TLS=False,
            EMAIL_USE_SSL=False,
            EMAIL_TIMEOUT=5,
            CALLGATE_BASE_URL=BASE,
        )
        self.settings_override.enable()
        for user in (self.alice, self.bob, self.victor):
            user.email = f"{user.username}@acme.test"
            user.save(update_fields=["email"])
        EmailSubscription.objects.create(user=self.alice, project=self.project)

    def tearDown(self):
        self.settings_override.disable()

    def open_item(self, **kwargs) -> ReviewItem:
        with self.captureOnCommitCallbacks(execute=True):
            return make_item(self.project, self.agent, **kwargs)

    def mail_to(self, address: str) -> str:
        """The plain-text body of the one message the SMTP server received for ``address``."""
        [message] = [m for rcpt, m in self.inbox.received if address in rcpt]
        [text] = [p for p in message.walk() if p.get_content_type() == "text/plain"]
        return text.get_content().replace("\r\n", "\n")

    def links(self, body: str) -> dict[str, str]:
        """The body's decision links by their words (``Approve: <url>``), as paths."""
        found = dict(re.findall(r"^(Approve|Approve retry|Reject): (\S+)$", body, re.M))
        return {words: url.removeprefix(BASE) for words, url in found.items()}

    def test_an_opened_item_is_mailed_with_decision_links_to_subscribed_operators(self):
        ProjectNotifications.objects.create(
            project=self.project, emails="ops@acme.test, Bob@acme.test"
        )
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL, arguments={"amount": 120})
        recipients = sorted(r for rcpt, _m in self.inbox.received for r in rcpt)
        self.assertEqual(recipients, ["Bob@acme.test", "alice@acme.test", "ops@acme.test"])
        [message] = [m for rcpt, m in self.inbox.received if "alice@acme.test" in rcpt]
        self.assertIn("issue_refund", message["Subject"])
        self.assertIn("Approval requested", message["Subject"])
        self.assertIn("text/html", [p.get_content_type() for p in message.walk()])
        body = self.mail_to("alice@acme.test")
        self.assertIn(f"{BASE}/p/acme/review/{item.pk}/", body)
        self.assertIn('"amount": 120', body)
        self.assertEqual(set(self.links(body)), {"Approve", "Reject"})
        # an operator's address of the project's list gets their own links; another only the item
        self.assertEqual(set(self.links(self.mail_to("Bob@acme.test"))), {"Approve", "Reject"})
        self.assertEqual(self.links(self.mail_to("ops@acme.test")), {})
        self.assertEqual(
            set(DecisionLink.objects.values_list("user__username", flat=True)), {"alice", "bob"}
        )

    def test_nobody_subscribed_no_mail(self):
        EmailSubscription.objects.all().delete()
        self.open_item()
        self.assertEqual(self.inbox.received, [])

    def test_get_confirms_post_decides_once(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        approve = self.links(self.mail_to("alice@acme.test"))["Approve"]
        page = self.client.get(approve)
        self.assertContains(page, "Approve")
        self.assertContains(page, "issue_refund")
        self.assertEqual(self.client.head(approve).status_code, 200)
        item.refresh_from_db()
        self.assertEqual(item.status, "open")  # a mail scanner's prefetch decides nothing

        done = self.client.post(approve)
        self.assertContains(done, "Approved by alice")
        item.refresh_from_db()
        self.assertEqual(
            (item.status, item.resolution, item.resolved_by), ("resolved", "approve", self.alice)
        )
        self.assertEqual(item.call.state, ToolCall.State.ALLOWED)
        audit = ReviewAudit.objects.get(item=item, action=ReviewAudit.Action.APPROVE)
        self.assertEqual((audit.actor, audit.detail), (self.alice, {"via": "email"}))

        again = self.client.post(approve)
        self.assertContains(again, "a link decides once", status_code=410)
        self.assertContains(again, f"/p/acme/review/{item.pk}/", status_code=410)
        self.assertEqual(
            again["Cache-Control"], "max-age=0, no-cache, no-store, must-revalidate, private"
        )
        self.assertEqual(self.client.get(approve).status_code, 410)
        self.assertEqual(
            ReviewAudit.objects.filter(item=item, action=ReviewAudit.Action.APPROVE).count(), 1
        )

    def test_a_rejection_needs_a_reason_and_the_link_stays_usable(self):
        item = self.open_item()
        reject = self.links(self.mail_to("alice@acme.test"))["Reject"]
        page = self.client.get(reject)
        self.assertContains(page, services.REJECT_PRESETS[0])
        missing = self.client.post(reject, {"reason": "", "preset": ""})
        self.assertContains(missing, "Give a reason", status_code=422)
        item.refresh_from_db()
        self.assertTrue(item.is_open)
        done = self.client.post(reject, {"preset": services.REJECT_PRESETS[2]})
        self.assertEqual(done.status_code, 200)
        item.refresh_from_db()
        self.assertEqual(
            (item.resolution, item.resolution_reason), ("reject", services.REJECT_PRESETS[2])
        )

    def test_a_tampered_link_is_400(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        approve = self.links(self.mail_to("alice@acme.test"))["Approve"]
        token = approve.rstrip("/").rsplit("/", 1)[1]
        flipped = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
        tampered = approve.replace(token, flipped)
        self.assertContains(self.client.get(tampered), "not valid", status_code=400)
        self.assertEqual(self.client.post(tampered).status_code, 400)
        # a value signed with another salt (or an unknown nonce) is no link either
        forged = signing.dumps({"n": DecisionLink.objects.first().nonce})
        self.assertEqual(self.client.post(f"/integrations/email/{forged}/").status_code, 400)
        item.refresh_from_db()
        self.assertTrue(item.is_open)

    def test_an_expired_link_is_410(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        approve = self.links(self.mail_to("alice@acme.test"))["Approve"]
        later = time.time() + 24 * 3600 + 60
        with mock.patch("django.core.signing.time.time", return_value=later):
            self.assertContains(self.client.get(approve), "expired", status_code=410)
            self.assertEqual(self.client.post(approve).status_code, 410)
        item.refresh_from_db()
        self.assertTrue(item.is_open)

    def test_a_user_who_lost_the_role_is_403(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        approve = self.links(self.mail_to("alice@acme.test"))["Approve"]
        Membership.objects.filter(user=self.alice, project=self.project).update(
            role=Membership.Role.VIEWER
        )
        self.assertContains(self.client.get(approve), "operator role", status_code=403)
        self.assertEqual(self.client.post(approve).status_code, 403)
        Membership.objects.filter(user=self.alice, project=self.project).delete()
        self.assertEqual(self.client.post(approve).status_code, 403)
        item.refresh_from_db()
        self.assertTrue(item.is_open)

    def test_someone_deciding_first_is_409_and_names_them(self):
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL)
        reject = self.links(self.mail_to("alice@acme.test"))["Reject"]
        services.review_item_decide(item=item, user=self.bob, decision="approve")
        response = self.client.post(reject, {"preset": services.REJECT_PRESETS[0]})
        self.assertContains(response, "bob already decided this item", status_code=409)
        item.refresh_from_db()
        self.assertEqual(item.resolution, "approve")

    def test_cut_arguments_get_no_approve_link_and_the_page_shows_them_whole(self):
        arguments = {
            "memo": "Routine refund for order 1234, customer confirmed by phone. " * 5,
            "amount": 99999,
            "to_account": "EVIL-ACCT-1",
        }
        item = self.open_item(kind=ReviewItem.Kind.APPROVAL, arguments=arguments)
        body = self.mail_to("alice@acme.test")
        self.assertNotIn("EVIL-ACCT-1", body)  # the summary is cut before it …
        self.assertIn(notifications.ARGUMENTS_CUT, body)  # … says so, and offers no approve
        self.assertEqual(set(self.links(body)), {"Reject"})
        page = self.client.get(self.links(body)["Reject"])
        self.assertContains(page, "&quot;to_account&quot;: &quot;EVIL-ACCT-1&quot;")
        self.assertContains(page, "&quot;amount&quot;: 99999")
        # an approve link made before (or by hand) shows everything and still approves nothing
        approve = notifications.decision_link_create(
            item=item, user=self.alice, decision="approve"
        ).removeprefix(BASE)
        self.assertContains(self.client.get(approve), "EVIL-ACCT-1")
        refused = self.client.post(approve)
        self.assertContains(refused, "could not show every argument", status_code=422)
        item.refresh_from_db()
        self.assertTrue(item.is_open)

    def test_a_retry_the_observation_rules_out_gets_no_link_and_is_refused(self):
        contract = make_contract(self.project, "lookup", effect="read")
        observation = "Card declined. Do not retry this call."
        item = make_item(
            self.project, self.agent, tool="lookup", contract=contract, reason="retry_exhausted"
        )
        ToolCall.objects.filter(pk=item.call_id).update(observation=observation)
        item.refresh_from_db()
        notifications.email_notify(item=item)
        self.assertEqual(set(self.links(self.mail_to("alice@acme.test"))), {"Reject"})
        retry = notifications.decision_link_create(
            item=item, user=self.alice, decision="approve_retry"
        ).removeprefix(BASE)
        refused = self.client.post(retry)
        self.assertContains(refused, "says not to retry", status_code=422)
        item.refresh_from_db()
        self.assertTrue(item.is_open)
