"""Template helpers shared by callgate's pages: pretty JSON with redactions, badges,
short operation IDs with a copy button, and links to pages that may not be installed."""

from __future__ import annotations

import functools
import json
from datetime import UTC
from typing import Any

from django import template
from django.dispatch import receiver
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils.autoreload import file_changed
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from callgate import labels, search
from callgate.taxonomy import Reason, category_of
from callgate_sdk.wire import REDACTED  # what ingest stores in place of a sensitive value

register = template.Library()

#: characters of an operation ID shown in lists
SHORT_OP_LENGTH = 10
INDENT = "  "


def _scalar(value: Any) -> str:
    if isinstance(value, str) and value == REDACTED:
        return (
            '<span class="redacted" title="Redacted on ingest: a sensitive field of the contract">'
            '"•••" <span class="redacted-label">redacted</span></span>'
        )
    return escape(json.dumps(value, ensure_ascii=False, default=str))


def _render(value: Any, depth: int) -> str:
    pad, inner = INDENT * depth, INDENT * (depth + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [
            f'{inner}<span class="key">{escape(json.dumps(str(k), ensure_ascii=False))}</span>: {_render(v, depth + 1)}'
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        return "[\n" + ",\n".join(f"{inner}{_render(v, depth + 1)}" for v in value) + f"\n{pad}]"
    return _scalar(value)


@register.filter
def pretty_json(value: Any) -> SafeString:
    """``value`` as indented, escaped JSON for a ``<pre class="json">``; redacted values
    (``"•••"``) are marked and labelled so nobody mistakes them for data."""
    return mark_safe(_render(value, 0))


@register.filter
def has_redactions(value: Any) -> bool:
    """True when ``value`` holds a redacted value anywhere."""
    if isinstance(value, dict):
        return any(has_redactions(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_redactions(v) for v in value)
    return value == REDACTED


@register.simple_tag
def badge(reason: str = "", category: str = "") -> SafeString:
    """The category-coloured badge (``callgate/_badge.html``) with the reason's label as its
    text and the slugs in the tooltip. The category is derived from the reason when not
    given; no reason shows the category's label (or "Not classified yet"). Drawn once per
    (reason, category) and process: labels never change while it runs, and a list page
    shows the same few badges on every row."""
    return _badge_html(reason or "", category or "")


@functools.lru_cache(maxsize=1024)
def _badge_html(reason: str, category: str) -> SafeString:
    if reason and not category and reason in Reason.values:
        category = category_of(reason).value
    text = labels.label(reason, "reason") if reason else labels.label(category, "category")
    if not reason and not category:
        text = labels.label("", "reason")
    title = " · ".join(
        part for part in (reason, labels.label(category, "category") if category else "") if part
    )
    return render_to_string(
        "callgate/_badge.html",
        {"category": category or "none", "label": text, "title": title or "no classification yet"},
    )


@receiver(file_changed, dispatch_uid="callgate_badges_file_changed")
def _template_changed(sender, file_path, **kwargs) -> None:
    """``runserver``: an edited template is drawn anew (as Django's template loaders are)."""
    if file_path.suffix != ".py":
        _badge_html.cache_clear()


@register.filter
def label(value: str, kind: str) -> str:
    """``{{ call.state|label:"state" }}``: the human label of a slug (``callgate.labels``)."""
    return labels.label(value, kind)


@register.simple_tag
def labelled(value: str, kind: str) -> SafeString:
    """The human label of a slug in a ``<span>`` with the slug as its tooltip."""
    if not value:
        return format_html("{}", labels.label(value, kind))
    return format_html('<span title="{}">{}</span>', value, labels.label(value, kind))


#: two overlapping sheets: the copy icon (no icon font needed)
_COPY_ICON = mark_safe(
    '<svg aria-hidden="true" viewBox="0 0 16 16" width="13" height="13" fill="none" stroke="currentColor" '
    'stroke-width="1.5"><rect x="5.5" y="5.5" width="8" height="8" rx="1.5"/>'
    '<path d="M10.5 3.5v-.5a1.5 1.5 0 0 0-1.5-1.5H4a1.5 1.5 0 0 0-1.5 1.5v5A1.5 1.5 0 0 0 4 9.5h.5"/></svg>'
)


@register.simple_tag
def copy_button(text: str, label: str = "Copy") -> SafeString:
    """A small button that copies ``text`` (see ``data-copy`` in callgate.js)."""
    return format_html(
        '<button type="button" class="copy" data-copy="{}" aria-label="{}" title="{}">{}</button>',
        text,
        label,
        label,
        _COPY_ICON,
    )


@register.simple_tag
def short_op(operation_id: str, length: int = SHORT_OP_LENGTH) -> SafeString:
    """The operation ID shortened to ``length`` characters (full on hover) and a copy button."""
    short = operation_id if len(operation_id) <= length + 1 else operation_id[:length] + "…"
    whole = escape(operation_id)
    return mark_safe(
        f'<span class="op" title="{whole}">{escape(short)}</span>'
        + copy_button(operation_id, f"Copy operation ID {operation_id}")
    )


@register.simple_tag
def url_or_empty(name: str, *args) -> str:
    """``{% url %}`` that gives "" for a route this installation does not serve (yet)."""
    try:
        return reverse(name, args=args)
    except NoReverseMatch:
        return ""


@register.filter
def lint_level(score: int | None) -> str:
    """``good`` (80+), ``fair`` (50–79) or ``poor`` (below 50): the lint score's badge class."""
    if score is None:
        return "none"
    return "good" if score >= 80 else "fair" if score >= 50 else "poor"


@register.filter
def percent(value: float | None, digits: int = 1) -> str:
    """0.1234 → "12.3 %"; None → "—"."""
    if value is None:
        return "—"
    return f"{value * 100:.{digits}f} %"


#: how an attempt's ``sent`` reads when it did not succeed
_SENT = {True: "after it was sent", False: "before it was sent", None: "(sent or not: unknown)"}


@register.filter
def event_summary(event) -> str:
    """What a CallEvent's body says, as a sentence for people ("Proposed in OpenAI
    format", "Attempt 2 timed out after it was sent · HTTP 504"); the codes stay in the
    API and the body."""
    body = event.body if isinstance(event.body, dict) else {}
    kind = event.kind
    if kind == "proposed":
        fmt = body.get("format") or ""
        return f"Proposed in {labels.label(fmt, 'format')} format" if fmt else "Proposed"
    if kind == "attempt":
        n = body.get("attempt")
        outcome = body.get("outcome")
        head = f"Attempt {n}" if n else "Attempt"
        head += f" {labels.label(outcome, 'outcome')}" if outcome else ": outcome not reported"
        if outcome not in (None, "success", "circuit_open"):
            head += " " + _SENT.get(body.get("sent"), "")
        parts = [head]
        if body.get("http_status"):
            parts.append(f"HTTP {body['http_status']}")
        rpc = body.get("jsonrpc_error")
        if isinstance(rpc, dict) and rpc.get("code") is not None:
            parts.append(f"JSON-RPC error {rpc['code']}")
        if body.get("error"):
            parts.append(str(body["error"])[:120])
        return " · ".join(p for p in parts if p)
    if kind == "denied":
        return f"Denied: {body.get('reason') or 'no reason given'}"
    if kind == "reconciled":
        found, matches = body.get("found"), body.get("matches")
        if found is None:
            detail = body.get("detail")
            why = (
                f" ({detail['detail']})"
                if isinstance(detail, dict) and detail.get("detail")
                else ""
            )
            return f"Reconciled: the look-up could not tell{why}"
        if not found:
            return "Reconciled: not found in the target"
        return (
            "Reconciled: found in the target, arguments match"
            if matches
            else "Reconciled: found in the target, arguments differ"
        )
    if kind == "receipt":
        return "Receipt from the target"
    if kind == "decision":
        reason = body.get("reason")
        decision = labels.label(body.get("decision"), "decision")
        return f"Decision: {decision}" + (f" (“{reason}”)" if reason else "")
    if kind == "approval_expired":
        return "Approval timed out"
    if kind == "deadline_passed":
        return "Deadline passed: no more retries"
    return labels.label(kind, "event")


@register.filter
def code_spans(text: str) -> SafeString:
    """Escape ``text`` and show its `backticked` parts as ``<code>`` (lint messages name
    fields that way)."""
    parts = escape(str(text)).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: leave the text as it is
        return escape(str(text))
    return mark_safe("".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts)))


@register.simple_tag
def moment(value, relative: bool = False, minutes: bool = False) -> SafeString:
    """A ``<time>`` that ``callgate.js`` shows in the browser's time zone, 24-hour ("07:54",
    with the date on another day), or with ``relative`` as "4 min ago"; the UTC time is the
    text until the script runs and the tooltip after (shared/UI.md: one time format).
    ``minutes`` leaves the seconds out (window bounds, which fall on whole hours)."""
    if not value:
        return mark_safe("—")
    utc = value.astimezone(UTC)
    kind = "data-relative" if relative else ('data-local="minutes"' if minutes else "data-local")
    # nothing to escape: the text is the time's own digits, dashes and colons
    return mark_safe(
        f'<time datetime="{utc.isoformat()}" {kind} title="{utc:%Y-%m-%d %H:%M:%S} UTC">'
        f"{utc:%Y-%m-%d %H:%M} UTC</time>"
    )


@register.simple_tag
def sparkline(counts: list[int], category: str = "", label: str = "") -> SafeString:
    """A small inline SVG line of ``counts`` (one point per period), coloured by the
    category's CSS variable; ``label`` is its accessible name (the numbers themselves are
    beside it in text)."""
    width, height = 84, 22
    if not counts:
        return mark_safe("")
    top = max(max(counts), 1)
    step = width / max(len(counts) - 1, 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (n / top) * (height - 4):.1f}" for i, n in enumerate(counts)
    )
    return format_html(
        '<svg class="spark cat-line-{}" viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
        'aria-label="{}"><polyline points="{}"/></svg>',
        category or "none",
        width,
        height,
        width,
        height,
        label,
        points,
    )


@register.filter
def age(seconds: float | None) -> str:
    """A duration in seconds as "42 s", "12 min", "3.5 h", "2.1 d"."""
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


@register.simple_tag
def search_keys() -> list[tuple[str, str]]:
    """The search language's keys and what each narrows by (``callgate.search.KEYS``): the
    search help of the calls list and the queue."""
    return list(search.KEYS.items())
