"""Small display helpers for the review templates (no queries)."""
from __future__ import annotations

from django import template

from reviews import services

register = template.Library()


@register.filter
def short_op(value: str) -> str:
    """``3f9c2e…`` for long operation IDs."""
    value = value or ""
    return value if len(value) <= 10 else value[:8] + "…"


@register.simple_tag
def approve_action(item) -> dict:
    """{"decision", "why", "label"} of the queue row's one-key approve."""
    decision, why = services.queue_approve_action(item)
    return {"decision": decision, "why": why, "label": "Approve" if decision == "approve" else "Approve retry"}


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
