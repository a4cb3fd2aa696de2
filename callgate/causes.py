"""Reading the cause of a failure (``shared/TAXONOMY.md`` v2, "Reading the cause of a failure").

One reader for every way an execution tells how it went: an attempt's ``outcome``, ``sent``
and ``http_status``, an MCP server's JSON-RPC error (``jsonrpc_error``), the text of an
``error``, of an MCP ``isError`` result or of a JSON-RPC error message, and error or
partial-failure markers inside a successful result. In the taxonomy's order, the first step
that names a cause decides:

1. ``outcome`` (``timeout``, ``connection_reset``, ``circuit_open``) and ``sent: false``; a
   timeout whose text names a connect failure counts as ``sent: false``;
2. a JSON-RPC code (the ``jsonrpc_error``, one named in the text, or a negative ``code`` in
   an embedded error): -32601/-32602 the server refused a valid call, -32700/-32600 the
   envelope was refused, -32603 and -32000…-32099 a server error unless the text names
   another cause;
3. ``http_status`` when it is 4xx or 5xx;
4. the text: an HTTP status named in it (the first), else the first phrase family that
   matches (``PHRASE_FAMILIES``, in order);
5. nothing named.

The result is a ``Cause``: what kind of failure, the HTTP status or JSON-RPC code read, the
whole text (for the access check of a 404 and for quoting), and ``said``, how it was read
in plain words ("rate limit read from the result body"), which the call's event records.
``callgate.classification`` maps a ``Cause`` to a reason with the contract's effect.

Pure: no Django, no I/O. The texts come from targets and may be of any length, so every
pattern runs in time linear in the text: the phrase families, statuses and markup in RE2,
the others (anchored on a word, each repetition bounded) in Python's ``re``. The patterns are
compiled once; the reader runs only on failures and on successful results that carry a
marker, and reads the phrases only when the steps before name nothing.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import re2

from callgate_sdk.providers import mcp_result_is_error, mcp_result_text

# --- kinds of cause -----------------------------------------------------------------------

NOT_SENT = "not_sent"  # nothing left the caller: connect failure, DNS, sent: false
CIRCUIT_OPEN = "circuit_open"
TIMEOUT = "timeout"  # the request may have been processed
RESET = "reset"  # the connection died mid-request; it may have been processed
STATUS = "status"  # an HTTP status (given, named in the text, or implied by a phrase)
REFUSED_VALID_CALL = "refused_valid_call"  # JSON-RPC -32601 / -32602
ENVELOPE = "envelope"  # JSON-RPC -32700 / -32600: the client's envelope was refused
PARTIAL = "partial"  # some items failed, others succeeded
NONE = "none"  # nothing named: an error of the tool's own

JSONRPC_NAMES = {
    -32700: "parse error",
    -32600: "invalid request",
    -32601: "method not found",
    -32602: "invalid params",
    -32603: "internal error",
}


def _server_error_code(code: int) -> bool:
    """-32603 (internal error) and the implementation-defined server errors -32000…-32099
    (JSON-RPC 2.0 §5.1): read as an HTTP 500 unless the text names another cause."""
    return code == -32603 or -32099 <= code <= -32000


# --- step 4: the phrase families ----------------------------------------------------------


def _words(*phrases: str) -> str:
    """A regex matching any of ``phrases``, the words of each joined by optional spaces,
    underscores or hyphens (``not found`` also matches ``NotFound``, ``not_found``)."""
    return "|".join(r"[\s_-]{0,3}".join(re.escape(w) for w in p.split()) for p in phrases)


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


def _re2(pattern: str):
    return re2.compile(pattern, _RE2_OPTIONS)


@dataclass(frozen=True)
class PhraseFamily:
    """One row of the taxonomy's phrase table: what a match means (``kind``, and the HTTP
    status it counts as), the label used when saying how the cause was read, and the
    compiled ``pattern`` (RE2; ``words``, for a guarded family, finds the phrase itself
    inside a match)."""

    label: str
    kind: str
    status: int | None
    pattern: Any
    words: Any


def _family(
    label: str, kind: str, status: int | None, regex: str, *, guarded: str = ""
) -> PhraseFamily:
    """``regex`` matches case-insensitively; ``guarded`` phrases only where no lowercase
    letter stands just before them ("accurate limit" is no rate limit, while
    "OpenAIRateLimitError" is)."""
    pattern = f"(?i:{regex})" + (f"|(?:^|[^a-z])(?i:{guarded})" if guarded else "")
    words = _re2(f"(?i:{regex}|{guarded})") if guarded else None
    return PhraseFamily(label, kind, status, _re2(pattern), words)


#: TAXONOMY v2 step 4, in order: the first family that matches decides. Beside each
#: family's listed phrases stand only spellings of the same words in other libraries
#: (gRPC codes, Node errno names, Python exception names).
PHRASE_FAMILIES: tuple[PhraseFamily, ...] = (
    _family(
        "connect failure",
        NOT_SENT,
        None,
        r"connect\s+ETIMEDOUT|"
        + _words("connect timeout", "connection refused", "name or service not known")
        + r"|dial\s+tcp\b[^\n]{0,300}?i/o\s+timeout|ECONNREFUSED|getaddrinfo|ENOTFOUND|EHOSTUNREACH|"
        r"ENETUNREACH|nodename nor servname|temporary failure in name resolution|"
        r"could not resolve host|no route to host|network is unreachable|"
        # aiohttp's ClientConnectorError, urllib3's NewConnectionError
        r"cannot connect to host|connect call failed|failed to establish a new connection",
    ),
    _family(
        "timeout",
        TIMEOUT,
        None,
        _words("timed out", "time out", "deadline exceeded", "awaiting headers"),
    ),
    _family(
        "connection reset",
        RESET,
        None,
        _words(
            "connection reset",
            "connection aborted",
            "connection closed",
            "broken pipe",
            "unexpected EOF",
            "socket hang up",
            "remote disconnected",
            "server disconnected",
            "closed connection without response",
            "incomplete read",
        )
        + r"|ECONNRESET|ECONNABORTED|\bEPIPE\b",
    ),
    _family(
        "rate limit",
        STATUS,
        429,
        _words("too many requests")
        # S3's SlowDown, gRPC's RESOURCE_EXHAUSTED, AWS's "Rate exceeded"
        + r"|quota|throttl|"
        + _words(
            "slow down", "resource exhausted", "request rate", "rate exceeded", "request limit"
        ),
        guarded=_words("rate limit"),
    ),
    _family(
        "credential refused",
        STATUS,
        401,
        _words(
            "unauthorized",
            "unauthorised",
            "invalid token",
            "token expired",
            "expired token",
            "token has expired",
            "token is expired",
            "token revoked",
            "invalid api key",
            "incorrect api key",
            "api key not valid",
            "unauthenticated",
            "not authenticated",
            "authentication failed",
            "authentication required",
            "bad credentials",
            "invalid credentials",
            "invalid auth",
            "not authed",
            "invalid grant",
            "jwt expired",
            "no api key",
            "api key is invalid",
            "expired credentials",
            "credentials have expired",
        )
        + r"|invalid[\s_-]*(?:access|bearer|oauth|refresh)[\s_-]*token",
    ),
    _family(
        "forbidden",
        STATUS,
        403,
        _words(
            "forbidden",
            "permission denied",
            "insufficient scope",
            "insufficient scopes",
            "insufficient permissions",
            "insufficient permission",
            "insufficient privileges",
            "missing scope",
            "access denied",
            "access is denied",
            "not permitted",
            "not accessible by",
        ),
    ),
    _family(
        "not found",
        STATUS,
        404,
        r"\bno[\s_-]*such|ENOENT|"
        + _words(
            "not found",
            "does not exist",
            "doesn't exist",
            "could not find",
            "couldn't find",
            "cannot find",
            "can't find",
        ),
    ),
    # Past the taxonomy's list, so they decide only where none of its families matches:
    # a refusal worded softly (after "not found", so that "does not exist or you do not have
    # permission" stays a 404 that may hide a permission problem), and a temporary outage.
    _family(
        "no permission",
        STATUS,
        403,
        r"(?:do|does|did)\s+not\s+have\s+(?:the\s+)?(?:required\s+)?(?:permission|access)|"
        r"(?:don't|doesn't|didn't|lacks?)\s+(?:the\s+)?(?:required\s+)?(?:permission|access)|"
        + _words("insufficient access", "not allowed to access", "not authorized to"),
    ),
    _family(
        "service unavailable",
        STATUS,
        503,
        _words("service unavailable", "temporarily unavailable", "overloaded"),
    ),
)

#: "HTTP 429", "HTTP/1.1 502", "HTTP Error 404", "status: 403", "status code 404",
#: "statusCode=503", "Error code: 429", "401 Unauthorized", "(503) Service Unavailable".
_REASON_PHRASES = (
    "bad request|unauthori[sz]ed|payment required|forbidden|not found|method not allowed|"
    "not acceptable|request time-?out|conflict|gone|precondition failed|payload too large|"
    "request entity too large|unsupported media type|unprocessable (?:entity|content)|locked|"
    "too many requests|internal server error|not implemented|bad gateway|service unavailable|"
    "gateway time-?out"
)
STATUS_IN_TEXT = _re2(
    r"(?i)\bHTTP(?:/\d(?:\.\d)?)?(?:\s{0,3}(?:error|status|code))?[\s:#=-]{0,4}(\d{3})\b"
    r"|\bstatus(?:[\s_-]{0,2}code)?[\"']?\s{0,3}(?:[:=]|\bis\b|\bof\b)?\s{0,3}[\"']?(\d{3})\b"
    r"|\b(?:error|response)[\s_-]{0,2}code[\"']?\s{0,3}[:=]?\s{0,3}[\"']?(\d{3})\b"
    r"|[\"']code[\"']\s{0,3}:\s{0,3}(\d{3})\b"
    r"|\b(\d{3})\s{1,3}(?:Client|Server)\s{1,3}Error\b"  # requests: "500 Server Error: …"
    r"|\berror[\s:#]{0,4}(\d{3})\b"
    rf"|\(?\b(\d{{3}})\)?[\s:-]{{1,4}}(?:{_REASON_PHRASES})\b"
)

#: A JSON-RPC error code named in a text: "MCP error -32601", "JSON-RPC error -32602",
#: ``"code": -32603``, "code = -32000".
JSONRPC_IN_TEXT = re.compile(
    r"(?i)(?:mcp[\s_-]{0,2}error|json[\s_-]{0,2}rpc(?:[\s_-]{0,2}error)?|error|code)[\W_]{0,3}"
    r"(-32[0-7]\d\d)\b"
)

#: A 404 whose text speaks of access, sharing, permission or visibility may hide a
#: permission problem (``not_found_or_forbidden``).
ACCESS_WORDS = _re2(
    r"(?i)\baccess|\bshar(?:e|ed|ing)\b|permission|visib|authori[sz]|\bprivate\b|forbidden"
)


def status_in_text(text: str) -> tuple[int, str] | None:
    """The first HTTP error status (4xx or 5xx) named in ``text`` and the words that name it."""
    for match in STATUS_IN_TEXT.finditer(text):
        number = int(next(g for g in match.groups() if g))
        if 400 <= number <= 599:
            return number, match.group(0).strip(" (:")
    return None


def jsonrpc_code_in_text(text: str) -> int | None:
    match = JSONRPC_IN_TEXT.search(text)
    return int(match.group(1)) if match else None


def _family_set():
    """Every family in one RE2 set: one pass over the text says which families match."""
    families = re2.Set.SearchSet(_RE2_OPTIONS)
    for family in PHRASE_FAMILIES:
        families.Add(family.pattern.pattern)
    families.Compile()
    return families


_FAMILY_SET = _family_set()


def phrase_in_text(text: str) -> tuple[PhraseFamily, str] | None:
    """The first phrase family (in the taxonomy's order) that matches ``text``, and the
    phrase it matched."""
    matched = _FAMILY_SET.Match(text)
    if not matched:
        return None
    family = PHRASE_FAMILIES[min(matched)]
    found = family.pattern.search(text).group(0)
    if family.words is not None:  # drop the character before a guarded phrase
        found = family.words.search(found).group(0)
    return family, found


# --- what the reader returns ----------------------------------------------------------------


@dataclass(frozen=True)
class FailedItem:
    """One failed item of a batch result: how the result names it (an ID, or ``index N``)
    and its error message (may be empty)."""

    item: str
    error: str = ""

    def as_dict(self) -> dict:
        return {"item": self.item, "error": self.error}


@dataclass(frozen=True)
class Cause:
    """What a failure's cause was read as.

    ``kind``: one of the module's kinds. ``status``: the HTTP status it counts as (given,
    named in the text or a marker, or implied by a phrase family: then ``status_named`` is
    False). ``code``: the JSON-RPC code read. ``text``: the failure's whole text. ``said``:
    how it was read, in plain words. ``failed_items``: a batch result's failed items."""

    kind: str
    status: int | None = None
    status_named: bool = False
    code: int | None = None
    text: str = ""
    said: str = ""
    failed_items: tuple[FailedItem, ...] = field(default_factory=tuple)
    failed_count: int = 0

    @property
    def speaks_of_access(self) -> bool:
        return bool(ACCESS_WORDS.search(self.text))


