"""Signed decision webhooks: the payload, the signature, one HTTP attempt.

Wire format (put this in the README):

    POST <Agent.webhook_url>
    Content-Type: application/json
    X-Callgate-Timestamp: <unix seconds, integer>
    X-Callgate-Signature: v1=<hex HMAC-SHA256(key=Agent.webhook_secret, msg=f"{timestamp}.{body}")>
    X-Callgate-Delivery: <uuid, the same for every attempt of one decision>

    body: {"type": "decision", "delivery_id": uuid, "operation_id": str, "tool": str,
           "decision": "approve"|"reject"|"approve_retry"|"mark_applied"|"mark_failed"|"expired",
           "reason": str, "decided_at": RFC3339|null, "decided_by": str|null,
           "state": str, "route": str, "observation": str, "receipt": any|null,
           "review_item": int|null}

``body`` is the exact bytes sent (UTF-8 JSON). Receivers recompute the HMAC over
``f"{timestamp}.{body}"``, compare in constant time, and reject timestamps older than a
few minutes (replay). A 2xx answer ends delivery; anything else is retried with
exponential backoff and full jitter, at most ``WEBHOOK_MAX_ATTEMPTS`` attempts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import httpx

from callgate.models import ToolCall

#: Tests replace this with ``httpx.MockTransport``; None uses the network.
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
        "decided_by": call.decided_by.get_username() if call.decided_by_id else None,
        "state": call.state,
        "route": call.route,
        "observation": call.observation,
        "receipt": call.receipt,
        "review_item": item_pk,
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


def webhook_post(*, url: str, secret: str, payload: dict) -> httpx.Response:
    """One signed POST. Raises httpx errors for transport failures."""
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True, default=str)
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "callgate-webhook/1",
        "X-Callgate-Timestamp": str(timestamp),
        "X-Callgate-Signature": webhook_sign(secret=secret, timestamp=timestamp, body=body),
        "X-Callgate-Delivery": payload["delivery_id"],
    }
    with httpx.Client(
        transport=TRANSPORT, timeout=WEBHOOK_TIMEOUT, follow_redirects=False
    ) as client:
        return client.post(url, content=body.encode(), headers=headers)
