"""Log records: API keys masked (OWASP ASVS 7.1.1: no credentials in logs), and the request
ID (``X-Request-ID``, or one made up) and operation ID of the work at hand in context, for
JSON logs (``LOG_FORMAT=json``: python-json-logger).

Kept free of model imports: logging is configured before Django's apps are ready."""

from __future__ import annotations

import contextvars
import logging
import re
import uuid

from gunicorn.glogging import Logger
from pythonjsonlogger.json import JsonFormatter

_KEY_IN_TEXT = re.compile(r"cg_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


def mask_api_keys(text: str) -> str:
    """Replace every API key in ``text`` with its prefix and ``…``."""
    return _KEY_IN_TEXT.sub(lambda m: m.group(0)[:12] + "…", text)


#: The request being served and the operation being worked on, for every log record.
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
OPERATION_ID: contextvars.ContextVar[str] = contextvars.ContextVar("operation_id", default="")
_REQUEST_ID_SHAPE = re.compile(r"[A-Za-z0-9._:-]{1,100}")


class ContextFilter(logging.Filter):
    """Adds ``request_id`` and ``operation_id`` (empty when none) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        record.operation_id = OPERATION_ID.get()
        return True


class RequestIdMiddleware:
    """Sets the request ID for the logs of one request: the client's ``X-Request-ID`` when it
    looks like one, else a new UUID; echoed in the response's ``X-Request-ID``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        given = request.headers.get("X-Request-ID", "")
        request_id = given if _REQUEST_ID_SHAPE.fullmatch(given) else uuid.uuid4().hex
        # not reset on the way out: Django logs a 4xx/5xx ("django.request") after the
        # middleware returned; the next request on this thread sets its own
        REQUEST_ID.set(request_id)
        response = self.get_response(request)
        response["X-Request-ID"] = request_id
        return response


class MaskApiKeysFilter(logging.Filter):
    """Logging filter: no API key reaches a log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_api_keys(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


class GunicornLogger(Logger):
    """gunicorn's logger with every access-log atom masked: the request line (``%(r)s``),
    path, query string, headers (``{name}i``), environment (``{name}e``), referrer, in
    whatever ``access_log_format`` is set. gunicorn runs with
    ``--logger-class callgate.logmask.GunicornLogger`` (Dockerfile, docker-compose.yml)."""

    def atoms(self, resp, req, environ, request_time):
        return {
            name: mask_api_keys(value) if isinstance(value, str) else value
            for name, value in super().atoms(resp, req, environ, request_time).items()
        }


class MaskedJsonFormatter(JsonFormatter):
    """python-json-logger's formatter, masking keys in the whole line: a record's extra
    attributes (Django's ``request``, with its query string) are written too."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_api_keys(super().format(record))
