"""``/simulator/…``: the demo's target system, mounted by ``callgate.urls`` when
``CALLGATE_DEMO`` is on."""

from django.urls import path, re_path
from django.views.decorators.csrf import csrf_exempt

from demo.simulator import django_view
from demo.sink import webhook_sink

urlpatterns = [
    path("webhook-sink/", webhook_sink, name="webhook-sink"),
    re_path(r"^(?P<path>.*)$", csrf_exempt(django_view), name="simulator"),
]