@dataclass(frozen=True)
class Failure:
    """The inputs of the reader, whatever carried them."""

    outcome: str = "error"  # error | timeout | connection_reset | circuit_open
    sent: bool | None = True
    http_status: int | None = None
    code: int | None = None  # JSON-RPC code given as a field (or in an embedded error)
    text: str = ""
    source: str = "the error text"  # where the text came from, for ``said``


def _quote_short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_failure(failure: Failure) -> Cause:
    """The cause of ``failure`` by the taxonomy's steps 1-5 (module docstring)."""
    text, source = failure.text, failure.source
    # 1. outcome and sent
    if failure.outcome == "circuit_open":
        return Cause(CIRCUIT_OPEN, text=text, said="outcome circuit_open")
    if failure.sent is False:
        cause = _read_text_and_status(failure)
        status = cause.status if cause.kind == STATUS else None
        return Cause(NOT_SENT, status=status, text=text, said="sent: false")
    if failure.outcome in ("timeout", "connection_reset"):
        found = phrase_in_text(text) if text else None
        if found and found[0].kind == NOT_SENT:
            return Cause(
                NOT_SENT, text=text, said=f"a connect failure ('{found[1]}') named in {source}"
            )
        kind = TIMEOUT if failure.outcome == "timeout" else RESET
        return Cause(kind, text=text, said=f"outcome {failure.outcome}")
    # 2. a JSON-RPC code
    code = failure.code if failure.code is not None else jsonrpc_code_in_text(text)
    if code is not None:
        name = f"JSON-RPC {code}" + (f" ({JSONRPC_NAMES[code]})" if code in JSONRPC_NAMES else "")
        where = source if failure.code is None else "the JSON-RPC error"
        if code in (-32601, -32602):
            return Cause(REFUSED_VALID_CALL, code=code, text=text, said=f"{name} from {where}")
        if code in (-32700, -32600):
            return Cause(ENVELOPE, code=code, text=text, said=f"{name} from {where}")
        if _server_error_code(code):
            read = _read_text(text, source)
            if read is not None:
                other, words = read
                where_said = "its message" if failure.code is not None else source
                return _replace(other, code=code, said=f"{name} with {words} in {where_said}")
            return Cause(
                STATUS,
                status=500,
                code=code,
                text=text,
                said=f"{name} from {where}: a server error",
            )
    # 3. an HTTP error status, 4. the text, 5. nothing
    cause = _read_text_and_status(failure)
    return _replace(cause, code=code) if code is not None else cause


