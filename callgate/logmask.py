"""Masking of API keys in log records (OWASP ASVS 7.1.1: no credentials in logs).

Kept free of model imports: logging is configured before Django's apps are ready."""

from __future__ import annotations

import logging
import re

from gunicorn.glogging import Logger

_KEY_IN_TEXT = re.compile(r"cg_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


def mask_api_keys(text: str) -> str:
    """Replace every API key in ``text`` with its prefix and ``…``."""
    return _KEY_IN_TEXT.sub(lambda m: m.group(0)[:12] + "…", text)


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
