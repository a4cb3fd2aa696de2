"""REST API v1 for agents (``Authorization: Bearer <api key>``)."""

from django.urls import path

from callgate import api
from callgate.reports.api import REPORT_APIS

urlpatterns = [
    path("events", api.EventsIngestApi.as_view(), name="api-events"),
    path("events/<str:event_id>", api.EventDetailApi.as_view(), name="api-event-detail"),
    path("calls", api.CallsApi.as_view(), name="api-calls"),
    path("calls/<str:operation_id>", api.CallDetailApi.as_view(), name="api-call-detail"),
    path("tools/<str:name>", api.ToolRegisterApi.as_view(), name="api-tool"),
    # reports (callgate.reports.api): GET /api/v1/reports/categories, /reasons, /tools, …
    *[
        path(f"reports/{name}", view.as_view(), name=f"api-report-{name}")
        for name, view in REPORT_APIS.items()
    ],
]