def _read_text_and_status(failure: Failure) -> Cause:
    status = failure.http_status
    if status is not None and 400 <= status <= 599:
        return Cause(
            STATUS, status=status, status_named=True, text=failure.text, said=f"HTTP {status}"
        )
    read = _read_text(failure.text, failure.source)
    if read is not None:
        return read[0]
    return Cause(NONE, text=failure.text, said=f"no cause named in {failure.source}")


def _read_text(text: str, source: str) -> tuple[Cause, str] | None:
    """Step 4: an HTTP status named in ``text``, else the first phrase family; with the
    words that named it."""
    if not text:
        return None
    named = status_in_text(text)
    if named:
        status, words = named
        words = f"'{_quote_short(words)}'"
        cause = Cause(
            STATUS,
            status=status,
            status_named=True,
            text=text,
            said=f"HTTP {status} ({words}) named in {source}",
        )
        return cause, words
    found = phrase_in_text(text)
    if found:
        family, words = found
        words = f"'{_quote_short(words)}'"
        cause = Cause(
            family.kind,
            status=family.status,
            text=text,
            said=f"{family.label} read from {source} ({words})",
        )
        return cause, words
    return None


def _replace(cause: Cause, **changes: Any) -> Cause:
    return Cause(**{**cause.__dict__, **changes})


