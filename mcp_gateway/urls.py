from django.urls import path

from mcp_gateway import views

app_name = "mcp_gateway"
urlpatterns = [
    path("", views.gateway, name="gateway"),
    path("upstreams/", views.upstream_save, name="upstream_save"),
    path("upstreams/<int:pk>/delete/", views.upstream_delete, name="upstream_delete"),
]
