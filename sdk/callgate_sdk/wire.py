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

import jsonpointer
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


def pointer_problem(pointer: Any) -> str | None:
    """None when ``pointer`` is an RFC 6901 JSON Pointer to a value inside the arguments
    (not ``""``, the whole document, nor ``-``, past the end of an array), else why not."""
    if not isinstance(pointer, str):
        return "must be a JSON Pointer string"
    if pointer == "":
        return 'must point inside the arguments (RFC 6901 "" is the whole object)'
    try:
        parts = jsonpointer.JsonPointer(pointer).parts
    except jsonpointer.JsonPointerException as exc:
        return f"{pointer!r} is not a JSON Pointer (RFC 6901): {exc}"
    if "-" in parts:
        return f"{pointer!r}: '-' names no existing array element"
    return None


def without_volatile(arguments: Any, volatile_arguments: Iterable[str] = ()) -> Any:
    """``arguments`` without the values that the JSON Pointers (RFC 6901) of a contract's
    ``volatile_arguments`` point to (TAXONOMY v2: a client idempotency key, a nonce, a client
    timestamp). A pointer to nothing is ignored. ``arguments`` itself is not changed."""
    if not volatile_arguments or not isinstance(arguments, dict):
        return arguments
    copy = json.loads(json.dumps(arguments))  # a deep copy of JSON values
    for pointer in volatile_arguments:
        try:
            parts = jsonpointer.JsonPointer(pointer).parts
        except jsonpointer.JsonPointerException:
            continue
        if not parts:
            continue
        node: Any = copy
        for part in parts[:-1]:
            node = _child(node, part)
            if node is None:
                break
        if isinstance(node, dict):
            node.pop(parts[-1], None)
        elif isinstance(node, list) and parts[-1].isdigit() and int(parts[-1]) < len(node):
            node[int(parts[-1])] = None  # keeps the other elements where they are
    return copy


def _child(node: Any, part: str) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return None


def canonical_arguments(arguments: Any, volatile_arguments: Iterable[str] = ()) -> bytes:
    """The RFC 8785 bytes that identify an operation's arguments: ``canonical_json`` of the
    arguments without their volatile values. The operation ID and the duplicate and mismatch
    checks are derived from these."""
    return canonical_json(without_volatile(arguments, volatile_arguments))


def derive_operation_id(
    *,
    request_id: str,
    tool: str,
    arguments: Any = None,
    raw_arguments: str | None = None,
    canonical: bytes | None = None,
    volatile_arguments: Iterable[str] = (),
    ordinal: int = 1,
) -> str:
    """``op_`` + 32 hex of SHA-256 over request ID, tool name and the RFC 8785 canonical
    arguments without the contract's ``volatile_arguments`` (``canonical_arguments``; the raw
    string when they do not parse; ``canonical`` when the caller has those bytes already).
    Key order, whitespace and volatile values never change it; model text other than the
    arguments never enters it. ``ordinal`` k > 1 marks the k-th identical call of one model
    turn (TAXONOMY v2, "Whole model turns"), a separate operation."""
    if canonical is not None:
        body = canonical
    elif raw_arguments is not None:
        body = raw_arguments.encode()
    else:
        body = canonical_arguments(arguments, volatile_arguments)
    parts = [request_id.encode(), tool.encode(), body]
    if ordinal > 1:
        parts.append(f"#{ordinal}".encode())
    digest = hashlib.sha256(b"\x1f".join(parts)).hexdigest()
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


#: Why an edit that moved a redacted value is refused: the agent puts its own value back by
#: position, so a "•••" in another place would get another entry's value.
HIDDEN_MOVED = "a hidden value cannot be moved; keep the entry or remove its hidden field"


class HiddenValueMoved(ValueError):
    """An edit moved a redacted value (``hidden_moves``); ``paths`` names each array."""

    def __init__(self, paths: list[str]):
        self.paths = paths
        super().__init__(f"{', '.join(paths)}: {HIDDEN_MOVED}")


