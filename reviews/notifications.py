"""Review items announced outside the dashboard, and decided from there (issue 31).

A new review item (``callgate.escalation`` enqueues ``reviews.tasks.review_items_notify``
on commit) is posted to the project's Slack incoming webhook (``reviews.slack``) and
emailed (``email_notify``) to the operators who subscribed (``EmailSubscription``) and to the
project's addresses (``ProjectNotifications.emails``). An email to an operator carries
signed decision links:

    {CALLGATE_BASE_URL}/integrations/email/<token>/

``token`` is ``django.core.signing.dumps({"n": nonce}, salt=EMAIL_LINK_SALT)``: timestamped
and signed with SECRET_KEY, valid ``CALLGATE_EMAIL_LINK_MAX_AGE`` seconds; the nonce names
a ``DecisionLink`` row (item, user, decision) that the decision's transaction marks used,
so a link decides at most once. GET (or HEAD: mail scanners prefetch links) only shows a
confirmation page; its POST decides.

A Slack member is linked to a callgate user only with proof that it is theirs, without
OAuth: a click of an unlinked member on a callgate message (a request Slack signed, so its
team and user IDs are Slack's word) is answered, to that member alone, with a one-time link
``{CALLGATE_BASE_URL}/integrations/slack/link/<token>/`` (``slack_link_create``: the same
scheme with its own salt, ``SLACK_LINK_SALT``, valid ``SLACK_LINK_MAX_AGE`` seconds); the
callgate user logged in where it is opened confirms, and is linked (``slack_link_use``).

Every decision from outside goes through ``reviews.services.review_item_decide`` (the
browser's compare-and-swap, audit and reason) with ``via`` naming the channel, as a user
who is an operator (or more) of the item's project at that moment.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.core import signing
from django.core.mail import EmailMultiAlternatives, get_connection
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from callgate.labels import label
from callgate.models import Membership
from callgate.paths import absolute_url
from reviews.models import (
    DecisionLink,
    EmailSubscription,
    ProjectNotifications,
    ReviewItem,
    SlackIdentity,
    SlackLinkRequest,
)
from reviews.services import NO_RETRY_WORDS, ReviewError, allowed_decisions, review_item_decide

#: The signing salt of email decision links (no other signed value can pass for one).
EMAIL_LINK_SALT = "callgate.reviews.email-decision-link"
#: The decisions an email link may take, and the words of its button.
LINK_DECISIONS = {"approve": "Approve", "approve_retry": "Approve retry", "reject": "Reject"}
#: The longest arguments summary in a message (characters of compact JSON).
ARGUMENTS_SUMMARY_MAX = 300


def arguments_summary(arguments: object) -> str:
    """The call's (already redacted) arguments as compact JSON, cut to
    ``ARGUMENTS_SUMMARY_MAX`` characters with an ellipsis (``arguments_shown_whole`` tells
    whether it was cut)."""
    text = _compact(arguments)
    if len(text) > ARGUMENTS_SUMMARY_MAX:
        text = text[: ARGUMENTS_SUMMARY_MAX - 1] + "…"
    return text


def arguments_shown_whole(arguments: object) -> bool:
    """Whether ``arguments_summary`` shows every argument (nothing was cut)."""
    return len(_compact(arguments)) <= ARGUMENTS_SUMMARY_MAX


def arguments_full(arguments: object) -> str:
    """The call's (already redacted) arguments as indented JSON, whole: the email link's
    confirmation page shows them before anything is decided."""
    return json.dumps(arguments, ensure_ascii=False, indent=2, default=str)


def _compact(arguments: object) -> str:
    return json.dumps(arguments, ensure_ascii=False, separators=(", ", ": "), default=str)


def item_url(item: ReviewItem) -> str:
    """The item page's absolute URL (``CALLGATE_BASE_URL`` + its path)."""
    path = reverse("reviews:item", args=[item.project.slug, item.pk])
    return absolute_url(path)


