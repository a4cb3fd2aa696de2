"""API throttling: per API key and per project (DRF's ``SimpleRateThrottle`` on Django's
cache, which is Redis in production so every web worker counts together), a per-address
limit on failed key look-ups (key guessing), and the ``RateLimit-*`` response headers
(draft-ietf-httpapi-ratelimit-headers: ``RateLimit-Limit``, ``RateLimit-Remaining``,
``RateLimit-Reset`` in seconds) of the tightest limit that applied. A refused request is a
429 with ``Retry-After`` in the API's error shape (``callgate.api.exception_handler``).

Rates: ``CALLGATE_THROTTLE_KEY``, ``CALLGATE_THROTTLE_PROJECT`` (DRF's ``"<n>/<period>"``)
and ``CALLGATE_AUTH_FAILURES_PER_MINUTE``.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

from callgate.auth import AgentPrincipal


class _Throttle(SimpleRateThrottle):
    """Records its limit, remaining requests and reset time on the request for the headers."""

    # set by SimpleRateThrottle.__init__ from parse_rate (ints whenever ``rate`` is set);
    # drf-stubs does not declare them
    num_requests: int
    duration: int

    def allow_request(self, request, view) -> bool:
        allowed = super().allow_request(request, view)
        if self.rate is not None and getattr(self, "key", None):
            remaining = max(0, self.num_requests - len(self.history))
            reset = self.duration - (self.now - self.history[-1]) if self.history else 0
            current = getattr(request._request, "ratelimit", None)
            if current is None or remaining < current[1]:
                request._request.ratelimit = (self.num_requests, remaining, max(0, int(reset)))
        return allowed

    def get_rate(self):
        return getattr(settings, self.setting)

    def _principal(self, request):
        return request.user if isinstance(request.user, AgentPrincipal) else None


class ApiKeyRateThrottle(_Throttle):
    """Requests per API key."""

    scope, setting = "api_key", "CALLGATE_THROTTLE_KEY"

    def get_cache_key(self, request, view):
        principal = self._principal(request)
        return f"throttle:key:{principal.api_key.pk}" if principal else None


class ProjectRateThrottle(_Throttle):
    """Requests per project, all its keys together."""

    scope, setting = "project", "CALLGATE_THROTTLE_PROJECT"

    def get_cache_key(self, request, view):
        principal = self._principal(request)
        return f"throttle:project:{principal.project.pk}" if principal else None


class RateLimitHeadersMiddleware:
    """Adds ``RateLimit-Limit``, ``RateLimit-Remaining`` and ``RateLimit-Reset`` to API
    responses that a throttle counted (the tightest of them)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (numbers := getattr(request, "ratelimit", None)) is not None:
            limit, remaining, reset = numbers
            response["RateLimit-Limit"] = str(limit)
            response["RateLimit-Remaining"] = str(remaining)
            response["RateLimit-Reset"] = str(reset)
        return response
