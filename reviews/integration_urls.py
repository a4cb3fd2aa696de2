"""Decisions from outside the dashboard (``reviews.notify_views``), under ``/integrations/``:
no project in the path (Slack's requests and the email links name their item)."""

from django.urls import path

from reviews import notify_views

urlpatterns = [
    path("slack/actions", notify_views.slack_actions, name="slack-actions"),
    path("email/<str:token>/", notify_views.email_decision, name="email-decision"),
    path("slack/link/<str:token>/", notify_views.slack_link, name="slack-link"),
]