def outcome(item: ReviewItem) -> str:
    """A closed item in one line: "Approved by ana at 2026-12-06 00:10 UTC: <reason>"."""
    if item.status != ReviewItem.Status.RESOLVED:
        return f"{item.get_status_display()}."
    who = item.resolved_by.get_username() if item.resolved_by else "someone"
    when = f" at {item.resolved_at:%Y-%m-%d %H:%M} UTC" if item.resolved_at else ""
    why = f": {item.resolution_reason}" if item.resolution_reason else ""
    return f"{label(item.resolution, 'decision')} by {who}{when}{why}"


def item_for_decider(*, user, item_pk: int) -> tuple[ReviewItem | None, str]:
    """``(item, "")`` when ``user`` may decide review item ``item_pk`` (an operator, manager
    or admin of its project), else ``(None, why)``: an item of a project the user is not a
    member of reads as not found, as in the browser."""
    item = (
        ReviewItem.objects.select_related("project", "call", "call__contract", "agent")
        .filter(pk=item_pk)
        .first()
    )
    membership = (
        Membership.objects.filter(user=user, project_id=item.project_id).first() if item else None
    )
    if item is None or membership is None:
        return None, "No such review item in your projects."
    if not membership.has_role(Membership.Role.OPERATOR):
        return None, (
            f"Deciding needs the operator role in {item.project.name}; "
            f"you are a {membership.get_role_display().lower()} there."
        )
    return item, ""


#: Why a message or link offers no approval when its summary had to cut the arguments.
ARGUMENTS_CUT = (
    "The message could not show every argument: open the item in callgate to approve "
    "after reading them."
)
#: Why a message or link offers no retry the observation rules out.
NO_RETRY = "The observation says not to retry: open the item in callgate to decide."


def decision_refusal(item: ReviewItem, decision: str) -> str:
    """Why a Slack message or an email link may not take ``decision`` on open ``item`` now
    ("" when it may; a closed item is left to ``review_item_decide``, which says who decided).

    The safe design, for both channels: an approval is offered (and taken) only when
    everything the approver has to see was in the message. So no approve or approve retry
    when the arguments summary was cut (``arguments_shown_whole``: a long first argument
    would hide the amount and the account behind it); none of a retry the observation says
    not to retry (``NO_RETRY_WORDS``, as the queue's one-key approve,
    ``services.queue_approve_action``); and none the item's state forbids
    (``allowed_decisions``: an unknown outcome not looked up). Reject is always possible."""
    if decision == "reject" or not item.is_open:
        return ""
    if not arguments_shown_whole(item.call.arguments):
        return ARGUMENTS_CUT
    if (
        decision == "approve_retry"
        and item.kind != ReviewItem.Kind.APPROVAL
        and NO_RETRY_WORDS in (item.call.observation or "").lower()
    ):
        return NO_RETRY
    return allowed_decisions(item)[decision]


def decide(*, item: ReviewItem, user, decision: str, reason: str, via: str) -> ReviewItem:
    """``review_item_decide`` for a decision taken outside the browser (``via``: "slack",
    "email"); only the decisions a link or button offers now (``decision_refusal``), so a
    click or link made before the item changed, or a forged value, decides nothing. Raises
    ``ReviewError`` (with the refusal) and what ``review_item_decide`` raises."""
    if decision not in LINK_DECISIONS:
        raise ReviewError(f"Unknown decision {decision!r}.")
    if why := decision_refusal(item, decision):
        raise ReviewError(why)
    return review_item_decide(item=item, user=user, decision=decision, reason=reason, via=via)


def offered_decisions(item: ReviewItem) -> list[str]:
    """The decisions a message offers for open ``item``: the one approval it allows now (an
    approval request's approve, or an escalation's approve retry) unless
    ``decision_refusal`` rules it out, then reject."""
    if not item.is_open:
        return []
    approve = [d for d in ("approve", "approve_retry") if not decision_refusal(item, d)][:1]
    return [*approve, "reject"]


# --- email decision links ----------------------------------------------------------------------


class LinkError(Exception):
    """A decision link that cannot be used; ``status`` is the HTTP answer (400 tampered,
    410 used or expired, 403 the user lost the role) and the message is for the page."""

    def __init__(self, message: str, *, status: int, item: ReviewItem | None = None):
        super().__init__(message)
        self.status = status
        self.item = item  # the link's item, to point at, when the link is only used up