# --- markers in a successful result -------------------------------------------------------

_FAILED_LISTS = ("failures", "failed", "failed_items", "failedItems")
_FAILED_COUNTS = ("failure_count", "failureCount", "failed_count", "failedCount")
_SUCCESS_LISTS = ("succeeded", "successes", "results")
_SUCCESS_COUNTS = ("success_count", "successCount", "succeeded_count", "succeededCount")
#: keys that name a failed item, in order of preference (else its first other scalar)
_ITEM_KEYS = ("id", "item", "key", "name", "email", "index")
#: keys that carry an item's or a marker's message
_MESSAGE_KEYS = ("error", "message", "error_message", "errorMessage", "reason", "detail")
_CODE_KEYS = (
    "code",
    "status",
    "status_code",
    "statusCode",
    "http_status",
    "httpStatus",
    "error_code",
    "errorCode",
)
#: keys of a marker whose text tells the cause (OAuth's error_description, Telegram's
#: description beside error_code)
_MARKER_TEXT_KEYS = (
    "error",
    "message",
    "error_message",
    "errorMessage",
    "error_description",
    "description",
    "detail",
    "msg",
)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _numeric_code(value: Any) -> tuple[int | None, int | None]:
    """``(http_status, jsonrpc_code)`` that a marker's numeric code denotes, if any."""
    number = _count(value)
    if number is None and isinstance(value, str) and re.fullmatch(r"-?\d{3,5}", value.strip()):
        number = int(value)
    if number is None:
        return None, None
    if 400 <= number <= 599:
        return number, None
    if -32768 <= number <= -32000:
        return None, number
    return None, None


