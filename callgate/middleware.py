"""Request guards that apply to every URL."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse


class RejectNulMiddleware:
    """A NUL character in the path or query string is a 400: PostgreSQL text cannot hold it,
    so it would otherwise fail deep in a query as a 500."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or "%00" in request.META.get("QUERY_STRING", ""):
            message = "The URL contains a NUL character (%00)."
            if request.path.startswith("/api/"):
                return JsonResponse(
                    {"error": message, "errors": [{"loc": "url", "msg": message}]}, status=400
                )
            return HttpResponse(message, status=400, content_type="text/plain")
        return self.get_response(request)
