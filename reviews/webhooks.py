"""Signed decision webhooks: the payload, the signatures, one HTTP attempt.

Wire format (README "Decision webhooks"):

    POST <Agent.webhook_url>
    Content-Type: application/json
    webhook-id: <uuid, the same for every attempt of one decision>
    webhook-timestamp: <unix seconds, integer>
    webhook-signature: v1,<base64 HMAC-SHA256(key=Agent.webhook_secret as UTF-8 bytes,
                                              msg=f"{webhook-id}.{timestamp}.{body}")>
    X-Callgate-Timestamp, X-Callgate-Signature (v1=<hex HMAC-SHA256 over
    f"{timestamp}.{body}">), X-Callgate-Delivery: the previous scheme, kept for one release.

    body: {"type": "decision", "delivery_id": uuid, "operation_id": str, "tool": str,
           "decision": "approve"|"reject"|"approve_retry"|"mark_applied"|"mark_failed"|"expired",
           "reason": str, "decided_at": RFC3339|null, "decided_by": str|null,
           "state": str, "route": str, "observation": str, "receipt": any|null,
           "review_item": int|null, "arguments": object|null,
           "proposed_operation_id": str|null}

    ``arguments``: the arguments an operator approved with edits (execute these; a "•••"
    is a sensitive value callgate never stored: keep your own, ``callgate_sdk.wire.
    edited_arguments``), null when the decision kept the proposed ones.
    ``proposed_operation_id``: the operation ID the call was proposed under when the edit
    gave it a new one (``operation_id``), else null.

The signature is the Standard Webhooks scheme (https://www.standardwebhooks.com/), made
with its reference library ``standardwebhooks``; receivers verify with it
(``Webhook(secret.encode()).verify(body, headers)``: the secret's raw bytes, or
``"whsec_" + base64(secret)``), which also rejects timestamps more than five minutes off.
``body`` is the exact bytes sent (UTF-8 JSON). A 2xx answer ends delivery; anything else is
tried again from the outbox (``reviews.services.webhook_attempt``). Webhook URLs go through
``callgate.outbound``'s guard: no loopback, private or link-local addresses unless
``CALLGATE_OUTBOUND_ALLOW`` admits them, the checked address is the one connected to, and
redirects are not followed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import UTC, datetime

import httpx
from standardwebhooks.webhooks import Webhook

from callgate import outbound
from callgate.models import ToolCall

#: Tests replace this with ``httpx.MockTransport`` (still behind the outbound guard); None
#: uses the network.
TRANSPORT: httpx.BaseTransport | None = None
WEBHOOK_TIMEOUT = 5.0  # seconds
WEBHOOK_MAX_ATTEMPTS = 6
WEBHOOK_BACKOFF_BASE = 2.0  # seconds; attempt n waits uniform(0, base * 2**n)


def webhook_payload(*, call: ToolCall, item_pk: int | None, delivery_id: str) -> dict:
    """The decision as the agent receives it (see the module docstring)."""
    decision = call.decision or ("expired" if call.reason == "approval_expired" else "")
    return {
        "type": "decision",
        "delivery_id": delivery_id,
        "operation_id": call.operation_id,
        "tool": call.tool_name,
        "decision": decision,
        "reason": call.decision_reason,
        "decided_at": call.decided_at.isoformat() if call.decided_at else None,
        "decided_by": call.decided_by.get_username() if call.decided_by else None,
        "state": call.state,
        "route": call.route,
        "observation": call.observation,
        "receipt": call.receipt,
        "review_item": item_pk,
        "arguments": call.decision_arguments,
        "proposed_operation_id": call.proposed_operation_id or None,
    }


def webhook_sign(*, secret: str, timestamp: int, body: str) -> str:
    """``v1=<hex>``: HMAC-SHA256 with ``secret`` over ``f"{timestamp}.{body}"``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256).hexdigest()
    return f"v1={digest}"


def webhook_verify(
    *, secret: str, timestamp: str, body: str, signature: str, tolerance: int = 300
) -> bool:
    """Receiver-side check (used by the tests and handy for agent authors)."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs(time.time() - ts) > tolerance:
        return False
    return hmac.compare_digest(webhook_sign(secret=secret, timestamp=ts, body=body), signature)


def webhook_headers(*, secret: str, delivery_id: str, timestamp: int, body: str) -> dict:
    """The signature headers of one attempt: Standard Webhooks (``webhook-id``,
    ``webhook-timestamp``, ``webhook-signature``) and the previous ``X-Callgate-*``."""
    signed_at = datetime.fromtimestamp(timestamp, tz=UTC)
    return {
        "webhook-id": delivery_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": Webhook(secret.encode()).sign(delivery_id, signed_at, body),
        "X-Callgate-Timestamp": str(timestamp),
        "X-Callgate-Signature": webhook_sign(secret=secret, timestamp=timestamp, body=body),
        "X-Callgate-Delivery": delivery_id,
    }


def webhook_post(*, url: str, secret: str, payload: dict) -> httpx.Response:
    """One signed POST through ``outbound.client``. Raises httpx errors for transport
    failures, and ``callgate.outbound.OutboundRefused`` (an httpx ``TransportError``) for a
    URL the guard refuses, before connecting."""
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True, default=str)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "callgate-webhook/1",
        **webhook_headers(
            secret=secret or " ",  # Standard Webhooks refuses an empty key
            delivery_id=payload["delivery_id"],
            timestamp=int(time.time()),
            body=body,
        ),
    }
    with outbound.client(transport=TRANSPORT, timeout=WEBHOOK_TIMEOUT) as client:
        return client.post(url, content=body.encode(), headers=headers)