def _texts(node: Mapping, keys: tuple[str, ...]) -> list[str]:
    out = []
    for key in keys:
        value = node.get(key)
        if isinstance(value, str) and value.strip():
            out.append(value.strip())
        elif isinstance(value, Mapping):
            out.extend(_texts(value, ("message", "code", "status", "type", "detail")))
    return out


def _marker(node: Mapping) -> bool:
    """True when ``node`` carries an error marker at its top level (TAXONOMY v2)."""
    error = node.get("error")
    status = node.get("status")
    return (
        node.get("ok") is False
        or node.get("success") is False
        or node.get("type") == "error"
        or (isinstance(status, str) and status.lower() in ("error", "failed"))
        or (isinstance(error, str) and bool(error.strip()))
        or (isinstance(error, Mapping) and ("message" in error or "code" in error))
        or (node.get("object") == "error" and _count(status) is not None)
    )


def _marker_failure(node: Mapping, source: str) -> Failure:
    """The status, JSON-RPC code and text an error marker reports."""
    raw_error = node.get("error")
    error: Mapping = raw_error if isinstance(raw_error, Mapping) else {}
    status, code = None, None
    for container, key in [(error, k) for k in _CODE_KEYS] + [(node, k) for k in _CODE_KEYS]:
        http, rpc = _numeric_code(container.get(key))
        status, code = status or http, code if code is not None else rpc
    texts = _texts(node, _MARKER_TEXT_KEYS)
    for container in (error, node):  # a string code names the cause in words
        if isinstance(container.get("code"), str):
            texts.append(container["code"])
    errors = node.get("errors")  # {"success": false, "errors": [{"message": …}]}
    if isinstance(errors, list):
        for item in errors[:5]:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, Mapping):
                texts.extend(_texts(item, _MARKER_TEXT_KEYS))
    return Failure(
        http_status=status, code=code, text="; ".join(dict.fromkeys(texts)), source=source
    )


