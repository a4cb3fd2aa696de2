"""REST API v1 for agents (``Authorization: Bearer <api key>``)."""
from django.urls import path

from callgate import api

urlpatterns = [
]
