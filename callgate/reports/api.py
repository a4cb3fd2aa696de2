"""REST API v1: the reports as JSON, ``GET /api/v1/reports/<name>``.

Authenticated by API key only; the project is the key's (``request.auth.project``). The
query parameters are the report pages' filters: ``since``, ``until`` (ISO date or
date-time, UTC unless an offset is given), ``granularity`` (hour/day/week), ``tool`` and
``agent`` (an agent id). A value that cannot be used answers 400 naming the field:
``{"error": "since: …", "errors": [{"loc": "since", "msg": "…"}]}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from callgate import metrics
from callgate.auth import ApiKeyAuthentication
from callgate.models import ApiKey
from callgate.reports import selectors as reports
from callgate.reports.selectors import ReportFilterError

FILTER_PARAMETERS = [
    OpenApiParameter(
        "since",
        OpenApiTypes.STR,
        description="Start (inclusive): ISO date or date-time, UTC unless an offset is given; floored to the hour. Default: 7 days before `until`.",
    ),
    OpenApiParameter(
        "until",
        OpenApiTypes.STR,
        description="End (exclusive): ISO date-time, or a date meaning the end of that day; rounded up to the hour. Default: the end of the current hour.",
    ),
    OpenApiParameter(
        "granularity",
        OpenApiTypes.STR,
        enum=list(reports.GRANULARITIES),
        description="Time-series bucket. Default: hour for ranges up to 2 days, else day. At most 744 buckets.",
    ),
    OpenApiParameter("tool", OpenApiTypes.STR, description="Only calls of this tool name."),
    OpenApiParameter(
        "agent",
        OpenApiTypes.INT,
        description="Only calls of this agent (id, of the key's project).",
    ),
]

ERROR = inline_serializer(
    "ReportError",
    {
        "error": serializers.CharField(),
        "errors": serializers.ListField(
            child=inline_serializer(
                "ReportFieldError", {"loc": serializers.CharField(), "msg": serializers.CharField()}
            )
        ),
    },
)

FILTERS = inline_serializer(
    "ReportFilters",
    {
        "since": serializers.DateTimeField(),
        "until": serializers.DateTimeField(),
        "granularity": serializers.ChoiceField(choices=reports.GRANULARITIES),
        "tool": serializers.CharField(allow_null=True),
        "agent": serializers.IntegerField(allow_null=True),
    },
)
PERIOD = inline_serializer(
    "ReportPeriod", {"since": serializers.DateTimeField(), "until": serializers.DateTimeField()}
)
BY_CATEGORY = serializers.DictField(
    child=serializers.IntegerField(), help_text="Calls per category slug."
)
SHARE = serializers.FloatField(
    allow_null=True, help_text="0..1; null when there is nothing to divide by."
)


def _help(key: str) -> str:
    """An API field's help text: the number's label and definition (``metrics.NUMBERS``)."""
    number = metrics.NUMBERS[key]
    return f"{number.label.capitalize()}: {number.definition}"


def _response(name: str, fields: dict) -> serializers.Serializer:
    return inline_serializer(name, {"filters": FILTERS, **fields})


GROUP_ROW: dict[str, serializers.Field] = {
    "calls": serializers.IntegerField(),
    "not_ok": serializers.IntegerField(),
    "not_ok_share": SHARE,
    "attempts": serializers.IntegerField(),
    "repeats_answered": serializers.IntegerField(help_text=_help("repeats_answered")),
    "by_category": BY_CATEGORY,
}

RESPONSES = {
    "categories": _response(
        "CategoriesReport",
        {
            "periods": serializers.ListField(child=PERIOD),
            "categories": serializers.ListField(child=serializers.CharField()),
            "series": serializers.ListField(
                child=inline_serializer(
                    "CategorySeries",
                    {
                        "category": serializers.CharField(),
                        "label": serializers.CharField(),
                        "counts": serializers.ListField(
                            child=serializers.IntegerField(), help_text="One per period."
                        ),
                        "total": serializers.IntegerField(),
                    },
                )
            ),
            "totals": serializers.ListField(child=serializers.IntegerField()),
            "total": serializers.IntegerField(),
            "not_ok": serializers.IntegerField(
                help_text="Classified calls whose category is neither ok nor empty_result "
                "(callgate.metrics); the calls list's category=not_ok."
            ),
            "unclassified": serializers.IntegerField(
                help_text="Calls with no category yet; the calls list's category=none."
            ),
        },
    ),
    "reasons": _response(
        "ReasonsReport",
        {
            "total": serializers.IntegerField(),
            "previous_total": serializers.IntegerField(),
            "previous": PERIOD,
            "rows": serializers.ListField(
                child=inline_serializer(
                    "ReasonRow",
                    {
                        "reason": serializers.CharField(),
                        "category": serializers.CharField(),
                        "calls": serializers.IntegerField(),
                        "share": SHARE,
                        "previous_calls": serializers.IntegerField(),
                        "change": serializers.IntegerField(),
                        "change_ratio": serializers.FloatField(allow_null=True),
                    },
                )
            ),
        },
    ),
    "tools": _response(
        "ToolsReport",
        {
            "categories": serializers.ListField(child=serializers.CharField()),
            "rows": serializers.ListField(
                child=inline_serializer("ToolRow", {"tool": serializers.CharField(), **GROUP_ROW})
            ),
        },
    ),
    "agents": _response(
        "AgentsReport",
        {
            "categories": serializers.ListField(child=serializers.CharField()),
            "rows": serializers.ListField(
                child=inline_serializer(
                    "AgentRow",
                    {
                        "agent_id": serializers.IntegerField(),
                        "agent": serializers.CharField(),
                        **GROUP_ROW,
                    },
                )
            ),
        },
    ),
    "routes": _response(
        "RoutesReport",
        {
            "total": serializers.IntegerField(),
            "rows": serializers.ListField(
                child=inline_serializer(
                    "RouteRow",
                    {
                        "route": serializers.CharField(),
                        "label": serializers.CharField(),
                        "calls": serializers.IntegerField(),
                        "share": SHARE,
                    },
                )
            ),
        },
    ),
    "duplicates": _response(
        "DuplicatesReport",
        {
            "repeats_answered": serializers.IntegerField(help_text=_help("repeats_answered")),
            "duplicate_calls": serializers.IntegerField(help_text=_help("duplicate_calls")),
            "periods": serializers.ListField(
                child=inline_serializer(
                    "DuplicatePeriod",
                    {
                        "since": serializers.DateTimeField(),
                        "until": serializers.DateTimeField(),
                        "repeats_answered": serializers.IntegerField(),
                    },
                )
            ),
            "rows": serializers.ListField(
                child=inline_serializer(
                    "DuplicateRow",
                    {
                        "tool": serializers.CharField(),
                        "repeats_answered": serializers.IntegerField(),
                        "duplicate_calls": serializers.IntegerField(),
                    },
                )
            ),
        },
    ),
    "retries": _response(
        "RetriesReport",
        {
            "total": serializers.IntegerField(help_text=_help("retried")),
            "succeeded": serializers.IntegerField(),
            "succeeded_share": SHARE,
            "retrying": serializers.IntegerField(),
            "exhausted": serializers.IntegerField(),
            "other": serializers.IntegerField(),
            "outcomes": serializers.ListField(
                child=inline_serializer(
                    "RetryOutcome",
                    {
                        "outcome": serializers.ChoiceField(
                            choices=["succeeded", "still_retrying", "retry_exhausted", "other"]
                        ),
                        "calls": serializers.IntegerField(),
                    },
                )
            ),
            "attempts": serializers.ListField(
                child=inline_serializer(
                    "RetryAttempts",
                    {
                        "attempts": serializers.CharField(help_text='"0".."4" or "5+"'),
                        "calls": serializers.IntegerField(),
                    },
                )
            ),
        },
    ),
    "unknown-outcomes": _response(
        "UnknownOutcomesReport",
        {
            "total": serializers.IntegerField(help_text=_help("unknown_ever")),
            "by_reconciliation": serializers.IntegerField(),
            "by_human": serializers.IntegerField(),
            "open": serializers.IntegerField(),
            "rows": serializers.ListField(
                child=inline_serializer(
                    "UnknownOutcomeRow",
                    {
                        "reason": serializers.CharField(),
                        "category": serializers.CharField(),
                        "calls": serializers.IntegerField(),
                        "by_reconciliation": serializers.IntegerField(),
                        "by_human": serializers.IntegerField(),
                        "open": serializers.IntegerField(),
                    },
                )
            ),
        },
    ),
    "contracts": _response(
        "ContractQualityReport",
        {
            "rows": serializers.ListField(
                child=inline_serializer(
                    "ContractQualityRow",
                    {
                        "tool": serializers.CharField(),
                        "version": serializers.IntegerField(),
                        "contract_id": serializers.IntegerField(),
                        "lint_score": serializers.IntegerField(),
                        "lint_findings": serializers.IntegerField(),
                        "calls": serializers.IntegerField(),
                        "argument_errors": serializers.IntegerField(),
                        "argument_error_rate": SHARE,
                        "hallucinations": serializers.IntegerField(),
                        "hallucination_rate": SHARE,
                    },
                )
            ),
        },
    ),
    "review": _response(
        "ReviewHealthReport",
        {
            "available": serializers.BooleanField(),
            "open_total": serializers.IntegerField(),
            "open_by_age": serializers.ListField(
                child=inline_serializer(
                    "ReviewAgeBucket",
                    {
                        "bucket": serializers.CharField(),
                        "label": serializers.CharField(),
                        "items": serializers.IntegerField(),
                    },
                )
            ),
            "decided": serializers.IntegerField(
                help_text="Items closed in the range (decided, settled or expired)."
            ),
            "human_decided": serializers.IntegerField(
                help_text="Of those, items a human decided (the time to decision is over these)."
            ),
            "median_seconds": serializers.FloatField(allow_null=True),
            "p90_seconds": serializers.FloatField(allow_null=True),
            "decisions": serializers.ListField(
                child=inline_serializer(
                    "ReviewDecisionCount",
                    {"resolution": serializers.CharField(), "items": serializers.IntegerField()},
                )
            ),
            "overrides": serializers.IntegerField(allow_null=True),
        },
    ),
}

SELECTORS: dict[str, tuple[Callable[..., dict], str]] = {
    "categories": (
        reports.report_categories,
        "Calls per category per period (stacked time series).",
    ),
    "reasons": (
        reports.report_reasons,
        "Calls per reason with share and change against the previous period of equal length.",
    ),
    "tools": (reports.report_tools, "Calls per tool name, split by category."),
    "agents": (reports.report_agents, "Calls per agent, split by category."),
    "routes": (reports.report_routes, "Calls per route."),
    "duplicates": (
        reports.report_duplicates,
        "Repeats answered with the earlier receipt and duplicate calls, per period and per tool.",
    ),
    "retries": (
        reports.report_retries,
        "Calls that needed a retry: how they ended and the attempts they used.",
    ),
    "unknown-outcomes": (
        reports.report_unknown_outcomes,
        "Unknown outcomes settled by reconciliation, by a human, or still open.",
    ),
    "contracts": (
        reports.report_contracts,
        "Lint score per tool version beside its argument-error and hallucination rate.",
    ),
    "review": (
        reports.report_review,
        "Review queue health: open items by age, time to decision, decisions, overrides.",
    ),
}


class ReportApi(APIView):
    """Base: parse the filters, run the selector, answer ``{"filters": …, …report}``."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated]
    report: str = ""

    def get(self, request: Request) -> Response:
        project = cast(ApiKey, request.auth).project  # ApiKeyAuthentication sets the key
        try:
            f = reports.report_filters_parse(request.query_params, project=project)
        except ReportFilterError as exc:
            return Response(
                {"error": str(exc), "errors": [{"loc": exc.field, "msg": exc.message}]}, status=400
            )
        selector = SELECTORS[self.report][0]
        return Response({"filters": f.as_dict(), **selector(project=project, f=f)})


def _api_view(name: str) -> type[ReportApi]:
    summary = SELECTORS[name][1]

    def get(self, request: Request) -> Response:  # a function per view: extend_schema annotates it
        return ReportApi.get(self, request)

    schema = extend_schema(
        operation_id=f"reports_{name.replace('-', '_')}",
        summary=summary,
        tags=["reports"],
        parameters=FILTER_PARAMETERS,
        responses={200: RESPONSES[name], 400: ERROR},
    )
    return type(
        f"Report{name.title().replace('-', '')}Api",
        (ReportApi,),
        {"report": name, "__doc__": summary, "get": schema(get)},
    )


REPORT_APIS = {name: _api_view(name) for name in SELECTORS}
