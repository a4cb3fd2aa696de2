"""Wire helpers shared by the server and the SDK: RFC 8785 canonical JSON, argument
digests, operation-ID derivation and redaction.

Pure: no Django, no I/O. ``tests/test_layout.py`` imports this module in a fresh
interpreter without settings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import rfc8785

REDACTED = "•••"
#: Keys whose values are always redacted, whatever the contract says (compared lower-case,
#: ignoring "-" and "_").
OBVIOUS_SECRETS = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "apikey",
        "token",
        "accesstoken",
        "refreshtoken",
        "authorization",
        "clientsecret",
        "privatekey",
        "sessionid",
        "cookie",
        "creditcard",
        "cardnumber",
        "cvv",
    }
)


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JSON Canonicalization Scheme) bytes of ``value``.

    JCS writes every number as the IEEE 754 double it denotes (RFC 8785 §3.2.2.3; I-JSON,
    RFC 7493 §2.2), so an integer beyond ±2**53 is taken as that double: ``1e21`` and
    ``1000000000000000000000`` (what PostgreSQL's jsonb makes of it on the way through the
    inbox) canonicalise alike. Values still outside the domain (integers beyond the double
    range) fall back to sorted, compact ``json.dumps``."""
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        try:
            return rfc8785.dumps(_as_doubles(value))
        except (
            rfc8785.CanonicalizationError,
            OverflowError,
            TypeError,
            ValueError,
            RecursionError,
        ):
            pass
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError):
        pass
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    ).encode()


def _as_doubles(value: Any) -> Any:
    """``value`` with integers of ±2**53 and beyond as floats (``OverflowError`` past the double range)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value) if abs(value) >= 2**53 else value
    if isinstance(value, dict):
        return {key: _as_doubles(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_doubles(item) for item in value]
    return value


def arguments_digest(arguments: Any) -> str:
    return hashlib.sha256(canonical_json(arguments)).hexdigest()


def derive_operation_id(
    *,
    request_id: str,
    tool: str,
    arguments: Any = None,
    raw_arguments: str | None = None,
    canonical: bytes | None = None,
) -> str:
    """``op_`` + 32 hex of SHA-256 over request ID, tool name and the RFC 8785 canonical
    arguments (the raw string when they do not parse; ``canonical`` when the caller has
    the canonical bytes already). Key order and whitespace never change it; model text
    other than the arguments never enters it."""
    if canonical is not None:
        body = canonical
    else:
        body = canonical_json(arguments) if raw_arguments is None else raw_arguments.encode()
    digest = hashlib.sha256(b"\x1f".join([request_id.encode(), tool.encode(), body])).hexdigest()
    return f"op_{digest[:32]}"


def _secret_key(key: str) -> bool:
    return key.lower().replace("-", "").replace("_", "") in OBVIOUS_SECRETS


def redact(value: Any, sensitive: Iterable[str] = ()) -> Any:
    """A copy of ``value`` whose sensitive values are ``"•••"``: keys named in the contract's
    ``sensitive_fields`` (a name anywhere, or a dotted path from the top) and obvious secrets."""
    names = {s for s in sensitive if "." not in s}
    paths = {s for s in sensitive if "." in s}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, item in node.items():
                here = f"{path}.{key}" if path else str(key)
                hidden = key in names or here in paths or _secret_key(str(key))
                out[key] = REDACTED if hidden and item is not None else walk(item, here)
            return out
        if isinstance(node, list):
            return [walk(item, path) for item in node]
        return node

    return walk(value, "")
