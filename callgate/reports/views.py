"""Report pages for managers (operators may read; viewers get 403).

Each page is a list of cards; a card has a chart (drawn by ``static/js/reports.js`` from a
JSON data island), the table with the same numbers (the accessible alternative), a CSV
link (``?format=csv&table=<name>`` on the same URL, filters kept) and, on every count, a
link to the calls list filtered to exactly those calls. The filters are a GET form, so
every page is a permalink. The numbers come from ``callgate.reports.selectors``; this module only
turns them into tables and chart data.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from callgate import labels, metrics
from callgate.access import ProjectRequest, Role, project_view
from callgate.csvexport import csv_safe
from callgate.models import Agent, ToolContract
from callgate.reports import selectors as reports
from callgate.reports.rollups import rollup_rows, rollups_as_of
from callgate.reports.selectors import ReportFilterError, ReportFilters, iso

number_label = metrics.label

#: (key, label, url name) of the reports' sub-navigation
SECTIONS = [
    ("overview", "Categories & routes", "callgate:reports"),
    ("reasons", "Reasons", "callgate:reports-reasons"),
    ("tools", "Tools & contracts", "callgate:reports-tools"),
    ("agents", "Agents", "callgate:reports-agents"),
    ("reliability", "Retries, unknown outcomes, duplicates", "callgate:reports-reliability"),
    ("review", "Review health", "callgate:reports-review"),
]


# --- cells, tables, charts ----------------------------------------------------------------


def num(n: int | None, href: str | None = None, *, number: str | None = None) -> dict:
    """A count; ``number``: the key of the ``metrics.NUMBERS`` entry it shows in full (the
    page's total of it), marked on the page (``data-number``) for the numbers table test."""
    return {
        "text": "—" if n is None else f"{n:,}",
        "value": "" if n is None else n,
        "num": True,
        "href": href if n else None,
        "number": number,
    }


def pct(share: float | None) -> dict:
    return {
        "text": "—" if share is None else f"{share * 100:.1f}%",
        "value": "" if share is None else share,
        "num": True,
    }


def text(
    value,
    href: str | None = None,
    *,
    badge: str | None = None,
    mono: bool = False,
    nowrap: bool = False,
    label: str | None = None,
    csv: str | None = None,
) -> dict:
    """A text cell: the page and the CSV show ``label`` when given (a human label,
    ``callgate.labels``: never a code) with ``value`` in its tooltip, else ``value``;
    ``csv`` replaces it in the CSV (a period's ISO 8601 start, which carries the year)."""
    shown = str(value) if label is None else label
    return {
        "text": shown,
        "title": str(value) if label is not None and value else None,
        "value": shown if csv is None else csv,
        "href": href,
        "badge": badge,
        "mono": mono,
        "nowrap": nowrap,
    }


def signed(change: int, ratio: float | None, *, bad: bool = True) -> dict:
    """A change against the previous period; ``bad``: more of it is worse (coloured)."""
    label = f"{change:+,}" if change else "0"
    if ratio is not None and change:
        label += f" ({ratio * 100:+.0f}%)"
    elif change and ratio is None:
        label += " (new)"
    trend = ("up" if change > 0 else "down" if change < 0 else "") if bad else ""
    return {"text": label, "value": change, "num": True, "trend": trend, "nowrap": True}


def plural(n: int | None, singular: str, plural_form: str | None = None) -> str:
    """``singular`` for exactly one, else ``plural_form`` (default: ``singular`` + "s")."""
    return singular if n == 1 else (plural_form or singular + "s")


def counted(n: int, singular: str, plural_form: str | None = None) -> str:
    """``"1 call"``, ``"1,204 calls"``."""
    return f"{n:,} {plural(n, singular, plural_form)}"


def when(moment_iso: str) -> str:
    return datetime.fromisoformat(moment_iso.replace("Z", "+00:00")).strftime("%a %d %b %H:%M")


def duration(seconds: float | None) -> dict:
    if seconds is None:
        return {"text": "—", "value": "", "num": True}
    if seconds < 1:
        label = "< 1 s"
    elif seconds < 120:
        label = f"{seconds:.0f} s"
    elif seconds < 2 * 3600:
        label = f"{seconds / 60:.0f} min"
    elif seconds < 2 * 86400:
        label = f"{seconds / 3600:.1f} h"
    else:
        label = f"{seconds / 86400:.1f} d"
    return {"text": label, "value": round(seconds, 1), "num": True}


def table(
    name: str,
    title: str,
    columns: list[tuple[str, bool]],
    rows: list[list[dict]],
    foot: list[dict] | None = None,
) -> dict:
    return {
        "name": name,
        "title": title,
        "columns": [{"label": label, "num": n} for label, n in columns],
        "rows": rows,
        "foot": foot,
    }


def chart(
    chart_id: str, kind: str, label: str, labels: list[str], datasets: list[dict], **options
) -> dict:
    """Chart data for reports.js: kind is "stacked" (bars stacked by dataset), "hstacked"
    (horizontal stacked), "bar" or "hbar". A dataset's ``color`` is a category slug (its
    CSS variable ``--chart-<slug>``) or "neutral"."""
    return {
        "id": chart_id,
        "kind": kind,
        "label": label,
        "labels": labels,
        "datasets": datasets,
        **options,
    }


def period_label(since: str, granularity: str) -> str:
    moment = datetime.fromisoformat(since.replace("Z", "+00:00"))
    if granularity == "hour":
        return moment.strftime("%b %d %H:00")
    if granularity == "day":
        return moment.strftime("%a %b %d")
    return "wk " + moment.strftime("%b %d")


class Links:
    """Builds drill-down links to the calls list: the report's tool/agent filter plus the
    cell's own (since/until/reason/category/route/tool/agent). A blank category or tool
    becomes the calls list's "Unclassified" / "(no tool name)" filter (``callgate.metrics``),
    so the list shows exactly the calls counted."""

    def __init__(self, project_slug: str, f: ReportFilters):
        try:
            self.base = reverse("callgate:calls", args=[project_slug])
        except NoReverseMatch:
            self.base = f"/p/{project_slug}/calls/"
        self.f = f

    def __call__(self, *, since: str | None = None, until: str | None = None, **extra) -> str:
        params: dict[str, str] = {
            "since": since or iso(self.f.since),
            "until": until or iso(self.f.until),
        }
        if self.f.tool:
            params["tool"] = self.f.tool
        if self.f.agent_id is not None:
            params["agent"] = str(self.f.agent_id)
        for key, value in extra.items():
            if key == "category" and value == metrics.UNCLASSIFIED:
                value = "none"  # the calls list's name for "no category yet"
            elif key == "tool" and value == "":
                value = metrics.NO_TOOL
            if value is not None:
                params[key] = str(value)
        return f"{self.base}?{urlencode(params)}"

    def number(self, key: str, **extra) -> str:
        """The link of number ``key`` (``metrics.NUMBERS``): its calls-list filter, plus
        ``extra`` (a cell's own period, tool or agent)."""
        return self(**metrics.NUMBERS[key].drill, **extra)


# --- the cards of each page ----------------------------------------------------------------


def cards_overview(project, f: ReportFilters, link: Links) -> list[dict]:
    data = reports.report_categories(project=project, f=f)
    period_labels = [period_label(p["since"], f.granularity) for p in data["periods"]]
    columns = (
        [("Period start (UTC)", False)]
        + [(s["label"], True) for s in data["series"]]
        + [("Total", True)]
    )
    rows = []
    for i, p in enumerate(data["periods"]):
        row = [text(period_labels[i], csv=p["since"])]
        for s in data["series"]:
            row.append(
                num(
                    s["counts"][i], link(since=p["since"], until=p["until"], category=s["category"])
                )
            )
        row.append(num(data["totals"][i], link(since=p["since"], until=p["until"])))
        rows.append(row)
    foot = (
        [text("Total")]
        + [num(s["total"], link(category=s["category"])) for s in data["series"]]
        + [num(data["total"], link())]
    )
    cat_table = table("categories", "Calls per category and period", columns, rows, foot)
    cat_chart = chart(
        "chart-categories",
        "stacked",
        f"Stacked bar chart of calls per category per {f.granularity}; the table below has the numbers.",
        period_labels,
        [
            {"label": s["label"], "color": s["category"] or "neutral", "data": s["counts"]}
            for s in data["series"]
        ],
        value_title="Calls",
    )
    routes = reports.report_routes(project=project, f=f)
    route_table = table(
        "routes",
        "Calls per route",
        [("Route", False), ("Calls", True), ("Share", True)],
        [
            [
                text(
                    r["route"],
                    link(route=r["route"]) if r["route"] else None,
                    label=labels.label(r["route"], "route"),
                ),
                num(
                    r["calls"],
                    link(route=r["route"]) if r["route"] else None,
                    number="refused" if r["route"] == metrics.REFUSED_ROUTE else None,
                ),
                pct(r["share"]),
            ]
            for r in routes["rows"]
        ],
        [text("Total"), num(routes["total"], link()), pct(1.0 if routes["total"] else None)],
    )
    route_chart = chart(
        "chart-routes",
        "hbar",
        "Bar chart of calls per route; the table beside it has the numbers.",
        [r["label"] for r in routes["rows"]],
        [{"label": "Calls", "color": "neutral", "data": [r["calls"] for r in routes["rows"]]}],
    )
    totals = {s["category"]: s["total"] for s in data["series"]}
    not_ok = data["not_ok"]
    unknown_now = totals.get("unknown_outcome", 0)
    contract_errors = totals.get("argument_error", 0) + totals.get("hallucination", 0)
    tiles = [
        {
            "label": number_label("calls"),
            "value": f"{data['total']:,}",
            "href": link.number("calls"),
            "number": "calls",
        },
        {
            "label": number_label("not_ok"),
            "value": f"{not_ok:,}",
            "href": link.number("not_ok"),
            "number": "not_ok",
            "note": f"{not_ok / data['total'] * 100:.1f}%" if data["total"] else "",
        },
        {
            "label": number_label("bad_arguments"),
            "value": f"{contract_errors:,}",
            "href": link.number("bad_arguments"),
            "number": "bad_arguments",
        },
        {
            "label": number_label("unknown_now"),
            "value": f"{unknown_now:,}",
            "href": link.number("unknown_now"),
            "number": "unknown_now",
        },
    ]
    return [
        {
            "title": "Categories over time",
            "tiles": tiles,
            "chart": cat_chart,
            "table": cat_table,
            "layout": "stack",
            "empty": not data["total"],
        },
        {
            "title": "Routes taken",
            "chart": route_chart,
            "table": route_table,
            "layout": "side",
            "empty": not routes["total"],
        },
    ]


def _reason_filter(row: dict) -> dict:
    """The calls-list filter of a reasons row: its reason, or "Unclassified" for none."""
    return {"reason": row["reason"]} if row["reason"] else {"category": metrics.UNCLASSIFIED}


def cards_reasons(project, f: ReportFilters, link: Links) -> list[dict]:
    data = reports.report_reasons(project=project, f=f)
    prev = data["previous"]
    rows = [
        [
            text(
                r["reason"],
                link(**_reason_filter(r)),
                badge=r["category"] or "none",
                label=labels.label(r["reason"], "reason"),
            ),
            text(r["category"], label=labels.label(r["category"], "category"), nowrap=True),
            num(r["calls"], link(**_reason_filter(r))),
            pct(r["share"]),
            num(
                r["previous_calls"],
                link(since=prev["since"], until=prev["until"], **_reason_filter(r)),
            ),
            signed(
                r["change"], r["change_ratio"], bad=r["category"] not in reports.GOOD_CATEGORIES
            ),
            num(r["refused"]),
        ]
        for r in data["rows"]
    ]
    change_ratio = (
        ((data["total"] - data["previous_total"]) / data["previous_total"])
        if data["previous_total"]
        else None
    )
    t = table(
        "reasons",
        "Calls per reason",
        [
            ("Reason", False),
            ("Category", False),
            ("Calls", True),
            ("Share", True),
            ("Previous period", True),
            ("Change", True),
            ("Refused proposals", True),
        ],
        rows,
        [
            text("Total"),
            text(""),
            num(data["total"], link()),
            pct(1.0 if data["total"] else None),
            num(data["previous_total"], link(since=prev["since"], until=prev["until"])),
            signed(data["total"] - data["previous_total"], change_ratio, bad=False),
            num(data["refused_total"]),
        ],
    )
    top = [r for r in data["rows"] if r["calls"]][:15]
    c = chart(
        "chart-reasons",
        "hbar",
        "Bar chart of the 15 most frequent reasons; the table has every reason.",
        [labels.label(r["reason"], "reason") for r in top],
        [
            {
                "label": "Calls",
                "color": "per-row",
                "colors": [r["category"] or "neutral" for r in top],
                "data": [r["calls"] for r in top],
            }
        ],
    )
    return [
        {
            "title": "Reasons",
            "subtitle": f"compared with the previous period, {when(prev['since'])} – {when(prev['until'])} UTC",
            "chart": c,
            "table": t,
            "layout": "side wide-table",
            "empty": not data["total"] and not data["previous_total"] and not data["refused_total"],
        }
    ]


def _by_group_card(
    name: str,
    title: str,
    data: dict,
    key_cell: Callable[[dict], dict],
    filter_of: Callable[[dict], dict],
    link: Links,
) -> dict:
    cats = data["categories"]
    columns = [
        (title, False),
        ("Calls", True),
        (number_label("not_ok").capitalize(), True),
        ("Not-ok share", True),
        ("Attempts", True),
        (number_label("repeats_answered").capitalize(), True),
    ] + [(labels.label(c, "category"), True) for c in cats]
    rows = []
    for r in data["rows"]:
        extra = filter_of(r)
        rows.append(
            [
                key_cell(r),
                num(r["calls"], link(**extra)),
                num(r["not_ok"], link.number("not_ok", **extra)),
                pct(r["not_ok_share"]),
                num(r["attempts"]),
                num(r["repeats_answered"], link.number("repeats_answered", **extra)),
            ]
            + [num(r["by_category"].get(c, 0), link(category=c, **extra)) for c in cats]
        )
    top = data["rows"][:20]
    c = chart(
        f"chart-{name}",
        "hstacked",
        f"Horizontal stacked bars of calls per {title.lower()} and category; the table has the numbers.",
        [key_cell(r)["text"] for r in top],
        [
            {
                "label": labels.label(cat, "category"),
                "color": cat or "neutral",
                "data": [r["by_category"].get(cat, 0) for r in top],
            }
            for cat in cats
        ],
    )
    return {
        "title": f"By {title.lower()}",
        "chart": c,
        "table": table(name, f"Calls per {title.lower()}", columns, rows),
        "layout": "stack",
        "empty": not data["rows"],
    }


def cards_tools(project, f: ReportFilters, link: Links) -> list[dict]:
    data = reports.report_tools(project=project, f=f)
    card = _by_group_card(
        "tools",
        "Tool",
        data,
        lambda r: text(r["tool"] or "(no tool name)", link(tool=r["tool"]), mono=r["tool"] != ""),
        lambda r: {"tool": r["tool"]},
        link,
    )
    quality = reports.report_contracts(project=project, f=f)
    rows = [
        [
            text(r["tool"], link(tool=r["tool"]), mono=True),
            text(f"v{r['version']}"),
            num(r["lint_score"]),
            num(r["lint_findings"]),
            num(r["calls"]),
            num(r["argument_errors"]),
            pct(r["argument_error_rate"]),
            num(r["hallucinations"]),
            pct(r["hallucination_rate"]),
        ]
        for r in quality["rows"]
    ]
    qt = table(
        "contracts",
        "Contract quality per tool version",
        [
            ("Tool", False),
            ("Version", False),
            ("Lint score", True),
            ("Findings", True),
            ("Calls", True),
            ("Argument errors", True),
            ("Rate", True),
            ("Hallucinations", True),
            ("Rate", True),
        ],
        rows,
    )
    used = [r for r in quality["rows"] if r["calls"]][:20]
    qc = chart(
        "chart-contracts",
        "quality",
        "Bar chart of lint score (0–100) beside the argument-error and hallucination rate (%) per tool version; the table has the numbers.",
        [f"{r['tool']} v{r['version']}" for r in used],
        [
            {"label": "Lint score", "color": "neutral", "data": [r["lint_score"] for r in used]},
            {
                "label": "Argument-error rate %",
                "color": "argument_error",
                "data": [round((r["argument_error_rate"] or 0) * 100, 1) for r in used],
            },
            {
                "label": "Hallucination rate %",
                "color": "hallucination",
                "data": [round((r["hallucination_rate"] or 0) * 100, 1) for r in used],
            },
        ],
    )
    # no drill-down on a version's numbers: the calls list filters by tool name, not version
    note = "Counts per contract version; the tool name lists the calls of every version."
    return [
        card,
        {
            "title": "Contract quality",
            "subtitle": note,
            "chart": qc,
            "table": qt,
            "layout": "stack",
            "empty": not quality["rows"],
        },
    ]


def cards_agents(project, f: ReportFilters, link: Links) -> list[dict]:
    data = reports.report_agents(project=project, f=f)
    return [
        _by_group_card(
            "agents",
            "Agent",
            data,
            lambda r: text(r["agent"], link(agent=r["agent_id"])),
            lambda r: {"agent": r["agent_id"]},
            link,
        )
    ]


def cards_reliability(project, f: ReportFilters, link: Links) -> list[dict]:
    retries = reports.report_retries(project=project, f=f)
    outcome_link = {
        "succeeded": link.number("retried_succeeded"),
        "still_retrying": link(category="transient"),
        "retry_exhausted": link.number("retry_exhausted"),
        "other": link.number("retried_other"),
    }
    outcome_number = {
        "succeeded": "retried_succeeded",
        "still_retrying": None,
        "retry_exhausted": None,
        "other": "retried_other",
    }
    outcome_label = {
        "succeeded": number_label("retried_succeeded").capitalize(),
        "still_retrying": "Still retrying",
        "retry_exhausted": number_label("retry_exhausted").capitalize(),
        "other": number_label("retried_other").capitalize(),
    }
    outcome_color = {
        "succeeded": "ok",
        "still_retrying": "transient",
        "retry_exhausted": "exhausted",
        "other": "neutral",
    }
    rt = table(
        "retries",
        "Calls that needed a retry, by outcome",
        [("Outcome", False), ("Calls", True), ("Share", True)],
        [
            [
                text(
                    outcome_label[o["outcome"]],
                    badge=outcome_color[o["outcome"]]
                    if outcome_color[o["outcome"]] != "neutral"
                    else None,
                ),
                num(o["calls"], outcome_link[o["outcome"]], number=outcome_number[o["outcome"]]),
                pct(reports._share(o["calls"], retries["total"])),
            ]
            for o in retries["outcomes"]
        ],
        [
            text("Total"),
            num(retries["total"], link.number("retried")),
            pct(1.0 if retries["total"] else None),
        ],
    )
    at = table(
        "attempts",
        "Attempts used by those calls",
        [("Attempts", True), ("Calls", True)],
        [
            [{"text": a["attempts"], "value": a["attempts"], "num": True}, num(a["calls"])]
            for a in retries["attempts"]
        ],
    )
    rc = chart(
        "chart-retries",
        "bar",
        "Bar chart of attempts used by calls that needed a retry; the table beside it has the numbers.",
        [a["attempts"] for a in retries["attempts"]],
        [
            {
                "label": "Calls",
                "color": "transient",
                "data": [a["calls"] for a in retries["attempts"]],
            }
        ],
        label_title="Attempts used",
        value_title="Calls",
    )
    unknown = reports.report_unknown_outcomes(project=project, f=f)
    ut = table(
        "unknown_outcomes",
        "Calls that had an unknown outcome, by current reason",
        [
            ("Reason now", False),
            (number_label("unknown_by_reconciliation").capitalize(), True),
            (number_label("unknown_by_human").capitalize(), True),
            (number_label("unknown_open").capitalize(), True),
            (number_label("unknown_ever").capitalize(), True),
        ],
        [
            [
                text(
                    r["reason"],
                    link.number("unknown_ever", reason=r["reason"]),
                    badge=r["category"] or "none",
                    label=labels.label(r["reason"], "reason"),
                ),
                num(
                    r["by_reconciliation"],
                    link.number("unknown_by_reconciliation", reason=r["reason"]),
                ),
                num(r["by_human"], link.number("unknown_by_human", reason=r["reason"])),
                num(r["open"], link.number("unknown_open", reason=r["reason"])),
                num(r["calls"], link.number("unknown_ever", reason=r["reason"])),
            ]
            for r in unknown["rows"]
        ],
        [
            text("Total"),
            num(unknown["by_reconciliation"], link.number("unknown_by_reconciliation")),
            num(unknown["by_human"], link.number("unknown_by_human")),
            num(unknown["open"], link.number("unknown_open")),
            num(unknown["total"], link.number("unknown_ever")),
        ],
    )
    uc = chart(
        "chart-unknown",
        "hstacked",
        "Stacked bar of unknown outcomes settled by reconciliation, by a human, or still open; the table has the numbers.",
        ["Unknown outcomes"],
        [
            {
                "label": "Settled by reconciliation",
                "color": "reconciliation",
                "data": [unknown["by_reconciliation"]],
            },
            {"label": "Settled by a human", "color": "approval", "data": [unknown["by_human"]]},
            {"label": "Still open", "color": "unknown_outcome", "data": [unknown["open"]]},
        ],
        short=True,
    )
    dups = reports.report_duplicates(project=project, f=f)
    dt = table(
        "duplicates",
        "Duplicates per tool",
        [
            ("Tool", False),
            (number_label("repeats_answered").capitalize(), True),
            (number_label("duplicate_calls").capitalize(), True),
        ],
        [
            [
                text(r["tool"] or "(no tool name)", link(tool=r["tool"]), mono=r["tool"] != ""),
                num(r["repeats_answered"], link.number("repeats_answered", tool=r["tool"])),
                num(r["duplicate_calls"], link.number("duplicate_calls", tool=r["tool"])),
            ]
            for r in dups["rows"]
        ],
        [
            text("Total"),
            num(dups["repeats_answered"], link.number("repeats_answered")),
            num(dups["duplicate_calls"], link.number("duplicate_calls")),
        ],
    )
    dc = chart(
        "chart-duplicates",
        "bar",
        f"Bar chart of repeats answered with the earlier receipt per {f.granularity}; the table has the totals per tool.",
        [period_label(p["since"], f.granularity) for p in dups["periods"]],
        [
            {
                "label": number_label("repeats_answered").capitalize(),
                "color": "duplicate",
                "data": [p["repeats_answered"] for p in dups["periods"]],
            }
        ],
        value_title="Repeats answered",
    )
    return [
        {
            "title": "Retries",
            "tiles": [
                {
                    "label": f"{plural(retries['total'], 'call')} {number_label('retried')}",
                    "value": f"{retries['total']:,}",
                    "href": link.number("retried"),
                    "number": "retried",
                },
                {
                    "label": number_label("retried_succeeded"),
                    "value": pct(retries["succeeded_share"])["text"],
                    "note": counted(retries["succeeded"], "call"),
                    "href": link.number("retried_succeeded"),
                },
                {
                    "label": number_label("retry_exhausted"),
                    "value": f"{retries['exhausted']:,}",
                    "href": link.number("retry_exhausted"),
                    "number": "retry_exhausted",
                },
            ],
            "chart": rc,
            "table": rt,
            "table2": at,
            "layout": "side",
            "empty": not retries["total"],
        },
        {
            "title": "Calls that had an unknown outcome",
            "subtitle": "now or earlier; the overview's “outcome unknown now” counts only "
            "the calls still unsettled",
            "tiles": [
                {
                    "label": number_label(key),
                    "value": f"{unknown[field]:,}",
                    "href": link.number(key),
                    "number": key,
                }
                for key, field in (
                    ("unknown_ever", "total"),
                    ("unknown_by_reconciliation", "by_reconciliation"),
                    ("unknown_by_human", "by_human"),
                    ("unknown_open", "open"),
                )
            ],
            "chart": uc,
            "table": ut,
            "layout": "side",
            "empty": not unknown["total"],
        },
        {
            "title": "Duplicates",
            "tiles": [
                {
                    "label": number_label("repeats_answered"),
                    "value": f"{dups['repeats_answered']:,}",
                    "href": link.number("repeats_answered"),
                    "number": "repeats_answered",
                },
                {
                    "label": number_label("duplicate_calls"),
                    "value": f"{dups['duplicate_calls']:,}",
                    "href": link.number("duplicate_calls"),
                    "number": "duplicate_calls",
                },
            ],
            "chart": dc,
            "table": dt,
            "layout": "side",
            "empty": not dups["repeats_answered"] and not dups["duplicate_calls"],
        },
    ]


def cards_review(project, f: ReportFilters, link: Links) -> list[dict]:
    data = reports.report_review(project=project, f=f)
    if not data["available"]:
        return [
            {
                "title": "Review health",
                "empty": True,
                "empty_text": "The review queue is not installed.",
            }
        ]
    try:
        queue = reverse("reviews:queue", args=[project.slug])
    except NoReverseMatch:
        queue = None
    at = table(
        "review_open_by_age",
        "Open items by age (now)",
        [("Age", False), ("Items", True)],
        [[text(b["label"]), num(b["items"])] for b in data["open_by_age"]],
        [text("Total"), num(data["open_total"], queue)],
    )
    ac = chart(
        "chart-review-age",
        "bar",
        "Bar chart of open review items by age; the table beside it has the numbers.",
        [b["label"] for b in data["open_by_age"]],
        [
            {
                "label": "Open items",
                "color": "approval",
                "data": [b["items"] for b in data["open_by_age"]],
            }
        ],
        label_title="Age of the open item",
        value_title="Items",
    )
    dt = table(
        "review_decisions",
        "Decisions in the range by type",
        [("Decision", False), ("Items", True), ("Share", True)],
        [
            [
                text(d["resolution"], label=labels.label(d["resolution"], "decision")),
                num(d["items"]),
                pct(reports._share(d["items"], data["decided"])),
            ]
            for d in data["decisions"]
        ],
        [text("Total"), num(data["decided"]), pct(1.0 if data["decided"] else None)],
    )
    dc = chart(
        "chart-review-decisions",
        "hbar",
        "Bar chart of review decisions by type; the table beside it has the numbers.",
        [labels.label(d["resolution"], "decision") for d in data["decisions"]],
        [{"label": "Items", "color": "neutral", "data": [d["items"] for d in data["decisions"]]}],
    )
    tiles = [
        {
            "label": f"open {plural(data['open_total'], 'item')}",
            "value": f"{data['open_total']:,}",
            "href": queue,
        },
        {
            "label": "time to decision, median",
            "value": duration(data["median_seconds"])["text"],
            "note": f"over {counted(data['human_decided'], 'human decision')}",
        },
        {
            "label": "time to decision, p90",
            "value": duration(data["p90_seconds"])["text"],
            # read from log-scale buckets (callgate.reports.tallies)
            "note": "median and p90 to within 5 %" if data["human_decided"] else "",
        },
        {
            "label": plural(data["overrides"], "override"),
            "value": "—" if data["overrides"] is None else f"{data['overrides']:,}",
            "note": "approvals that skipped the reconciliation guard",
        },
    ]
    return [
        {
            "title": "Open items",
            "tiles": tiles,
            "chart": ac,
            "table": at,
            "layout": "side",
            "empty": False,
        },
        {
            "title": "Decisions",
            "chart": dc,
            "table": dt,
            "layout": "side",
            "empty": not data["decided"],
            "empty_text": "No review decisions in this range.",
        },
    ]


BUILDERS = {
    "overview": cards_overview,
    "reasons": cards_reasons,
    "tools": cards_tools,
    "agents": cards_agents,
    "reliability": cards_reliability,
    "review": cards_review,
}


# --- rendering ------------------------------------------------------------------------------


def table_csv(t: dict, *, filename: str) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    writer = csv.writer(response)
    writer.writerow([c["label"] for c in t["columns"]])
    for row in t["rows"] + ([t["foot"]] if t.get("foot") else []):
        writer.writerow([csv_safe(cell.get("value", cell["text"])) for cell in row])
    return response


def _filter_choices(project) -> dict:
    tools = set(
        rollup_rows(project_id=project.pk, by=("tool_name",))
        .values_list("tool_name", flat=True)
        .distinct()
        .order_by()
    )
    tools |= set(
        ToolContract.objects.filter(project=project)
        .values_list("name", flat=True)
        .distinct()
        .order_by()
    )
    return {
        "tools": sorted(t for t in tools if t),
        "agents": list(
            Agent.objects.filter(project=project).values_list("id", "name").order_by("name")
        ),
    }


def _report_page(request: ProjectRequest, section: str) -> HttpResponse:
    project = request.project
    context: dict[str, Any] = {
        "nav_active": "reports",
        "section": section,
        "choices": _filter_choices(project),
        "as_of": _as_of(),
    }
    try:
        f = reports.report_filters_parse(request.GET, project=project)
    except ReportFilterError as exc:
        context.update({"error": exc, "raw": request.GET, "sections": _sections(project, {})})
        return render(request, "callgate/reports/page.html", context, status=400)
    params = f.as_params()
    cards = BUILDERS[section](project, f, Links(project.slug, f))
    if request.GET.get("format") == "csv":
        name = request.GET.get("table", "")
        for card in cards:
            for key in ("table", "table2"):
                t = card.get(key)
                if t and t["name"] == name:
                    return table_csv(
                        t,
                        filename=f"{project.slug}-{name}-{f.since:%Y%m%dT%H}-{f.until:%Y%m%dT%H}.csv",
                    )
        raise Http404("No such table on this page.")
    for card in cards:
        for key in ("table", "table2"):
            if card.get(key):
                card[key]["csv"] = "?" + urlencode(
                    {**params, "format": "csv", "table": card[key]["name"]}
                )
    context.update(
        {
            "f": f,
            "cards": cards,
            "charts": [
                card["chart"] for card in cards if card.get("chart") and not card.get("empty")
            ],
            "sections": _sections(project, params),
            # 24-hour text in UTC, as the periods, the URL and the exports (one time zone)
            "since_text": f.since.strftime("%Y-%m-%d %H:%M"),
            "until_text": f.until.strftime("%Y-%m-%d %H:%M"),
            "presets": _presets(request, params),
            "title": dict((k, label) for k, label, _ in SECTIONS)[section],
        }
    )
    return render(request, "callgate/reports/page.html", context)


def _as_of() -> dict:
    """The rollups' freshness for the page head: ``{"moment": datetime | None, "iso", "text"}``
    ("14:05 UTC" today, "Sat 28 Nov 14:05 UTC" on another day, "unknown" when never refreshed)."""

    moment = rollups_as_of()
    if moment is None:
        return {"moment": None, "iso": "", "text": "unknown"}
    moment = moment.astimezone(reports.UTC)
    same_day = moment.date() == timezone.now().astimezone(reports.UTC).date()
    return {
        "moment": moment,
        "iso": iso(moment),
        "text": moment.strftime("%H:%M UTC" if same_day else "%a %d %b %H:%M UTC"),
    }


def _sections(project, params: dict) -> list[dict]:
    query = ("?" + urlencode(params)) if params else ""
    return [
        {"key": key, "label": label, "url": reverse(name, args=[project.slug]) + query}
        for key, label, name in SECTIONS
    ]


#: The quick ranges: label, length (``metrics.window``), granularity, and what the page
#: says of a window longer than its label (the reports count whole hours).
REPORT_PRESETS = (
    (
        "1 h",
        metrics.WINDOWS["1h"],
        "hour",
        "the last hour: the previous whole hour and this one so far (counts are hourly)",
    ),
    ("24 h", metrics.WINDOWS["24h"], "hour", ""),
    ("7 days", metrics.WINDOWS["7d"], "day", ""),
    ("30 days", metrics.WINDOWS["30d"], "day", ""),
    ("90 days", timedelta(days=90), "week", ""),
)


def _presets(request: HttpRequest, params: dict) -> list[dict]:
    out = []
    for label, delta, gran, note in REPORT_PRESETS:
        since, until = metrics.window(delta)
        query = {k: v for k, v in params.items() if k in ("tool", "agent")}
        query.update({"since": iso(since), "until": iso(until), "granularity": gran})
        out.append(
            {
                "label": label,
                "note": note,
                "url": "?" + urlencode(query),
                "current": params.get("since") == query["since"]
                and params.get("until") == query["until"],
            }
        )
    return out


def _view(section: str):
    @require_GET
    @project_view(role=Role.OPERATOR)
    def view(request: ProjectRequest) -> HttpResponse:
        return _report_page(request, section)

    view.__name__ = f"report_{section}"
    view.__doc__ = f"Reports: {dict((k, label) for k, label, _ in SECTIONS)[section]}."
    return view


report_overview = _view("overview")
report_reasons = _view("reasons")
report_tools = _view("tools")
report_agents = _view("agents")
report_reliability = _view("reliability")
report_review = _view("review")


# included under ``/p/<project>/reports/`` in the ``callgate`` namespace (callgate.urls)
urlpatterns = [
    path("", report_overview, name="reports"),
    path("reasons/", report_reasons, name="reports-reasons"),
    path("tools/", report_tools, name="reports-tools"),
    path("agents/", report_agents, name="reports-agents"),
    path("reliability/", report_reliability, name="reports-reliability"),
    path("review/", report_review, name="reports-review"),
]