def _item_label(item: Any, position: int) -> str:
    if isinstance(item, Mapping):
        for key in _ITEM_KEYS:
            value = item.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
                return f"index {value}" if key == "index" else str(value)
        for key, value in item.items():
            if key not in _MESSAGE_KEYS + _CODE_KEYS and isinstance(value, (str, int)):
                return str(value)
        return f"index {position}"
    if isinstance(item, (str, int)) and not isinstance(item, bool):
        return str(item)
    return f"index {position}"


def _item_message(item: Any) -> str:
    if not isinstance(item, Mapping):
        return ""
    return "; ".join(_texts(item, _MESSAGE_KEYS))


def _partial(node: Mapping, source: str) -> Cause | None:
    """A batch result that reports failed items: ``PARTIAL`` beside evidence of success,
    else (every item failed) the cause its items' messages name. Without a failed list, the
    items of a success list that carry an error marker of their own are the failed ones."""
    failed: list = next(
        (node[k] for k in _FAILED_LISTS if isinstance(node.get(k), list) and node[k]), []
    )
    failed_count = max([_count(node.get(k)) or 0 for k in _FAILED_COUNTS] + [len(failed)])
    if not failed_count:
        return None
    listed = [item for k in _SUCCESS_LISTS if isinstance(node.get(k), list) for item in node[k]]
    if not failed:  # {"results": [{"id": 2, "status": "failed", …}], "failed_count": 1}
        failed = [item for item in listed if isinstance(item, Mapping) and _marker(item)]
    items = tuple(
        FailedItem(_item_label(item, i), _item_message(item)) for i, item in enumerate(failed)
    )
    succeeded = any(not (isinstance(item, Mapping) and _marker(item)) for item in listed) or any(
        (_count(node.get(k)) or 0) > 0 for k in _SUCCESS_COUNTS
    )
    if succeeded:
        return Cause(
            PARTIAL,
            said=f"{failed_count} failed item(s) beside successes, read from {source}",
            failed_items=items,
            failed_count=failed_count,
        )
    status = None
    for item in failed:
        if isinstance(item, Mapping):
            marker = _marker_failure(item, source)
            status = status or marker.http_status
    texts = list(dict.fromkeys(m.error for m in items if m.error))
    cause = read_failure(
        Failure(
            http_status=status,
            text="; ".join(texts[:5]),
            source="the failed items' messages",
        )
    )
    return _replace(cause, failed_items=items, failed_count=failed_count)


