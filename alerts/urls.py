from django.urls import path

from alerts import views

app_name = "alerts"

urlpatterns = [
    path("", views.rules, name="rules"),
    path("save/", views.rule_save, name="save"),
    path("<int:pk>/delete/", views.rule_delete, name="delete"),
    path("<int:pk>/evaluate/", views.rule_evaluate, name="evaluate"),
    path("history/", views.history, name="history"),
]
