"""API keys: issuing, authenticating and masking them.

A key looks like ``cg_<prefix>_<secret>``: ``prefix`` is 8 hex characters used to find the
row, ``secret`` is ``secrets.token_urlsafe(32)`` (256 bits). Only the SHA-256 digest of the
whole key and its last four characters are stored (OWASP ASVS 6.5.2, 11.5.1); the digest is
compared in constant time (``hmac.compare_digest``). Keys are accepted only in the
``Authorization: Bearer`` header, never in a URL (ASVS 14.2.1), and masked in logs.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from redis.exceptions import RedisError
from rest_framework import authentication, exceptions

from callgate.models import Agent, ApiKey

logger = logging.getLogger(__name__)
KEY_PATTERN = re.compile(r"^cg_([0-9a-f]{8})_([A-Za-z0-9_-]{43})$")
#: last_used_at is written at most this often per key (seconds), to keep the hot path cheap.
LAST_USED_RESOLUTION = 60
#: Keys this process has authenticated, by digest: the row (with its agent and project) and
#: the project's key stamp when it was read. Bounded; the oldest entry goes first.
KEYS_CACHE_SIZE = 4096
#: Seconds an entry is trusted at most, even with its stamp unchanged: a bump lost while the
#: shared cache was unreachable is outlived.
KEYS_CACHE_MAX_AGE = 60
_keys_cache: dict[str, tuple[ApiKey, str, float]] = {}
_keys_cache_lock = threading.Lock()


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedKey:
    api_key: ApiKey
    plain: str  # shown once, never stored


def api_key_issue(*, agent: Agent, name: str = "", can_decide: bool = False) -> IssuedKey:
    """Create a key for ``agent``. Returns the row and the plain key (shown exactly once).
    ``can_decide`` lets the key report operator decisions (see ``ApiKey.can_decide``)."""
    while True:
        prefix = secrets.token_hex(4)
        if not ApiKey.objects.filter(prefix=prefix).exists():
            break
    plain = f"cg_{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiKey.objects.create(
        project=agent.project,
        agent=agent,
        name=name,
        prefix=prefix,
        digest=_digest(plain),
        last4=plain[-4:],
        can_decide=can_decide,
    )
    return IssuedKey(api_key=row, plain=plain)


def api_key_revoke(*, api_key: ApiKey) -> None:
    """Revoke ``api_key``: refused by every process from its next request on (the stamp is
    dropped before the write and again once it commits; ``keys_stamp_bump``)."""
    keys_stamp_bump(api_key.project_id)
    ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


def _stamp_name(project_id: int) -> str:
    return f"keys-stamp:{project_id}"


def keys_stamp_bump(project_id: int) -> None:
    """Make every process read the project's keys (and with them its agents and the project
    row, ``config_version`` included) from the database again: a key revoked, an agent or
    the project changed, a contract changed (``callgate.signals``). The stamp lives in
    Django's cache, shared by the processes in production (Redis); dropping it makes the next
    reader draw a new one: now, and again when the change commits (a process that read the
    rows in between would otherwise keep them under its new stamp). The shared cache
    unreachable does not fail the change: while it is down every API request is refused
    (503), and after it the old entries live ``KEYS_CACHE_MAX_AGE`` seconds at most."""

    def drop() -> None:
        try:
            cache.delete(_stamp_name(project_id))
        except RedisError as exc:
            logger.warning("project %s: its key stamp could not be dropped: %s", project_id, exc)

    drop()
    transaction.on_commit(drop)
    with _keys_cache_lock:
        for digest in [d for d, (row, *_) in _keys_cache.items() if row.project_id == project_id]:
            del _keys_cache[digest]


def api_key_verify(plain: str) -> ApiKey | None:
    """The active key matching ``plain`` (with its agent and project loaded), or None.
    Constant-time digest comparison.

    A key this process verified before is answered from memory, without SQL, while its
    project's stamp in the shared cache is the one read before the row was loaded
    (``keys_stamp_bump`` drops it on any change; an evicted stamp only costs a read), for
    ``KEYS_CACHE_MAX_AGE`` seconds at most. The
    stamp is read before the row, so a change made while the row loads is never hidden by
    it. A miss costs two queries (the key's project, then the row after the stamp)."""
    match = KEY_PATTERN.match(plain)
    if not match:
        return None
    digest = _digest(plain)
    cached = _keys_cache.get(digest)
    if cached is not None:
        row, stamp, loaded = cached
        if (
            time.monotonic() - loaded < KEYS_CACHE_MAX_AGE
            and cache.get(_stamp_name(row.project_id)) == stamp  # a stamp evicted: read again
        ):
            _last_used_touch(row)
            return row
    found = ApiKey.objects.filter(prefix=match.group(1)).values_list("pk", "project_id").first()
    if found is None:
        return None
    name = _stamp_name(found[1])
    if (stamp := cache.get(name)) is None:  # the first reader since a change draws it
        cache.add(name, secrets.token_hex(8), timeout=None)
        stamp = cache.get(name)
    row = ApiKey.objects.select_related("agent", "project").get(pk=found[0])  # after the stamp
    if not hmac.compare_digest(row.digest, digest) or row.revoked_at is not None:
        return None
    with _keys_cache_lock:
        if stamp is not None:  # None: evicted at once; this row is not kept
            _keys_cache[digest] = (row, stamp, time.monotonic())
        while len(_keys_cache) > KEYS_CACHE_SIZE:
            del _keys_cache[next(iter(_keys_cache))]
    _last_used_touch(row)
    return row


def _last_used_touch(row: ApiKey) -> None:
    now = timezone.now()
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > LAST_USED_RESOLUTION:
        transaction.on_commit(lambda: ApiKey.objects.filter(pk=row.pk).update(last_used_at=now))
        row.last_used_at = now


class AgentPrincipal:
    """``request.user`` for key-authenticated requests: the agent, never a Django user."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False

    def __init__(self, api_key: ApiKey):
        self.api_key = api_key
        self.agent = api_key.agent
        self.project = api_key.project

    def __str__(self) -> str:
        return f"agent:{self.agent.name}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer cg_…``. Sets ``request.user`` to an ``AgentPrincipal`` and
    ``request.auth`` to the ``ApiKey``. A malformed or unknown key is a 401 with a message
    that says which; no header at all falls through to the next authenticator. An address
    with ``CALLGATE_AUTH_FAILURES_PER_MINUTE`` failed keys in a minute gets 429 (guessing)."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request)
        if not header:
            return None
        try:
            text = header.decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed(
                "Authorization header must be ASCII: 'Bearer <api key>'."
            ) from None
        parts = text.split()
        if len(parts) != 2 or parts[0].lower() != "bearer":
            raise exceptions.AuthenticationFailed(
                "Authorization header must be 'Bearer <api key>'."
            )
        if not KEY_PATTERN.match(parts[1]):
            auth_failure_record(request)
            raise exceptions.AuthenticationFailed(
                "Malformed API key: expected 'cg_<8 hex>_<43 characters>'."
            )
        auth_failures_check(request)
        api_key = api_key_verify(parts[1])
        if api_key is None:
            auth_failure_record(request)
            raise exceptions.AuthenticationFailed("Unknown or revoked API key.")
        return AgentPrincipal(api_key), api_key

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="callgate"'


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of ``ApiKeyAuthentication`` (drf-spectacular)."""

    target_class = "callgate.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "cg_<8 hex>_<43 characters>"}


# --- failed keys per client address ------------------------------------------------------


def _client_address(request) -> str:
    return request.META.get("REMOTE_ADDR", "") or "unknown"


def auth_failures_check(request) -> None:
    """Raises ``Throttled`` (429) when this address failed ``CALLGATE_AUTH_FAILURES_PER_MINUTE``
    key look-ups in the current minute."""
    limit = settings.CALLGATE_AUTH_FAILURES_PER_MINUTE
    if limit and (cache.get(f"authfail:{_client_address(request)}") or 0) >= limit:
        raise exceptions.Throttled(
            wait=60, detail="Too many failed API key attempts from this address; wait a minute."
        )


def auth_failure_record(request) -> None:
    """Count one failed key look-up for this address (a one-minute window)."""
    key = f"authfail:{_client_address(request)}"
    if cache.add(key, 1, timeout=60):
        return
    try:
        cache.incr(key)
    except ValueError:  # expired in between
        cache.add(key, 1, timeout=60)
