"""API keys: stored only as digests, revocable, strict about the header, masked in logs."""

from __future__ import annotations

import io
import logging
from datetime import timedelta
from unittest import mock

from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from callgate.auth import (
    KEY_PATTERN,
    LAST_USED_RESOLUTION,
    api_key_issue,
    api_key_revoke,
    api_key_verify,
)
from callgate.logmask import MaskApiKeysFilter, mask_api_keys
from callgate.models import Agent, ApiKey
from tests.factories import BaseTestCase

#: an authenticated API read; with a good key it is a 404 (no such call), never a 401
PROBE = "/api/v1/calls/no-such-operation"


def all_text_cells() -> list[tuple[str, str, str]]:
    """(table, column, value) for every non-null cell of every table, as text."""
    cells = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            columns = [
                c.name for c in connection.introspection.get_table_description(cursor, table)
            ]
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            for row in cursor.fetchall():
                for column, value in zip(columns, row, strict=True):
                    if value is None:
                        continue
                    text = (
                        bytes(value).decode("latin-1")
                        if isinstance(value, (bytes, memoryview))
                        else str(value)
                    )
                    cells.append((table, column, text))
    return cells


class ApiKeyStorageTests(BaseTestCase):
    def test_it_issues_keys_in_the_documented_shape(self):
        issued = api_key_issue(agent=self.agent, name="ci")
        match = KEY_PATTERN.match(issued.plain)
        assert match
        assert issued.api_key.prefix == match.group(1)
        assert issued.api_key.last4 == issued.plain[-4:]
        assert issued.api_key.digest != issued.plain and len(issued.api_key.digest) == 64

    def test_it_never_stores_a_plain_key(self):
        plains = [self.key, self.other_key, api_key_issue(agent=self.agent, name="second").plain]
        out = io.StringIO()
        call_command(
            "create_agent_key", self.project.slug, "cli-bot", stdout=out, stderr=io.StringIO()
        )
        plains.append(out.getvalue().strip())
        # use the keys, so that whatever authentication writes is in the database too
        for plain in plains[:2]:
            with self.captureOnCommitCallbacks(execute=True):
                self.api(plain).get(PROBE)
        cells = all_text_cells()
        assert any(
            table == ApiKey._meta.db_table for table, _, _ in cells
        )  # the scan sees the key table
        for plain in plains:
            secret = plain.split("_", 2)[2]
            leaks = [
                (table, column)
                for table, column, text in cells
                if secret in text or secret[:20] in text
            ]
            assert leaks == [], f"plain key found in {leaks}"


