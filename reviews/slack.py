"""Review decisions from Slack (issue 31).

Out: when a review item opens, ``reviews.tasks.slack_notify`` posts ``slack_message(item)``
(Block Kit: the call's tool, agent, reason, an arguments summary, a link to the item page,
Approve / Reject) to the project's incoming webhook (``ProjectNotifications.
slack_webhook_url``).

In: Slack POSTs a click to ``/integrations/slack/actions`` as ``payload=<JSON>``
(form-encoded, type ``block_actions``), signed with the app's signing secret
(https://docs.slack.dev/authentication/verifying-requests-from-slack/: ``X-Slack-Signature:
v0=<hex HMAC-SHA256 of "v0:{X-Slack-Request-Timestamp}:{raw body}">``; verified by
slack-sdk's ``SignatureVerifier``, which also refuses timestamps more than five minutes
off). ``slack_action`` decides through ``reviews.services.review_item_decide`` (the browser's
compare-and-swap, audit and reason) as the callgate user linked to the clicking Slack user
(``SlackIdentity``), and answers through the payload's ``response_url`` (Slack ignores the
HTTP answer's body for ``block_actions``): the message replaced by its decided state, or an
ephemeral reply to the clicker alone when nothing was decided. A Slack user not linked yet
gets, in that ephemeral reply, a one-time link (``notifications.slack_link_create``) that
links the Slack user Slack's signature proved to the callgate user who opens it: the only
way a Slack user is linked, so nobody can claim another's Slack member ID.

Both directions are outbound HTTP through ``slack_post``: ``callgate.outbound.client`` (the
one guard of user-named URLs: public addresses or ``CALLGATE_OUTBOUND_ALLOW``, pinned, no
redirects), ``TRANSPORT`` for the tests.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ContextBlock,
    MarkdownTextObject,
    Option,
    SectionBlock,
    StaticSelectElement,
)
from slack_sdk.signature import SignatureVerifier

from callgate import outbound
from callgate.labels import label
from reviews import notifications
from reviews.models import ReviewItem, SlackIdentity
from reviews.services import REJECT_PRESETS, ReviewConflict, ReviewError

logger = logging.getLogger(__name__)

#: Tests replace this with ``httpx.MockTransport``; None uses the network.
TRANSPORT: httpx.BaseTransport | None = None
SLACK_TIMEOUT = 5.0  # seconds
#: ``action_id``s of the message's controls; a button's ``value`` is ``"<decision>:<item ID>"``,
#: a rejection preset's ``"reject:<item ID>:<index in REJECT_PRESETS>"``.
ACTION_APPROVE, ACTION_REJECT = "callgate.approve", "callgate.reject"


class SlackDeliveryError(Exception):
    """A post to Slack failed in a way worth trying again (transport error, 429, 5xx)."""


class SlackRefused(Exception):
    """A post to Slack that will never work (a guarded address, a 4xx): not retried."""


class SlackPayloadError(ValueError):
    """An interaction payload without a field callgate needs; the message names it."""


# --- out: the message ------------------------------------------------------------------------


def _escape(text: str) -> str:
    """Slack's mrkdwn escaping (&, <, >), so a tool name or argument cannot make a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_message(item: ReviewItem) -> dict:
    """The Block Kit message of ``item``: ``{"text": fallback, "blocks": [...]}``. An open
    item has Approve (or Approve retry) when ``notifications.offered_decisions`` offers it
    (not when the arguments summary is cut, nor a retry the observation rules out), a
    Reject menu of the preset reasons (a rejection needs a reason: the agent reads it) and
    Open in callgate; a closed one says who decided what, without controls."""
    call = item.call
    url = notifications.item_url(item)
    reason = label(item.reason, "reason")
    title = f"{call.tool_name} · {reason}"
    agent = item.agent.name if item.agent else "—"
    kind = "Approval requested" if item.kind == ReviewItem.Kind.APPROVAL else "Review needed"
    blocks: list[Block] = [
        SectionBlock(
            text=MarkdownTextObject(
                text=f"*{kind}: <{url}|{_escape(title)}>*\n"
                f"Agent *{_escape(agent)}* · operation `{_escape(call.operation_id[:40])}`"
            ),
            fields=[
                MarkdownTextObject(text=f"*Tool*\n{_escape(call.tool_name)}"),
                MarkdownTextObject(text=f"*Reason*\n{_escape(reason)}"),
            ],
        ),
        SectionBlock(
            text=MarkdownTextObject(
                text=f"*Arguments*\n```{_escape(notifications.arguments_summary(call.arguments))}```"
            )
        ),
    ]
    if item.is_open and not notifications.arguments_shown_whole(call.arguments):
        blocks.append(
            ContextBlock(elements=[MarkdownTextObject(text=f"*{notifications.ARGUMENTS_CUT}*")])
        )
    if item.is_open:
        elements: list = [
            ButtonElement(
                text=notifications.LINK_DECISIONS[decision],
                action_id=ACTION_APPROVE,
                value=f"{decision}:{item.pk}",
                style="primary",
            )
            for decision in notifications.offered_decisions(item)
            if decision != "reject"
        ]
        elements.append(
            StaticSelectElement(
                action_id=ACTION_REJECT,
                placeholder="Reject with a reason…",
                options=[
                    Option(value=f"reject:{item.pk}:{i}", text=preset[:75])
                    for i, preset in enumerate(REJECT_PRESETS)
                ],
            )
        )
        elements.append(ButtonElement(text="Open in callgate", url=url, action_id="callgate.open"))
        blocks.append(ActionsBlock(elements=elements, block_id=f"callgate.item.{item.pk}"))
    else:
        blocks.append(
            ContextBlock(elements=[MarkdownTextObject(text=_escape(notifications.outcome(item)))])
        )
    return {"text": f"{kind}: {title}", "blocks": [b.to_dict() for b in blocks]}


