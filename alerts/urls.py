from django.urls import path

from alerts import views

app_name = "alerts"

urlpatterns = [
    path("", views.rules, name="rules"),
    path("save/", views.rule_save, name="save"),
    path("<int:pk>/delete/", views.rule_delete, name="delete"),
    path("<int:pk>/evaluate/", views.rule_evaluate, name="evaluate"),
    path("<int:pk>/acknowledge/", views.rule_acknowledge, name="acknowledge"),
    path("<int:pk>/snooze/", views.rule_snooze, name="snooze"),
    path("<int:pk>/unsnooze/", views.rule_unsnooze, name="unsnooze"),
    path("<int:pk>/resolve/", views.rule_resolve, name="resolve"),
    path("history/", views.history, name="history"),
]
