"""schemathesis against callgate's OpenAPI document (issue 16), bounded for CI.

The document is the one drf-spectacular serves (``/api/schema/``); every operation in it is
called through the WSGI application, in this process, on the test database, with an agent's
API key, on generated valid and invalid input. It fails on any 5xx and on any answer the
document does not describe: its status code, content type, headers or body schema
(``ST1xx``), and on schema-invalid input that is accepted (``ST201``).

Left out: ``positive_data_acceptance`` (``ST202``, "schema-valid input rejected"). Some of
what callgate refuses with a 4xx naming the field cannot be written in OpenAPI: opaque
cursors, a ``since`` after its ``until``, a range over 744 buckets, a contract over the
complexity budget, an attempt for a call that does not exist. What one value alone must be
is in the document (UUIDs, date-times, tool names), and the 4xx answers are checked above.

Bounded: ``MAX_EXAMPLES`` generated cases per operation (derandomized, no shrinking), about
20 s for the whole document here; ``TIME_BUDGET`` fails the test if it grows far past that.
"""

from __future__ import annotations

import time

import schemathesis
from django.core.cache import cache
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import override_settings
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from callgate.wsgi import application
from tests.factories import WEATHER, BaseTestCase

#: generated cases per API operation
MAX_EXAMPLES = 15
#: seconds the whole run may take
TIME_BUDGET = 60.0


# failed-key limiting off: the checks send wrong keys on purpose, and the limit would answer
# every later request 429 (documented, but it would hide the operations behind it)
@override_settings(CALLGATE_AUTH_FAILURES_PER_MINUTE=0)
class SchemathesisTests(BaseTestCase):
    def setUp(self):
        # a contract, so that generated gate checks and events meet a real tool too (first:
        # the test client connects the signals below again after its request)
        self.api().put("/api/v1/tools/get_weather", WEATHER, format="json")
        # the WSGI handler closes the database connection after each request; the test
        # client does not (the test's transaction holds the key), so neither may this run
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        self.addCleanup(request_started.connect, close_old_connections)
        self.addCleanup(request_finished.connect, close_old_connections)
        cache.clear()  # the throttles' counts
        self.addCleanup(cache.clear)

    def test_every_operation_answers_as_documented(self):
        schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
        headers = {"Authorization": f"Bearer {self.key}"}
        started = time.monotonic()
        operations = []
        failures = []
        for result in schema.get_all_operations():
            operation = result.ok()
            operations.append(operation.label)

            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy())
            def check(case):
                case.call_and_validate(headers=headers, excluded_checks=[positive_data_acceptance])

            try:
                check()
            except Exception as exc:  # schemathesis' FailureGroup: keep on, report all
                failures.append(f"{operation.label}:\n{str(exc)[:3000]}")
        elapsed = time.monotonic() - started
        self.assertGreaterEqual(len(operations), 17, operations)  # the whole document ran
        self.assertIn("POST /api/v1/events", operations)
        self.assertEqual(failures, [], "\n\n".join(failures))
        self.assertLess(elapsed, TIME_BUDGET, f"the run took {elapsed:.0f} s")
