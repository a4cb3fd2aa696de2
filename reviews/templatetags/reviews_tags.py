"""Small display helpers for the review templates (no queries)."""

from __future__ import annotations

from django import template

from callgate.taxonomy import category_of
from reviews import services

register = template.Library()


@register.filter
def short_op(value: str) -> str:
    """``3f9c2e…`` for long operation IDs."""
    value = value or ""
    return value if len(value) <= 10 else value[:8] + "…"


@register.simple_tag
def approve_action(item, user=None) -> dict:
    """{"decision", "why", "label"} of the queue row's one-key approve for ``user``."""
    decision, why = services.queue_approve_action(item, user=user)
    return {
        "decision": decision,
        "why": why,
        "label": "Approve" if decision == "approve" else "Approve retry",
    }


@register.filter
def lease_holder(item):
    """The assignee while the claim holds, else None (lapsed claims count as unassigned)."""
    return item.assignee if item.lease_active() else None


@register.filter
def get(mapping, key):
    return mapping.get(key, "") if mapping else ""


@register.filter
def facet_label(value: str) -> str:
    return value or "(none)"


@register.filter
def reason_category(reason: str) -> str:
    """The taxonomy category of ``reason`` (the badge's colour class: ``cat-<category>``), so
    a badge's colour always belongs to the reason it shows; "" for an unknown reason."""
    try:
        return category_of(reason)
    except (ValueError, KeyError):
        return ""
