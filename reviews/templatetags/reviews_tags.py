"""Small display helpers for the review templates (no queries)."""

from __future__ import annotations

import re

from django import template

from callgate import labels
from callgate.taxonomy import Reason

register = template.Library()


@register.filter
def facet_label(value: str) -> str:
    return value or "(none)"


@register.filter
def item_status(value: str) -> str:
    """A review item's status as people read it ("Settled by a later event")."""
    from reviews.models import ReviewItem

    return dict(ReviewItem.Status.choices).get(value, value or "")


_SLUG = re.compile(r"\b[a-z]+(?:_[a-z]+)+\b")


@register.filter
def audit_text(row) -> str:
    """An audit row's reason with the reason slugs callgate wrote into it read as labels
    ("Reconciled: it happened"; a leading "settled by a later event: " that only repeats the
    row's action is left out, so is a state slug shown by its label); what people wrote
    stays as is."""
    text = row.reason or ""
    if row.actor_id is not None:
        return text
    action = row.get_action_display().lower() + ": "
    if text.lower().startswith(action):
        text = text[len(action) :]
    if text in labels.TABLES["state"] and text not in Reason.values:
        return labels.label(text, "state")
    if text in Reason.values:
        return labels.label(text, "reason")
    return _SLUG.sub(
        lambda m: labels.label(m.group(0), "reason") if m.group(0) in Reason.values else m.group(0),
        text,
    )


#: what callgate's own audit rows say in a sentence ("Review item opened by callgate")
_AUDIT_VERBS = {
    "opened": "opened",
    "claim": "claimed",
    "release": "released",
    "assign": "assigned",
    "lease_lapsed": "claim lapsed",
    "reconcile": "sent to reconcile",
    "extend": "given more time",
    "approve": "approved",
    "approve_retry": "approved for a retry",
    "reject": "rejected",
    "mark_applied": "marked applied",
    "mark_failed": "marked failed",
    "expired": "expired",
    "settled": "settled by a later event",
    "reason_changed": "reason changed",
}


@register.filter
def audit_action(row) -> str:
    """The audit row's action as the verb of "Review item … by …"."""
    return _AUDIT_VERBS.get(row.action) or row.get_action_display().lower()


@register.filter
def audit_states(row) -> str:
    """The item's and the call's states before and after an audit row, in words:
    "Open → Resolved; call: In review → Succeeded", or "new, Open; call: In review" for the
    row that opened the item (nothing before it)."""
    parts = []
    before, after = item_status(row.state_before), item_status(row.state_after)
    if row.state_before and row.state_after and row.state_before != row.state_after:
        parts.append(f"{before} → {after}")
    elif row.state_after:
        parts.append(f"new item, {after}" if not row.state_before else after)
    call_before = labels.label(row.call_state_before, "state") if row.call_state_before else ""
    call_after = labels.label(row.call_state_after, "state") if row.call_state_after else ""
    if call_before and call_after and call_before != call_after:
        parts.append(f"call: {call_before} → {call_after}")
    elif call_after:
        parts.append(f"call: {call_after}")
    return "; ".join(parts) or "unchanged"
