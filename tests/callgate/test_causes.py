"""The reader of a failure's cause (``callgate.causes``, TAXONOMY v2 "Reading the cause of a
failure") and what classification makes of it: pure, table-driven, plus property tests."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate import causes
from callgate.causes import Failure, quote_target, read_failure, read_result
from callgate.classification import Attempt, Contract, classify_attempt
from callgate.taxonomy import Reason, Route
from callgate_sdk.wire import cut_text, cut_texts

R = Reason

# --- step 4: the phrase families, in order ----------------------------------------------------

#: text -> the family label that must decide it (None: no family)
PHRASES = [
    ("connect ETIMEDOUT 10.0.0.7:443", "connect failure"),
    ("(connect timeout=10) timed out", "connect failure"),
    ('Post "https://h/v1": dial tcp 10.0.0.9:443: i/o timeout', "connect failure"),
    ("ConnectionRefusedError: [Errno 111] Connection refused", "connect failure"),
    ("connect ECONNREFUSED 127.0.0.1:25", "connect failure"),
    ("socket.gaierror: [Errno -2] Name or service not known", "connect failure"),
    ("getaddrinfo ENOTFOUND api.example.com", "connect failure"),
    ("Cannot connect to host api.example.com:443 ssl:default", "connect failure"),
    ("upstream request timed out after 30s", "timeout"),
    ("ReadTimeout", "timeout"),
    ("rpc error: code = DeadlineExceeded desc = context deadline exceeded", "timeout"),
    ("net/http: request canceled (Client.Timeout exceeded while awaiting headers)", "timeout"),
    ("read ETIMEDOUT", "timeout"),
    ("read ECONNRESET", "connection reset"),
    ("ConnectionResetError: [Errno 104] Connection reset by peer", "connection reset"),
    ("write: broken pipe", "connection reset"),
    ('Post "https://h/send": unexpected EOF', "connection reset"),
    ("McpError: Connection closed", "connection reset"),
    ("rate limit exceeded, retry in 30 s", "rate limit"),
    ("RateLimitError: busy", "rate limit"),
    ("OpenAIRateLimitError", "rate limit"),
    ("ratelimited", "rate limit"),
    ("request was rate-limited", "rate limit"),
    ("Too many requests, please slow down", "rate limit"),
    ("Daily quota exceeded", "rate limit"),
    ("Request was throttled", "rate limit"),
    ("RESOURCE_EXHAUSTED", "rate limit"),
    ("OAuth token expired at 09:00", "credential refused"),
    ("rpc error: code = Unauthenticated", "credential refused"),
    ("Invalid API key provided", "credential refused"),
    ("Bad credentials", "credential refused"),
    ("insufficient scope: repo:read", "forbidden"),
    ("AccessDenied: Access Denied", "forbidden"),
    ("chown: Operation not permitted", "forbidden"),
    ("PERMISSION_DENIED", "forbidden"),
    ("open /data/q3.csv: no such file or directory", "not found"),
    ('relation "sales_2031" does not exist', "not found"),
    ("NoSuchKey", "not found"),
    ("object_not_found", "not found"),
    ("You do not have permission to do that", "no permission"),
    ("upstream overloaded", "service unavailable"),
    ("UnitError: precision lost below 1e-9", None),
    ("the accurate limit of the gauge", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "label"), PHRASES)
def test_each_phrase_names_its_family(text, label):
    found = causes.phrase_in_text(text)
    assert (found[0].label if found else None) == label


#: two families in one text: the earlier family in the table decides, wherever it stands
ORDER = [
    ("quota service timed out after 5s", "timeout"),
    ("Unauthorized: API key not found", "credential refused"),
    ("connection reset while waiting for the rate limiter", "connection reset"),
    ("not found: Permission denied", "forbidden"),
    ("Issue does not exist or you do not have permission to see it", "not found"),
]


@pytest.mark.parametrize(("text", "label"), ORDER)
def test_the_first_family_in_the_table_decides_not_the_first_in_the_text(text, label):
    assert causes.phrase_in_text(text)[0].label == label


#: a phrase of each family, for the property test below
FAMILY_SAMPLES = [
    "connection refused",
    "timed out",
    "connection reset",
    "quota",
    "unauthorized",
    "forbidden",
    "not found",
]


@settings(max_examples=150, deadline=None)
@given(
    pair=st.lists(
        st.integers(min_value=0, max_value=len(FAMILY_SAMPLES) - 1),
        min_size=2,
        max_size=2,
        unique=True,
    ),
    filler=st.text(alphabet="xyz0123 .,;", max_size=20),
)
def test_family_order_wins_over_position_in_the_text(pair, filler):
    first, second = pair
    text = f"{FAMILY_SAMPLES[second]}{filler} {FAMILY_SAMPLES[first]}"
    winner = min(first, second)
    assert causes.phrase_in_text(text)[0] is causes.PHRASE_FAMILIES[winner]


# --- statuses and JSON-RPC codes named in the text --------------------------------------------

STATUSES = [
    ("upstream returned HTTP 429", 429),
    ("request failed, status: 403", 403),
    ("GET /repos/a/b/issues: 401 Unauthorized", 401),
    ("HTTP/1.1 502 Bad Gateway", 502),
    ("Request failed with status code 404", 404),
    ("urllib.error.HTTPError: HTTP Error 503: Service Unavailable", 503),
    ('{"status_code": 422}', 422),
    ("Error code: 429 - {'error': 'x'}", 429),
    ("500 Server Error: Internal Server Error for url: https://h/x", 500),
    ("<title>504 Gateway Time-out</title>", 504),
    ("proxy answered HTTP 502; its own retry then got HTTP 429", 502),
    ("HTTP 200 but the body says no", None),  # a 2xx names no cause
    ("connect ECONNREFUSED 127.0.0.1:8025", None),
    ("row 429,EU,1429", None),
    ("MCP error -32603: Internal error", None),
]


@pytest.mark.parametrize(("text", "status"), STATUSES)
def test_a_status_named_in_the_text_is_read_first_one_wins(text, status):
    found = causes.status_in_text(text)
    assert (found[0] if found else None) == status


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("McpError: MCP error -32601: Method not found", -32601),
        ('{"jsonrpc": "2.0", "error": {"code": -32602, "message": "x"}}', -32602),
        ("JSON-RPC error -32000: Server error", -32000),
        ("balance -32000 EUR", None),
    ],
)
def test_a_jsonrpc_code_named_in_the_text_is_read(text, code):
    assert causes.jsonrpc_code_in_text(text) == code


# --- the steps in order ----------------------------------------------------------------------

STEPS = [
    # 1. outcome and sent come first
    (Failure(outcome="circuit_open", text="HTTP 429"), causes.CIRCUIT_OPEN, None),
    (Failure(sent=False, text="anything"), causes.NOT_SENT, None),
    (Failure(sent=False, http_status=429), causes.NOT_SENT, 429),
    (Failure(outcome="timeout", text="HTTP 429"), causes.TIMEOUT, None),
    (Failure(outcome="timeout", text="connect ETIMEDOUT 1.2.3.4:443"), causes.NOT_SENT, None),
    (Failure(outcome="connection_reset", http_status=503), causes.RESET, None),
    # 2. a JSON-RPC code before http_status and text
    (Failure(code=-32602, http_status=400, text="not found"), causes.REFUSED_VALID_CALL, None),
    (Failure(code=-32700, text="rate limit"), causes.ENVELOPE, None),
    (Failure(code=-32603, text="Internal error"), causes.STATUS, 500),
    (Failure(code=-32603, text="upstream rate limit exceeded"), causes.STATUS, 429),
    (Failure(code=-32000, text="connect ECONNREFUSED 1.2.3.4:25"), causes.NOT_SENT, None),
    (Failure(code=-32001, text="Request timed out"), causes.TIMEOUT, None),
    (Failure(code=-32800, text="quota exhausted"), causes.STATUS, 429),  # not a mapped code
    (Failure(text="MCP error -32601: Method not found"), causes.REFUSED_VALID_CALL, None),
    (Failure(text="MCP error -32603: warehouse answered HTTP 429"), causes.STATUS, 429),
    # 3. an error status before the text; a 2xx names nothing
    (Failure(http_status=400, text="invalid token format"), causes.STATUS, 400),
    (Failure(http_status=200, text="division by zero"), causes.NONE, None),
    (Failure(http_status=200, text="token expired"), causes.STATUS, 401),
    # 4. a status in the text before the phrases
    (Failure(text="HTTP 422: quota must be positive"), causes.STATUS, 422),
    # 5. nothing named
    (Failure(text="UnitError: precision lost"), causes.NONE, None),
    (Failure(), causes.NONE, None),
]


@pytest.mark.parametrize(("failure", "kind", "status"), STEPS)
def test_the_steps_are_read_in_order(failure, kind, status):
    cause = read_failure(failure)
    assert (cause.kind, cause.status) == (kind, status)
    assert cause.said


def test_a_server_error_code_with_another_cause_says_so():
    cause = read_failure(
        Failure(code=-32603, text="Internal error: upstream API rate limit exceeded")
    )
    assert cause.said == "JSON-RPC -32603 (internal error) with 'rate limit' in its message"


# --- markers in successful results ----------------------------------------------------------

MARKERS = [
    ({"ok": False, "error": "rate limit exceeded"}, False, (causes.STATUS, 429)),
    ({"success": False, "message": "Permission denied for DOC-12"}, False, (causes.STATUS, 403)),
    ({"type": "error", "message": "Upstream service timed out"}, False, (causes.TIMEOUT, None)),
    ({"status": "error", "error": {"code": 404, "message": "gone"}}, False, (causes.STATUS, 404)),
    ({"status": "FAILED", "message": "Monthly query quota"}, False, (causes.STATUS, 429)),
    ({"error": "column is ambiguous", "rows": []}, False, (causes.NONE, None)),
    ({"error": {"code": 401}}, False, (causes.STATUS, 401)),
    ({"status": "error", "status_code": 503}, False, (causes.STATUS, 503)),
    ({"success": False, "code": 429, "message": "slow"}, False, (causes.STATUS, 429)),
    ({"object": "error", "status": 429, "code": "rate_limited"}, False, (causes.STATUS, 429)),
    ({"error": {"code": -32602, "message": "Invalid params"}}, False, (causes.REFUSED_VALID_CALL, None)),
    ({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, False, (causes.STATUS, 503)),
    # no markers
    ({"ok": True, "error": "", "rows": [1]}, False, None),
    ({"error": None, "status": "done"}, False, None),
    ({"error": {"hint": "x"}}, False, None),
    ({"object": "error", "status": "nope"}, False, None),
    ([{"ok": False}], False, None),  # markers are read at the top level only
    ("ok: false", False, None),
    # MCP: structuredContent, or the single text content as a JSON object
    ({"content": [], "structuredContent": {"ok": False, "error": {"code": 403}}}, True, (causes.STATUS, 403)),
    ({"content": [{"type": "text", "text": '{"success": false, "message": "Invalid API key"}'}]}, True, (causes.STATUS, 401)),
    ({"content": [{"type": "text", "text": '{"error": "x"}'}, {"type": "text", "text": "3 rows"}]}, True, None),
    ({"content": [{"type": "text", "text": "ok: false"}]}, True, None),
    # an isError result is a failure whatever it says; its HTTP 200 names nothing
    ({"content": [{"type": "text", "text": "index rebuilding"}], "isError": True}, True, (causes.NONE, None)),
    ({"content": [{"type": "text", "text": '{"error": {"code": 429}}'}], "isError": True}, True, (causes.STATUS, 429)),
]  # fmt: skip


@pytest.mark.parametrize(("result", "mcp", "expected"), MARKERS)
def test_error_markers_in_a_successful_result(result, mcp, expected):
    cause = read_result(result, mcp=mcp)
    assert ((cause.kind, cause.status) if cause else None) == expected


def test_markers_are_off_for_a_contract_that_returns_them_as_data():
    assert read_result({"status": "failed", "build": "B-1"}, mcp=False, markers=False) is None
    assert read_result({"succeeded": [1], "failed": [2]}, mcp=False, markers=False) is None
    # an isError result is still a failure
    assert read_result({"content": [], "isError": True}, mcp=True, markers=False) is not None


# --- partial failures ---------------------------------------------------------------------------

PARTIALS = [
    ({"succeeded": ["a"], "failed": [{"email": "c@x", "error": "bounced"}]}, [("c@x", "bounced")]),
    ({"results": [{"id": 1}], "failed_items": [{"index": 1, "error": "dup"}]}, [("index 1", "dup")]),
    ({"success_count": 2, "failure_count": 1, "failures": [{"id": "T-3", "message": "HTTP 400"}]}, [("T-3", "HTTP 400")]),
    ({"successCount": 2, "failureCount": 1, "failures": [{"item": "<t>", "error": "x"}]}, [("<t>", "x")]),
    ({"succeeded_count": 3, "failed_count": 2}, []),
    ({"successes": ["a"], "failed": ["b", "c"]}, [("b", ""), ("c", "")]),
]  # fmt: skip


@pytest.mark.parametrize(("result", "items"), PARTIALS)
def test_a_partial_failure_names_its_failed_items(result, items):
    cause = read_result(result, mcp=False)
    assert cause.kind == causes.PARTIAL
    assert [(i.item, i.error) for i in cause.failed_items] == items
    assert cause.failed_count >= len(items) and cause.failed_count > 0


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"success_count": 0, "failures": [{"id": 1, "error": "HTTP 400: Bad Request"}]}, 400),
        ({"results": [], "failed_items": [{"index": 0, "message": "Permission denied"}]}, 403),
        ({"failed": [{"id": 1, "error": "rate limit exceeded"}]}, 429),
        ({"failures": [{"id": 1, "code": 404, "error": "gone"}]}, 404),
        ({"failure_count": 2}, None),
    ],
)
def test_when_every_item_failed_their_messages_decide(result, expected):
    cause = read_result(result, mcp=False)
    assert cause.kind != causes.PARTIAL
    assert cause.status == expected
    assert cause.failed_items or cause.failed_count


def test_no_failed_items_is_no_failure():
    assert read_result({"results": [1], "failures": [], "failure_count": 0}, mcp=False) is None


# --- classification of attempts -------------------------------------------------------------

READ = Contract(name="lookup", parameters={}, effect="read")
WRITE = Contract(name="charge", parameters={}, effect="write", reconcilable=True)
WRITE_BLIND = Contract(name="send", parameters={}, effect="write")
HIDES = Contract(name="get_repo", parameters={}, not_found_may_hide_forbidden=True)
NONE = Contract(name="mystery", parameters={}, registered=False)

ATTEMPTS = [
    (READ, Attempt(sent=True, outcome="error", error="timed out"), R.READ_FAILURE),
    (WRITE, Attempt(sent=None, outcome="error", error="context deadline exceeded"), R.OUTCOME_UNKNOWN),
    (WRITE_BLIND, Attempt(sent=None, outcome="error", error="read ETIMEDOUT"), R.NOT_RECONCILABLE),
    (WRITE, Attempt(sent=None, outcome="error", error="connect ETIMEDOUT 1.2.3.4:443"), R.UNAVAILABLE),
    (WRITE, Attempt(sent=True, outcome="error", jsonrpc_error={"code": -32603, "message": "x"}), R.OUTCOME_UNKNOWN),
    (READ, Attempt(sent=True, outcome="error", jsonrpc_error={"code": -32602, "message": "x"}), R.CONTRACT_DRIFT),
    (NONE, Attempt(sent=True, outcome="error", jsonrpc_error={"code": -32601, "message": "x"}), R.UNKNOWN_TOOL),
    (NONE, Attempt(sent=True, outcome="error", jsonrpc_error={"code": -32602, "message": "x"}), R.TOOL_ERROR),
    (READ, Attempt(sent=True, outcome="error", http_status=404, error="Not Found"), R.REFERENCE_NOT_FOUND),
    (HIDES, Attempt(sent=True, outcome="error", http_status=404, error="Not Found"), R.NOT_FOUND_OR_FORBIDDEN),
    (READ, Attempt(sent=True, outcome="error", http_status=404, error="not shared with the integration"), R.NOT_FOUND_OR_FORBIDDEN),
    (READ, Attempt(sent=True, outcome="error", error="HTTP 404: x does not exist or you do not have access"), R.NOT_FOUND_OR_FORBIDDEN),
    (READ, Attempt(sent=True, outcome="error", http_status=408), R.READ_FAILURE),
    (WRITE, Attempt(sent=True, outcome="error", http_status=503), R.UNAVAILABLE),
    (WRITE, Attempt(sent=True, outcome="error", http_status=409), R.CONFLICT),
    (READ, Attempt(sent=True, outcome="success", http_status=200, result={"ok": False, "error": "ratelimited"}), R.RATE_LIMITED),
    (READ, Attempt(sent=True, outcome="success", result={"succeeded": [1], "failed": [2]}), R.PARTIAL_FAILURE),
    (READ, Attempt(sent=True, outcome="success", result={"rows": [1]}), R.OK),
    (READ, Attempt(sent=True, outcome="success", result={"content": [], "isError": False}, result_format="mcp"), R.EMPTY_RESULT),
]  # fmt: skip


@pytest.mark.parametrize(("contract", "attempt", "reason"), ATTEMPTS)
def test_attempts_classify_by_the_cause_read(contract, attempt, reason):
    result = classify_attempt(attempt, contract=contract, attempts_used=1, deadline_passed=False)
    assert result.reason == reason
    if reason not in (R.OK, R.EMPTY_RESULT):
        assert result.cause is not None and result.cause.said


def test_an_unknown_tool_names_the_registered_ones():
    attempt = Attempt(sent=True, outcome="error", jsonrpc_error={"code": -32601, "message": "x"})
    result = classify_attempt(
        attempt,
        contract=NONE,
        attempts_used=1,
        deadline_passed=False,
        tool_names=["list_issues", "get_repo"],
    )
    assert "list_issues" in result.observation and "get_repo" in result.observation


# --- observations -----------------------------------------------------------------------------

INVITATIONS = ("then call", "call it again", "retry later", "try again later")


@settings(max_examples=300, deadline=None)
@given(
    contract=st.sampled_from([READ, WRITE, WRITE_BLIND, HIDES, NONE]),
    sent=st.sampled_from([True, False, None]),
    outcome=st.sampled_from(["success", "error", "timeout", "connection_reset", "circuit_open"]),
    status=st.none() | st.sampled_from([200, 400, 401, 403, 404, 408, 409, 422, 429, 500, 503]),
    error=st.none()
    | st.sampled_from([p for p, _ in PHRASES] + [t for t, _ in STATUSES])
    | st.text(max_size=40),
    code=st.none() | st.sampled_from([-32700, -32600, -32601, -32602, -32603, -32001, -32800]),
    result=st.sampled_from([None, {"ok": False, "error": "x"}, {"succeeded": [1], "failed": [2]}]),
)
def test_observations_follow_the_v2_rules(contract, sent, outcome, status, error, code, result):
    attempt = Attempt(
        sent=sent,
        outcome=outcome,
        http_status=status,
        error=error,
        result=result,
        jsonrpc_error={"code": code, "message": "m"} if code is not None else None,
    )
    verdict = classify_attempt(attempt, contract=contract, attempts_used=1, deadline_passed=False)
    text = verdict.observation.lower()
    assert "operation id" not in text and "idempotency key" not in text
    assert "http 200" not in text
    if verdict.route in (Route.STOP, Route.DENY, Route.REVIEW, Route.RECONCILE):
        assert not any(phrase in text for phrase in INVITATIONS), verdict.observation
    if verdict.route == Route.RETRY:
        assert "change the arguments" not in text
    if "change the arguments" in text:
        assert verdict.cause and (
            verdict.cause.status in (400, 422) or "arguments" in verdict.observation
        )


def test_the_target_text_is_quoted_cut_and_clean():
    attempt = Attempt(
        sent=True,
        outcome="error",
        http_status=422,
        error="\x1b[31mdue_at\x1b[0m must be a <b>weekday</b>\x07 " + "x" * 2000 + " TAIL",
    )
    result = classify_attempt(attempt, contract=READ, attempts_used=1, deadline_passed=False)
    quoted = result.observation.split('"')[1]
    assert quoted.startswith("due_at must be a weekday") and len(quoted) <= 500
    assert "TAIL" not in result.observation and "\x1b" not in result.observation
    assert "change the arguments" in result.observation.lower()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<html><body><h1>502 Bad Gateway</h1><hr><center>nginx</center></body></html>", "502 Bad Gateway nginx"),
        ("<style>p{color:red}</style><p>Down &amp; out</p>", "Down & out"),
        ("failed for <task_c>", "failed for <task_c>"),  # not markup
        ("Traceback (most recent call last):\n  File \"x.py\", line 1\n    1/0\nZeroDivisionError: boom", "ZeroDivisionError: boom"),
        ("Boom\n\tat com.x.Y.z(Y.java:1)\n\t... 3 more\nCaused by: java.net.SocketTimeoutException", "Boom Caused by: java.net.SocketTimeoutException"),
        ("at least one field is required", "at least one field is required"),
        ("a\x00b\tc\r\nd", "a b c d"),
    ],
)  # fmt: skip
def test_quote_target(text, expected):
    assert quote_target(text) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=3000))
def test_a_quote_is_short_and_free_of_control_characters(text):
    quoted = quote_target(text)
    assert len(quoted) <= causes.QUOTE_CHARS
    assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in quoted)


# --- long texts ------------------------------------------------------------------------------


def test_a_long_text_is_classified_whole():
    text = (
        "export failed:\n" + "row 1,EU,1000\n" * 2000 + "ERROR export quota exceeded\n" + "-" * 500
    )
    assert len(text) > 20_000
    attempt = Attempt(
        sent=True,
        outcome="success",
        result={"content": [{"type": "text", "text": text}], "isError": True},
        result_format="mcp",
    )
    result = classify_attempt(attempt, contract=READ, attempts_used=1, deadline_passed=False)
    assert result.reason == R.RATE_LIMITED


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=12_000), st.integers(min_value=30, max_value=5_000))
def test_a_stored_text_keeps_head_and_tail_and_says_its_length(text, limit):
    cut = cut_text(text, limit)
    if len(text) <= limit:
        assert cut == text
        return
    head, tail = limit * 2 // 3, limit - limit * 2 // 3
    assert cut.startswith(text[:head]) and cut.endswith(text[-tail:])
    assert f"of {len(text):,} characters cut" in cut


def test_cut_texts_reaches_every_string_and_keeps_the_rest():
    body = {"error": "e" * 10_000, "result": {"rows": ["r" * 9_000, 3]}, "n": 1}
    cut = cut_texts(body)
    assert len(cut["error"]) < 5_000 and len(cut["result"]["rows"][0]) < 5_000
    assert cut["n"] == 1 and cut["result"]["rows"][1] == 3
    small = {"a": ["b"]}
    assert cut_texts(small) is small
    json.dumps(cut)  # still JSON


def test_a_refused_valid_call_is_drift_only_when_the_gate_passed_it():
    invalid_params = Attempt(
        sent=True, outcome="error", jsonrpc_error={"code": -32602, "message": "Invalid params"}
    )
    no_method = Attempt(
        sent=True, outcome="error", jsonrpc_error={"code": -32601, "message": "Method not found"}
    )
    for attempt, gate_passed, reason in [
        (invalid_params, True, R.CONTRACT_DRIFT),
        (invalid_params, False, R.TOOL_ERROR),  # the server confirms what the gate found
        (no_method, False, R.CONTRACT_DRIFT),  # the registered tool is gone from the server
    ]:
        result = classify_attempt(
            attempt, contract=READ, attempts_used=1, deadline_passed=False, gate_passed=gate_passed
        )
        assert result.reason == reason


def test_a_jsonrpc_error_is_a_failure_whatever_the_outcome_says():
    attempt = Attempt(
        sent=True,
        outcome="success",
        result={"rows": [1]},
        jsonrpc_error={"code": -32603, "message": "Internal error"},
    )
    result = classify_attempt(attempt, contract=READ, attempts_used=1, deadline_passed=False)
    assert result.reason == R.READ_FAILURE


@pytest.mark.timeout(60)  # with backtracking that grows with the text these would hang
@pytest.mark.parametrize(
    "text",
    [
        "status" + " " * 200_000 + "x",
        "HTTP" + "-" * 200_000,
        "dial tcp " * 10_000,
        "rate " * 100_000,
        "<script" * 50_000,
        "\x1b]" * 100_000,
        "at x(" + ")" * 100_000 + " y",
    ],
    ids=["status", "http", "dial", "rate", "script", "osc", "frame"],
)
def test_adversarial_texts_are_read_in_linear_time(text):
    read_failure(Failure(text=text))
    quote_target(text)


def test_an_http_status_given_as_the_jsonrpc_code_is_read_as_one():
    attempt = Attempt(sent=True, outcome="error", jsonrpc_error={"code": 429, "message": "slow"})
    result = classify_attempt(attempt, contract=WRITE, attempts_used=1, deadline_passed=False)
    assert result.reason == R.RATE_LIMITED


@pytest.mark.parametrize(
    ("result", "status"),
    [
        ({"success": False, "errors": [{"message": "Invalid API key"}]}, 401),
        ({"ok": False, "error_code": 429, "description": "Too Many Requests: retry after 5"}, 429),
        ({"error": "invalid_grant", "error_description": "Token has been expired or revoked"}, 401),
        ({"status": "error", "httpStatus": 503}, 503),
    ],
)
def test_a_markers_text_and_status_come_from_the_usual_keys(result, status):
    assert read_result(result, mcp=False).status == status


def test_an_operation_id_echoed_by_the_target_is_not_quoted():
    attempt = Attempt(
        sent=True,
        outcome="error",
        http_status=422,
        error="Idempotency-Key op_0123456789abcdef0123456789abcdef was used with other params",
    )
    result = classify_attempt(attempt, contract=WRITE, attempts_used=1, deadline_passed=False)
    assert "op_" not in result.observation and "other params" in result.observation


def test_failed_items_inside_the_results_list_are_named():
    result = {
        "results": [
            {"id": "C-1", "status": "ok"},
            {"id": "C-2", "status": "failed", "error": "dup"},
        ],
        "failed_count": 1,
    }
    cause = read_result(result, mcp=False)
    assert cause.kind == causes.PARTIAL
    assert [(i.item, i.error) for i in cause.failed_items] == [("C-2", "dup")]
    every = {
        "results": [{"id": "C-2", "success": False, "message": "rate limited"}],
        "failed_count": 1,
    }
    assert read_result(every, mcp=False).status == 429  # no success beside it