def decision_link_create(*, item: ReviewItem, user, decision: str) -> str:
    """A new single-use link for ``user`` to take ``decision`` on ``item``: its absolute URL."""
    link = DecisionLink.objects.create(
        nonce=secrets.token_hex(16),
        project_id=item.project_id,
        item=item,
        user=user,
        decision=decision,
    )
    token = signing.dumps({"n": link.nonce}, salt=EMAIL_LINK_SALT, compress=True)
    return absolute_url(reverse("email-decision", args=[token]))


def decision_link_read(token: str) -> DecisionLink:
    """The link ``token`` names, with its item and user, if it can still decide. Raises
    ``LinkError``: 400 tampered (bad signature, unknown nonce), 410 expired (older than
    ``CALLGATE_EMAIL_LINK_MAX_AGE``) or used, 403 its user is no longer an operator of the
    project (or is deactivated)."""
    try:
        data = signing.loads(
            token, salt=EMAIL_LINK_SALT, max_age=settings.CALLGATE_EMAIL_LINK_MAX_AGE
        )
    except signing.SignatureExpired as exc:
        raise LinkError(
            "This decision link has expired. Open the item in callgate to decide.", status=410
        ) from exc
    except signing.BadSignature as exc:
        raise LinkError(
            "This decision link is not valid: it was changed or cut. Use the whole link from "
            "the email, or open the item in callgate.",
            status=400,
        ) from exc
    link = (
        DecisionLink.objects.select_related(
            "user", "item", "item__project", "item__call", "item__call__contract", "item__agent"
        )
        .filter(nonce=data.get("n") if isinstance(data, dict) else None)
        .first()
    )
    if link is None or link.decision not in LINK_DECISIONS:
        raise LinkError("This decision link is not valid.", status=400)
    if link.used_at is not None:
        raise LinkError(
            f"This decision link was used at {link.used_at:%Y-%m-%d %H:%M} UTC; a link decides once.",
            status=410,
            item=link.item,
        )
    item, why = item_for_decider(user=link.user, item_pk=link.item_id)
    if item is None or not link.user.is_active:
        raise LinkError(why or "Your account is deactivated.", status=403)
    return link


def decision_link_use(*, token: str, reason: str = "") -> ReviewItem:
    """Take the decision of link ``token`` as its user: the link is marked used in the
    decision's transaction (a second use, or two at once, is a 410), so a decision that
    fails (someone else decided first: ``ReviewConflict``; a missing reason:
    ``ReviewError``) leaves it unused. Raises ``LinkError`` as ``decision_link_read``."""
    with transaction.atomic():
        link = decision_link_read(token)
        used = DecisionLink.objects.filter(pk=link.pk, used_at=None).update(used_at=timezone.now())
        if not used:
            raise LinkError("This decision link was used already; a link decides once.", status=410)
        return decide(
            item=link.item, user=link.user, decision=link.decision, reason=reason, via="email"
        )


# --- linking a Slack member ------------------------------------------------------------------------

#: The signing salt of Slack link tokens (no email link or other signed value passes for one).
SLACK_LINK_SALT = "callgate.reviews.slack-link"
#: How long a Slack link is valid, in seconds: it is sent at the click and used at once.
SLACK_LINK_MAX_AGE = 15 * 60


def slack_link_create(*, team_id: str, slack_user_id: str) -> str:
    """A one-time link that links Slack member ``slack_user_id`` of workspace ``team_id``
    (proven by a Slack-signed request) to the callgate user who opens it: its absolute URL,
    ``{CALLGATE_BASE_URL}/integrations/slack/link/<token>/``; ``token`` is
    ``signing.dumps({"n": nonce}, salt=SLACK_LINK_SALT)``, valid ``SLACK_LINK_MAX_AGE``
    seconds, its nonce naming a ``SlackLinkRequest``."""
    request = SlackLinkRequest.objects.create(
        nonce=secrets.token_hex(16), team_id=team_id, slack_user_id=slack_user_id
    )
    token = signing.dumps({"n": request.nonce}, salt=SLACK_LINK_SALT, compress=True)
    return absolute_url(reverse("slack-link", args=[token]))


