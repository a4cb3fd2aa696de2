"""REST API v1: thin views that parse, call a service, and serialise.

The ingest hot path validates with pydantic (``callgate.schemas``), never with DRF
serializers. Every error answers with one shape: ``{"error": str, "errors": [{"loc", "msg"}]}``.
"""
from __future__ import annotations

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc, context):
    """DRF's handler with callgate's error shape: ``{"error": "…"}`` plus field errors."""
    if isinstance(exc, exceptions.ParseError):
        return Response({"error": f"Request body is not valid JSON: {exc.detail}", "errors": []},
                        status=status.HTTP_400_BAD_REQUEST)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data.get("detail") if isinstance(response.data, dict) else response.data
    if isinstance(detail, list):
        detail = "; ".join(str(d) for d in detail)
    response.data = {"error": str(detail) if detail is not None else str(response.data), "errors": []}
    return response