class ApiKeyAuthenticationTests(BaseTestCase):
    def test_it_accepts_a_valid_key(self):
        response = self.api().get(PROBE)
        assert response.status_code == 404, response.content  # authenticated: the call is unknown

    def test_it_rejects_a_revoked_key(self):
        api_key_revoke(api_key=ApiKey.objects.get(prefix=self.key.split("_")[1]))
        response = self.api().get(PROBE)
        assert response.status_code == 401
        assert response.json()["error"] == "Unknown or revoked API key."
        assert api_key_verify(self.key) is None
        assert self.api(self.other_key).get(PROBE).status_code == 404  # the other key still works

    def test_it_rejects_an_unknown_key_of_the_right_shape(self):
        prefix = self.key.split("_")[1]
        forged = f"cg_{prefix}_{'A' * 43}"
        response = self.api(forged).get(PROBE)
        assert response.status_code == 401
        assert response.json()["error"] == "Unknown or revoked API key."

    def test_it_rejects_malformed_authorization_headers_with_a_clear_401(self):
        headers = [
            "Bearer",
            "Bearer ",
            "Basic xyz",
            "Basic YWxpY2U6cGFzc3dvcmQ=",
            "Token " + self.key,
            "Bearer cg_zz",
            f"Bearer {self.key} extra",
            f"Bearer {self.key[:-1]}",
            f"Bearer cg_ABCDEF12_{self.key.split('_', 2)[2]}",  # upper-case hex (the key's own
            # prefix upper-cased is itself when all digits: 2% of keys)
            "Bearer cg_ñ" + "x" * 40,  # non-ASCII (Latin-1, as WSGI delivers header bytes)
            "Bearer \xe2\x9c\x93\xe2\x9c\x93",  # UTF-8 bytes of "✓✓" seen through WSGI's Latin-1
            "Bearer " + "x" * 5000,
        ]
        for header in headers:
            response = self.client.get(PROBE, HTTP_AUTHORIZATION=header)
            assert response.status_code == 401, (header[:40], response.status_code)
            body = response.json()
            assert body["error"] and ("Bearer" in body["error"] or "API key" in body["error"]), (
                header[:40],
                body,
            )
            assert body["errors"] == []
            assert response["WWW-Authenticate"].startswith("Bearer")

    def test_it_names_the_problem_in_the_message(self):
        cases = {
            "Basic xyz": "Authorization header must be 'Bearer <api key>'.",
            "Bearer cg_zz": "Malformed API key: expected 'cg_<8 hex>_<43 characters>'.",
            "Bearer cg_\xe9": "Authorization header must be ASCII: 'Bearer <api key>'.",
        }
        for header, message in cases.items():
            assert self.client.get(PROBE, HTTP_AUTHORIZATION=header).json()["error"] == message

    def test_it_ignores_a_key_in_the_query_string(self):
        for name in ("api_key", "key", "token", "access_token"):
            response = self.client.get(f"{PROBE}?{name}={self.key}")
            assert response.status_code == 401, name
            assert response["WWW-Authenticate"].startswith("Bearer")
        response = self.client.post(
            f"/api/v1/events?api_key={self.key}", [], content_type="application/json"
        )
        assert response.status_code == 401

    def test_it_records_when_a_key_was_last_used(self):
        row = ApiKey.objects.get(prefix=self.key.split("_")[1])
        assert row.last_used_at is None
        with self.captureOnCommitCallbacks(execute=True):
            self.api().get(PROBE)
        row.refresh_from_db()
        assert row.last_used_at is not None
        assert timezone.now() - row.last_used_at < timedelta(minutes=1)

    def test_it_writes_last_used_at_at_most_once_a_minute(self):
        row = ApiKey.objects.get(prefix=self.key.split("_")[1])
        recent = timezone.now() - timedelta(seconds=LAST_USED_RESOLUTION // 2)
        ApiKey.objects.filter(pk=row.pk).update(last_used_at=recent)
        with self.captureOnCommitCallbacks(execute=True):
            self.api().get(PROBE)
        row.refresh_from_db()
        assert row.last_used_at == recent
        later = timezone.now() + timedelta(seconds=LAST_USED_RESOLUTION)  # the key is cached
        with (
            mock.patch("callgate.auth.timezone.now", return_value=later),
            self.captureOnCommitCallbacks(execute=True),
        ):
            self.api().get(PROBE)
        row.refresh_from_db()
        assert row.last_used_at == later

    def test_it_scopes_the_key_to_its_agent_and_project(self):
        key = api_key_verify(self.key)
        assert key.project == self.project and key.agent == self.agent
        other = api_key_verify(self.other_key)
        assert other.project == self.other_project and other.agent == self.other_agent


class LogMaskingTests(BaseTestCase):
    def test_it_masks_keys_in_text(self):
        text = f"agent sent Authorization: Bearer {self.key} and {self.other_key}."
        masked = mask_api_keys(text)
        assert self.key not in masked and self.other_key not in masked
        assert f"Bearer {self.key[:12]}…" in masked
        assert self.key.split("_", 2)[2] not in masked

    def test_it_leaves_text_without_keys_alone(self):
        assert mask_api_keys("cg_zz and cg_12345678_short") == "cg_zz and cg_12345678_short"

    def test_it_masks_keys_in_log_record_arguments(self):
        record = logging.LogRecord(
            "callgate",
            logging.WARNING,
            __file__,
            1,
            "bad request with key %s from %r",
            (self.key, {"authorization": f"Bearer {self.key}"}),
            None,
        )
        assert MaskApiKeysFilter().filter(record) is True
        message = record.getMessage()
        assert self.key not in message
        assert message.startswith(f"bad request with key {self.key[:12]}… from ")

    def test_it_masks_keys_in_what_the_configured_handlers_write(self):
        handlers = [
            h
            for h in logging.getLogger().handlers
            if any(isinstance(f, MaskApiKeysFilter) for f in h.filters)
        ]
        assert handlers, "the console handler of settings.LOGGING lost its mask_api_keys filter"
        handler = handlers[0]
        stream = io.StringIO()
        original = handler.setStream(stream)
        try:
            logging.getLogger("callgate.test").error("leaked %s", self.key)
        finally:
            handler.setStream(original)
        assert "leaked " + self.key[:12] + "…" in stream.getvalue()
        assert self.key not in stream.getvalue()


class AgentKeyIsolationTests(BaseTestCase):
    def test_it_gives_each_agent_its_own_keys(self):
        bot = Agent.objects.create(project=self.project, name="second-bot")
        issued = api_key_issue(agent=bot)
        assert api_key_verify(issued.plain).agent == bot
        assert ApiKey.objects.filter(agent=bot).count() == 1
