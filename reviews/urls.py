from django.urls import path

from reviews import notify_views, views

app_name = "reviews"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("bulk/", views.bulk, name="bulk"),
    path("count/", views.open_count, name="count"),
    path("<int:pk>/", views.item_detail, name="item"),
    path("<int:pk>/claim/", views.claim, name="claim"),
    path("<int:pk>/release/", views.release, name="release"),
    path("<int:pk>/assign/", views.assign, name="assign"),
    path("<int:pk>/comment/", views.comment, name="comment"),
    path("<int:pk>/reconcile/", views.reconcile, name="reconcile"),
    path("<int:pk>/reconcile/status/", views.reconcile_status, name="reconcile-status"),
    path("<int:pk>/extend/", views.extend, name="extend"),
    path("<int:pk>/decide/", views.decide, name="decide"),
    path("<int:pk>/audit.csv", views.audit_csv, name="audit-csv"),
    path("notifications/", notify_views.notification_settings, name="notifications"),
]