def _holds_redacted(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_redacted(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_redacted(item) for item in value)
    return value == REDACTED


def _same_entry(edited: Any, original: Any) -> bool:
    """``edited`` equals ``original``, a ``"•••"`` of ``edited`` matching any value."""
    if edited == REDACTED:
        return True
    if isinstance(edited, dict):
        return (
            isinstance(original, dict)
            and edited.keys() == original.keys()
            and all(_same_entry(edited[key], original[key]) for key in edited)
        )
    if isinstance(edited, list):
        return (
            isinstance(original, list)
            and len(edited) == len(original)
            and all(_same_entry(e, o) for e, o in zip(edited, original, strict=True))
        )
    return edited == original and type(edited) is type(original)


def hidden_moves(edited: Any, original: Any, path: str = "$") -> list[str]:
    """The JSON paths (``$.payments``) of the arrays of ``edited`` whose redacted values
    (``"•••"``) may not be where they were in ``original``: an array holding one whose
    length changed, or whose entry holding one equals another position's entry of
    ``original`` and not its own (a removed, added or reordered entry). A redacted value
    is put back by its place, so at such a path it would get another entry's value.
    ``original``: the stored (redacted) arguments, or the agent's own; in either, a
    ``"•••"`` of ``edited`` matches any value. An entry edited in place keeps its place."""
    if isinstance(edited, dict) and isinstance(original, dict):
        return [
            moved
            for key in edited
            if key in original
            for moved in hidden_moves(edited[key], original[key], f"{path}.{key}")
        ]
    if not isinstance(edited, list) or not _holds_redacted(edited):
        return []
    if not isinstance(original, list) or len(edited) != len(original):
        return [path]
    for index, entry in enumerate(edited):
        if (
            _holds_redacted(entry)
            and not _same_entry(entry, original[index])
            and any(_same_entry(entry, other) for other in original[:index] + original[index + 1 :])
        ):
            return [path]
    return [
        moved
        for index, entry in enumerate(edited)
        for moved in hidden_moves(entry, original[index], f"{path}[{index}]")
    ]


def edited_arguments(edited: Any, proposed: Any) -> Any:
    """The arguments to execute after an operator approved ``edited`` ones (a decision's
    ``arguments``): ``edited`` with each ``"•••"`` put back to the ``proposed`` value at
    the same place. callgate never stores a sensitive value, so an operator can only leave
    it as it was; the agent, which has it, restores it. Raises ``HiddenValueMoved`` when an
    array holding a ``"•••"`` lost, gained or reordered entries (``hidden_moves``): a value
    is never put back across changed positions (callgate refuses such an edit too)."""
    moved = hidden_moves(edited, proposed)
    if moved:
        raise HiddenValueMoved(moved)
    return _restored(edited, proposed)


def _restored(edited: Any, proposed: Any) -> Any:
    if edited == REDACTED:
        return proposed
    if isinstance(edited, dict):
        mine = proposed if isinstance(proposed, dict) else {}
        return {
            key: _restored(item, mine[key]) if key in mine else item for key, item in edited.items()
        }
    if isinstance(edited, list):
        mine_list = proposed if isinstance(proposed, list) else []
        return [
            _restored(item, mine_list[i]) if i < len(mine_list) else item
            for i, item in enumerate(edited)
        ]
    return edited


#: The most characters of one text (an error, a result string) that an event stores: longer
#: texts keep their head and tail around a marker that gives the original length.
STORED_TEXT_CHARS = 4_000


def cut_text(text: str, limit: int = STORED_TEXT_CHARS) -> str:
    """``text`` when it has at most ``limit`` characters, else its head and tail (about
    two thirds and one third of ``limit``) around ``…[N of M characters cut]…``. The cause
    of a failure is read from the whole text before it is cut (TAXONOMY v2)."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n…[{cut:,} of {len(text):,} characters cut]…\n{text[-tail:]}"


def cut_texts(value: Any, limit: int = STORED_TEXT_CHARS) -> Any:
    """``value`` with every string longer than ``limit`` cut by ``cut_text`` (the same object
    when none is)."""
    if isinstance(value, str):
        return cut_text(value, limit) if len(value) > limit else value
    if isinstance(value, dict):
        items = {key: cut_texts(item, limit) for key, item in value.items()}
        return value if all(items[k] is value[k] for k in value) else items
    if isinstance(value, list):
        elements = [cut_texts(item, limit) for item in value]
        return value if all(a is b for a, b in zip(elements, value, strict=True)) else elements
    return value


#: Deeper JSON is refused at the door (the REST API, the OTLP receiver): every later step
#: (redaction, canonical JSON, schema validation) walks it recursively.
MAX_JSON_DEPTH = 64


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value: arrays and objects inside each other (a scalar
    is 0, ``[]`` is 1, ``[{}]`` is 2). Without recursion; leaves are never pushed."""
    if type(value) is not dict and type(value) is not list:
        return 0
    deepest, stack = 1, [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, level = pop()
        if level > deepest:
            deepest = level
        for child in node.values() if type(node) is dict else node:
            kind = type(child)
            if kind is dict or kind is list:
                push((child, level + 1))
    return deepest