def slack_link_read(token: str) -> SlackLinkRequest:
    """The link request ``token`` names, if it can still link. Raises ``LinkError``: 400
    tampered (bad signature, unknown nonce), 410 expired (older than
    ``SLACK_LINK_MAX_AGE``) or used."""
    try:
        data = signing.loads(token, salt=SLACK_LINK_SALT, max_age=SLACK_LINK_MAX_AGE)
    except signing.SignatureExpired as exc:
        raise LinkError(
            "This link has expired. Click a button of a callgate message in Slack again "
            "for a new one.",
            status=410,
        ) from exc
    except signing.BadSignature as exc:
        raise LinkError(
            "This link is not valid: it was changed or cut. Use the whole link from Slack.",
            status=400,
        ) from exc
    request = SlackLinkRequest.objects.filter(
        nonce=data.get("n") if isinstance(data, dict) else None
    ).first()
    if request is None:
        raise LinkError("This link is not valid.", status=400)
    if request.used_at is not None:
        raise LinkError(
            f"This link was used at {request.used_at:%Y-%m-%d %H:%M} UTC; a link links once.",
            status=410,
        )
    return request


#: Why a Slack link cannot link a member another callgate user holds.
SLACK_MEMBER_TAKEN = (
    "This Slack member is linked to another callgate user. They can unlink it on their "
    "Notifications page; nothing was changed."
)


def slack_member_taken(*, request: SlackLinkRequest, user) -> bool:
    """Whether the Slack member of link ``request`` is linked to a user other than ``user``."""
    return (
        SlackIdentity.objects.filter(team_id=request.team_id, slack_user_id=request.slack_user_id)
        .exclude(user=user)
        .exists()
    )


def slack_link_use(*, token: str, user) -> SlackIdentity:
    """Link the Slack member of link ``token`` to ``user`` (replacing the user's previous
    link), once. Raises ``LinkError`` as ``slack_link_read``, and 409 when that Slack
    member is linked to another callgate user (who must unlink it first: nothing changes)."""
    with transaction.atomic():
        request = slack_link_read(token)
        holder = (
            SlackIdentity.objects.select_for_update()
            .filter(team_id=request.team_id, slack_user_id=request.slack_user_id)
            .first()
        )
        if holder is not None and holder.user_id != user.pk:
            raise LinkError(SLACK_MEMBER_TAKEN, status=409)
        used = SlackLinkRequest.objects.filter(pk=request.pk, used_at=None).update(
            used_at=timezone.now(), used_by=user
        )
        if not used:
            raise LinkError("This link was used already; a link links once.", status=410)
        if holder is not None:
            return holder
        SlackIdentity.objects.filter(user=user).delete()
        try:
            with transaction.atomic():
                return SlackIdentity.objects.create(
                    user=user, team_id=request.team_id, slack_user_id=request.slack_user_id
                )
        except IntegrityError as exc:  # another user linked the member a moment ago
            raise LinkError(SLACK_MEMBER_TAKEN, status=409) from exc


# --- who is told --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipient:
    """One address to email about an item, and the user whose decision links it gets (None:
    only the item's link)."""

    address: str
    user: object | None


def email_recipients(project_id: int) -> list[Recipient]:
    """The subscribed operators of the project (by their account's address), then the
    project's addresses; an address of an operator of the project gets that operator's
    links. One message per address."""
    operators = {
        m.user.email.lower(): m.user
        for m in Membership.objects.select_related("user").filter(
            project_id=project_id,
            role__in=[Membership.Role.OPERATOR, Membership.Role.MANAGER, Membership.Role.ADMIN],
            user__is_active=True,
        )
        if m.user.email
    }
    subscribed = set(
        EmailSubscription.objects.filter(project_id=project_id).values_list("user_id", flat=True)
    )
    found: dict[str, Recipient] = {}
    for address, user in operators.items():
        if user.pk in subscribed:
            found[address] = Recipient(user.email, user)
    config = ProjectNotifications.objects.filter(project_id=project_id).first()
    for address in config.email_list() if config else []:
        found.setdefault(address.lower(), Recipient(address, operators.get(address.lower())))
    return list(found.values())


