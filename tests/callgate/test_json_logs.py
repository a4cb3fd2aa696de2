"""JSON logs (LOG_FORMAT=json): one object per line with the request ID, keys masked."""

from __future__ import annotations

import io
import json
import logging

from django.conf import settings

from callgate.logmask import ContextFilter, MaskApiKeysFilter, MaskedJsonFormatter
from tests.factories import BaseTestCase

KEY = "cg_0123abcd_" + "B" * 43


class JsonLogTests(BaseTestCase):
    def test_a_request_logs_json_with_its_request_id_and_no_key(self):
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(MaskedJsonFormatter(settings.LOGGING["formatters"]["json"]["fmt"]))
        handler.addFilter(MaskApiKeysFilter())
        handler.addFilter(ContextFilter())
        logger = logging.getLogger("django.request")
        logger.addHandler(handler)
        self.addCleanup(logger.removeHandler, handler)
        response = self.client.get(
            f"/api/v1/calls/op_x?api_key={KEY}", HTTP_X_REQUEST_ID="req-abc.123"
        )
        self.assertEqual(response["X-Request-ID"], "req-abc.123")
        [line] = stream.getvalue().splitlines()
        record = json.loads(line)
        self.assertEqual(record["request_id"], "req-abc.123")
        self.assertEqual(record["levelname"], "WARNING")
        self.assertNotIn(KEY, line)
        # a made-up request ID when the client's does not look like one
        other = self.client.get("/api/v1/calls/op_x", HTTP_X_REQUEST_ID="bad id\n")
        self.assertRegex(other["X-Request-ID"], r"^[0-9a-f]{32}$")
