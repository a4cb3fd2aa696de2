"""Where every request goes.

- ``/api/v1/…``            agents (API keys): ``callgate.api``
- ``/api/otlp/v1/traces``  OpenTelemetry traces (OTLP/HTTP, API keys): ``callgate.otlp``
- ``/api/schema/``, ``/api/docs/``  the OpenAPI document and its browsable page
- any other ``/api/…``    a JSON 404 (``callgate.api.api_not_found``), never the HTML page
- ``/p/<project>/…``       browser pages of one project: ``callgate.views``, ``reviews.views``,
  ``mcp_gateway.views``
- ``/integrations/…``      decisions from outside: Slack interactions, email decision links
  (``reviews.notify_views``)
- ``/login/``, ``/logout/``, ``/admin/``
- ``/simulator/…``          the demo's target system, when ``CALLGATE_DEMO`` is on: ``demo.urls``
"""

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from callgate import api, health, views
from callgate.prometheus import metrics_view
from callgate.reports import views as report_views

project_patterns = [
    path("", views.overview, name="overview"),
    path("calls/", views.calls, name="calls"),
    path("calls/<path:operation_id>/", views.call_detail, name="call_detail"),
    path("contracts/", views.contracts, name="contracts"),
    path("contracts/<str:name>/", views.contract_detail, name="contract_detail"),
    path("contracts/<str:name>/publish/", views.contract_publish, name="contract_publish"),
    path("agents/", views.agents, name="agents"),
    path("agents/<int:agent_id>/keys/", views.agent_key_create, name="agent_key_create"),
    path("agents/keys/<int:key_id>/revoke/", views.agent_key_revoke, name="agent_key_revoke"),
    path("views/", views.saved_view_create, name="saved_view_create"),
    path("views/<int:view_id>/", views.saved_view_open, name="saved_view_open"),
    path("views/<int:view_id>/delete/", views.saved_view_delete, name="saved_view_delete"),
    path(
        "reports/", include(report_views.urlpatterns)
    ),  # callgate:reports, callgate:reports-<section>
]

urlpatterns = [
    path("", views.home, name="home"),
    path("health/", health.liveness, name="health"),
    path("ready/", health.readiness, name="ready"),
    path("metrics", metrics_view, name="prometheus-django-metrics"),  # callgate.prometheus
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("callgate.api_urls")),
    path("api/otlp/v1/traces", api.OtlpTracesApi.as_view(), name="api-otlp-traces"),
    path("api/schema/", api.ApiSchemaApi.as_view(), name="api-schema"),
    path("api/docs/", api.ApiDocsView.as_view(url_name="api-schema"), name="api-docs"),
    re_path(r"^api/(?P<path>.*)$", api.api_not_found, name="api-not-found"),  # JSON, never HTML
    path("p/<slug:project>/", include((project_patterns, "callgate"))),
    path("p/<slug:project>/review/", include("reviews.urls")),
    path("p/<slug:project>/gateway/", include("mcp_gateway.urls")),
    path("p/<slug:project>/alerts/", include("alerts.urls")),
    path("integrations/", include("reviews.integration_urls")),  # Slack, email decision links
]

if settings.CALLGATE_DEMO:  # the demo's target system (demo.simulator)
    urlpatterns.append(path("simulator/", include("demo.urls")))