def _json_object(text: str) -> Mapping | None:
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _marker_objects(result: Any, mcp: bool) -> list[Mapping]:
    """Where markers are read: the result object itself, or an MCP result's
    ``structuredContent`` and its single text content when that parses as a JSON object."""
    if not mcp:
        return [result] if isinstance(result, Mapping) else []
    if not isinstance(result, Mapping):
        return []
    out = []
    if isinstance(result.get("structuredContent"), Mapping):
        out.append(result["structuredContent"])
    content = result.get("content")
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], Mapping):
        if content[0].get("type") == "text" and isinstance(content[0].get("text"), str):
            parsed = _json_object(content[0]["text"])
            if parsed is not None:
                out.append(parsed)
    return out


def read_result(result: Any, *, mcp: bool, markers: bool = True) -> Cause | None:
    """The failure a successful attempt's result reports, or None when it reports none.

    An MCP ``isError`` result is a failure whose text is its text content (TAXONOMY: a
    2xx names no cause, so its HTTP status is not read). With ``markers`` (the contract's
    ``result_error_markers``), partial-failure and error markers are read from the object
    itself (an MCP result's ``structuredContent`` or single JSON text content)."""
    source = "the result body"
    if mcp and mcp_result_is_error(result):
        failure = Failure(text=mcp_result_text(result), source="the isError text")
        for node in _marker_objects(result, True):
            if _marker(node):
                embedded = _marker_failure(node, "the isError text")
                failure = Failure(
                    http_status=embedded.http_status,
                    code=embedded.code,
                    text="; ".join(t for t in (embedded.text, failure.text) if t),
                    source="the isError text",
                )
                break
        return read_failure(failure)
    if not markers:
        return None
    for node in _marker_objects(result, mcp):
        partial = _partial(node, source)
        if partial is not None:
            return partial
        if _marker(node):
            return read_failure(_marker_failure(node, source))
    return None


# --- quoting and storing the target's text ------------------------------------------------

#: The most of the target's text an observation quotes (TAXONOMY v2 "Observation text").
QUOTE_CHARS = 500

_HTML_TAGS = (
    "html|head|body|title|meta|link|h[1-6]|p|div|span|center|hr|br|pre|code|a|b|i|u|em|strong|"
    "small|ul|ol|li|dl|dt|dd|table|thead|tbody|tr|td|th|address|header|footer|main|nav|section|"
    "article|img|form|input|button|label|noscript|font|iframe|svg|path"
)
_MARKUP = _re2(
    r"(?is)<script\b.*?</script\s*>|<style\b.*?</style\s*>|<!--.*?-->|<!doctype[^>]*>"
    rf"|</?(?:{_HTML_TAGS})\b[^<>]*>"
)
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: lines of a stack trace: Java/JS "at …", Python "File …" and "Traceback", Go frames
_STACK_LINE = re.compile(
    r"^\s*(?:at\s+(?:async\s+|new\s+)?[\w$.<>\[\]/\\:-]+(?:\s*\(.*\))?\s*$|\.\.\.\s*\d+\s+more"
    r"|File\s+\"|[~^]*\^[~^]*\s*$|goroutine\s+\d+|/\S+\.go:\d+)"
)


def quote_target(text: str | None, limit: int = QUOTE_CHARS) -> str:
    """``text`` from the target made fit to quote to a model: markup, escape sequences,
    control characters and stack frames removed, whitespace collapsed, cut to ``limit``
    characters (with an ellipsis)."""
    if not text:
        return ""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "<" in text:
        text = html.unescape(_MARKUP.sub(" ", text))
    lines, in_traceback = [], False
    for line in text.splitlines():
        if line.startswith("Traceback ("):  # Python: indented frames follow, then the error
            in_traceback = True
            continue
        if in_traceback and line[:1].isspace():
            continue
        in_traceback = False
        if not _STACK_LINE.match(line):
            lines.append(line)
    text = " ".join(_CONTROL.sub(" ", " ".join(lines)).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