def slack_post(url: str, body: dict) -> None:
    """POST ``body`` (JSON) to a Slack incoming webhook or ``response_url``. Raises
    ``SlackRefused`` for a URL the outbound guard refuses or a 4xx answer (never works),
    ``SlackDeliveryError`` for what may work later (transport error, 429, 5xx)."""
    try:
        with outbound.client(transport=TRANSPORT, timeout=SLACK_TIMEOUT) as client:
            response = client.post(url, json=body)
    except outbound.OutboundRefused as exc:
        raise SlackRefused(str(exc)) from exc
    except httpx.HTTPError as exc:
        raise SlackDeliveryError(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code == 429 or response.status_code >= 500:
        raise SlackDeliveryError(f"HTTP {response.status_code}")
    if not 200 <= response.status_code < 300:
        raise SlackRefused(f"HTTP {response.status_code}: {response.text[:200]}")


# --- in: interactions -------------------------------------------------------------------------


def slack_request_verified(*, body: bytes, headers: Mapping[str, str]) -> bool:
    """True when ``body`` carries a valid Slack signature made in the last five minutes
    (``X-Slack-Signature``, ``X-Slack-Request-Timestamp``). False without a configured
    ``CALLGATE_SLACK_SIGNING_SECRET``, or for a timestamp that is not a number."""
    secret = settings.CALLGATE_SLACK_SIGNING_SECRET
    if not secret:
        return False
    try:
        return SignatureVerifier(secret).is_valid_request(body, dict(headers))
    except ValueError:  # a timestamp that is not an integer
        return False


@dataclass(frozen=True)
class SlackReply:
    """What to send to the interaction's ``response_url``: ``body`` replaces the message
    (``replace_original``) or goes to the clicker alone (``response_type: ephemeral``).
    ``decided`` tells whether a decision was taken."""

    response_url: str
    body: dict
    decided: bool


def _ephemeral(response_url: str, text: str) -> SlackReply:
    return SlackReply(
        response_url,
        {"response_type": "ephemeral", "replace_original": False, "text": text},
        decided=False,
    )


def _field(payload: dict, *path: str) -> str:
    value: object = payload
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, str) or not value:
        raise SlackPayloadError(f"{'.'.join(path)} is missing")
    return value


def _parse_action(payload: dict) -> tuple[str, int, str]:
    """(decision, item ID, reason) of a ``block_actions`` payload's first action."""
    actions = payload.get("actions")
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        raise SlackPayloadError("actions is missing")
    action = actions[0]
    raw = action.get("value")
    if raw is None and isinstance(action.get("selected_option"), dict):
        raw = action["selected_option"].get("value")
    parts = raw.split(":") if isinstance(raw, str) else []
    if len(parts) == 2 and parts[0] in ("approve", "approve_retry") and parts[1].isdigit():
        return parts[0], int(parts[1]), ""
    if (
        len(parts) == 3
        and parts[0] == "reject"
        and parts[1].isdigit()
        and parts[2].isdigit()
        and int(parts[2]) < len(REJECT_PRESETS)
    ):
        return "reject", int(parts[1]), REJECT_PRESETS[int(parts[2])]
    raise SlackPayloadError("actions[0].value is not a callgate decision")


def slack_action(payload: dict) -> SlackReply:
    """Decide what a verified ``block_actions`` ``payload`` asks, as the linked callgate
    user. Nothing is decided, and the clicker alone is told why, for: a Slack user not
    linked to a callgate user (the reply carries a one-time link to link it); an item of a project the user is not a member of (told as
    "not found"); a member below operator; an item claimed by someone else, decided
    already ("already decided by X") or closed; a decision the item's state forbids.
    Raises ``SlackPayloadError`` for a payload without the fields needed."""
    if payload.get("type") != "block_actions":
        raise SlackPayloadError("type must be block_actions")
    response_url = _field(payload, "response_url")
    slack_user = _field(payload, "user", "id")
    team = (
        payload.get("team", {}).get("id") if isinstance(payload.get("team"), dict) else None
    ) or _field(payload, "user", "team_id")
    decision, item_pk, reason = _parse_action(payload)
    identity = (
        SlackIdentity.objects.select_related("user")
        .filter(team_id=team, slack_user_id=slack_user)
        .first()
    )
    if identity is None:
        link = notifications.slack_link_create(team_id=team, slack_user_id=slack_user)
        minutes = notifications.SLACK_LINK_MAX_AGE // 60
        return _ephemeral(
            response_url,
            "Your Slack account is not linked to a callgate user, so nothing was decided. "
            f"<{link}|Link it to your callgate account>: open the link while logged in to "
            f"callgate and confirm (it works once, for {minutes} minutes), then click again.",
        )
    if not identity.user.is_active:
        return _ephemeral(
            response_url,
            "Your Slack account is linked to a deactivated callgate user: nothing was decided.",
        )
    user: AbstractBaseUser = identity.user
    item, why = notifications.item_for_decider(user=user, item_pk=item_pk)
    if item is None:
        return _ephemeral(response_url, why)
    try:
        item = notifications.decide(
            item=item, user=user, decision=decision, reason=reason, via="slack"
        )
    except ReviewConflict as exc:
        return _ephemeral(response_url, str(exc))
    except ReviewError as exc:
        return _ephemeral(response_url, f"Nothing was decided: {exc}")
    return SlackReply(response_url, {"replace_original": True, **slack_message(item)}, decided=True)
