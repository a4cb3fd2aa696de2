"""Review queue pages (htmx)."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from callgate.access import project_view


@require_GET
@project_view()
def queue(request: HttpRequest) -> HttpResponse:
    return render(request, "reviews/queue.html", {"nav_active": "review"})
