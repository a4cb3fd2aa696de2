"""Where every request goes.

- ``/api/v1/…``            agents (API keys): ``callgate.api``
- ``/api/schema/``, ``/api/docs/``  the OpenAPI document and its browsable page
- ``/p/<project>/…``       browser pages of one project: ``callgate.views``, ``reviews.views``
- ``/login/``, ``/logout/``, ``/admin/``
"""
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from callgate import views


project_patterns = [
    path("", views.overview, name="overview"),
]

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("callgate.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("p/<slug:project>/", include((project_patterns, "callgate"))),
    path("p/<slug:project>/review/", include("reviews.urls")),
]
