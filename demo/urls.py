"""``/simulator/…``: the demo's target system, mounted by ``callgate.urls`` when
``CALLGATE_DEMO`` is on."""

from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt

from demo.simulator import django_view

urlpatterns = [re_path(r"^(?P<path>.*)$", csrf_exempt(django_view), name="simulator")]