def email_notify(*, item: ReviewItem) -> int:
    """Email every recipient of the item's project about ``item`` (plain text and HTML),
    each operator with their own decision links. Returns how many messages were sent;
    raises what the mail backend raises (``smtplib.SMTPException``, ``OSError``)."""
    if not item.is_open:
        return 0
    recipients = email_recipients(item.project_id)
    if not recipients:
        return 0
    decisions = offered_decisions(item)
    reason = label(item.reason, "reason")
    kind = "Approval requested" if item.kind == ReviewItem.Kind.APPROVAL else "Review needed"
    subject = f"[callgate] {kind}: {item.call.tool_name} · {reason}"
    messages = []
    for recipient in recipients:
        links = (
            [
                (
                    LINK_DECISIONS[d],
                    decision_link_create(item=item, user=recipient.user, decision=d),
                )
                for d in decisions
            ]
            if recipient.user is not None
            else []
        )
        context = {
            "item": item,
            "kind": kind,
            "reason": reason,
            "item_url": item_url(item),
            "links": links,
            "arguments": arguments_summary(item.call.arguments),
            "arguments_cut": ARGUMENTS_CUT
            if not arguments_shown_whole(item.call.arguments)
            else "",
            "max_age_hours": settings.CALLGATE_EMAIL_LINK_MAX_AGE // 3600,
        }
        message = EmailMultiAlternatives(
            subject,
            render_to_string("reviews/email/item_opened.txt", context),
            None,
            [recipient.address],
        )
        message.attach_alternative(
            render_to_string("reviews/email/item_opened.html", context), "text/html"
        )
        messages.append(message)
    with get_connection() as connection:
        return connection.send_messages(messages) or 0


def review_items_channels(item_ids: list[int]) -> tuple[list[int], list[int]]:
    """Of the new items ``item_ids``, those still open whose project posts to Slack, and
    those whose project has anyone to email: ``(slack, email)``. Three queries whatever
    the number of items (most projects have neither: nothing more happens)."""
    items = list(
        ReviewItem.objects.filter(pk__in=item_ids, status__in=ReviewItem.OPEN_STATUSES).values_list(
            "pk", "project_id"
        )
    )
    projects = {project_id for _pk, project_id in items}
    configs = {
        c.project_id: c for c in ProjectNotifications.objects.filter(project_id__in=projects)
    }
    subscribed = set(
        EmailSubscription.objects.filter(project_id__in=projects).values_list(
            "project_id", flat=True
        )
    )
    slack = [pk for pk, p in items if p in configs and configs[p].slack_webhook_url]
    email = [pk for pk, p in items if p in subscribed or (p in configs and configs[p].emails)]
    return slack, email


def slack_webhook_of(item: ReviewItem) -> str:
    """The item's project's Slack incoming webhook URL ("" when none)."""
    config = ProjectNotifications.objects.filter(project_id=item.project_id).first()
    return config.slack_webhook_url if config else ""


# --- the Notifications page's writes ------------------------------------------------------------


def slack_identity_of(user) -> SlackIdentity | None:
    """The Slack member ``user`` linked, if any."""
    return SlackIdentity.objects.filter(user=user).first()


def email_subscribed(*, user, project_id: int) -> bool:
    """Whether ``user`` gets the project's review item emails."""
    return EmailSubscription.objects.filter(user=user, project_id=project_id).exists()


def slack_identity_remove(*, user) -> None:
    """Unlink ``user`` from Slack: clicks of that Slack member decide nothing any more."""
    SlackIdentity.objects.filter(user=user).delete()


def email_subscription_set(*, user, project_id: int, subscribed: bool) -> None:
    """Subscribe ``user`` to the project's review item emails, or unsubscribe."""
    if subscribed:
        EmailSubscription.objects.get_or_create(user=user, project_id=project_id)
    else:
        EmailSubscription.objects.filter(user=user, project_id=project_id).delete()
