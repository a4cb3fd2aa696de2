"""Settings come from the environment through typed readers that fail loudly."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import SimpleTestCase

from callgate.settings import env_bool, env_database, env_int, env_list, env_str

#: `check --deploy` warnings that only make sense once TLS terminates in front of callgate
TLS_ONLY_CHECKS = {"security.W004", "security.W008"}


def _env(**values: str):
    """Patch os.environ with ``values`` for the duration of a ``with`` block."""
    return mock.patch.dict(os.environ, values)


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``manage.py`` in a fresh process with the test run's environment plus ``env``
    (pass "" to blank a variable)."""
    full_env = {**os.environ, **env}
    full_env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # set in-process by the browser tests
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


class EnvReaderTests(SimpleTestCase):
    def test_it_reads_booleans(self):
        for raw, expected in [
            ("true", True),
            ("TRUE", True),
            ("1", True),
            ("yes", True),
            ("on", True),
            ("false", False),
            ("0", False),
            ("No", False),
            (" off ", False),
        ]:
            with _env(CG_TEST_FLAG=raw):
                assert env_bool("CG_TEST_FLAG", not expected) is expected, raw

    def test_it_uses_the_default_for_a_missing_or_empty_boolean(self):
        os.environ.pop("CG_TEST_FLAG", None)
        assert env_bool("CG_TEST_FLAG", True) is True
        with _env(CG_TEST_FLAG=""):
            assert env_bool("CG_TEST_FLAG", False) is False

    def test_it_rejects_a_malformed_boolean_naming_the_variable(self):
        for raw in ["ture", "2", "enabled", "y e s"]:
            with _env(CG_TEST_FLAG=raw), pytest.raises(ImproperlyConfigured) as caught:
                env_bool("CG_TEST_FLAG", False)
            assert "CG_TEST_FLAG" in str(caught.value)
            assert repr(raw) in str(caught.value)

    def test_it_reads_integers_with_a_minimum(self):
        with _env(CG_TEST_INT="42"):
            assert env_int("CG_TEST_INT", 1) == 42
        with (
            _env(CG_TEST_INT="ten"),
            pytest.raises(ImproperlyConfigured, match="CG_TEST_INT must be an integer"),
        ):
            env_int("CG_TEST_INT", 1)
        with (
            _env(CG_TEST_INT="5"),
            pytest.raises(ImproperlyConfigured, match="CG_TEST_INT must be at least 60"),
        ):
            env_int("CG_TEST_INT", 900, minimum=60)

    def test_it_reads_comma_separated_lists(self):
        with _env(CG_TEST_LIST=" example.com, ,api.example.com "):
            assert env_list("CG_TEST_LIST", []) == ["example.com", "api.example.com"]
        os.environ.pop("CG_TEST_LIST", None)
        assert env_list("CG_TEST_LIST", ["localhost"]) == ["localhost"]

    def test_it_reads_secrets_from_a_file(self):
        secret_file = Path(self.enterContext(_tmpdir())) / "secret"
        secret_file.write_text("s3cret-from-file\n")
        with _env(CG_TEST_SECRET="from-env", CG_TEST_SECRET_FILE=str(secret_file)):
            assert env_str("CG_TEST_SECRET") == "s3cret-from-file"

    def test_it_rejects_an_unreadable_secret_file(self):
        with (
            _env(CG_TEST_SECRET_FILE="/nonexistent/secret"),
            pytest.raises(ImproperlyConfigured) as caught,
        ):
            env_str("CG_TEST_SECRET")
        assert "CG_TEST_SECRET_FILE" in str(caught.value)
        assert "/nonexistent/secret" in str(caught.value)

    def test_it_parses_database_urls(self):
        with _env(CG_TEST_DB="postgres://callgate:pw@db.internal:5432/callgate"):
            config = env_database("CG_TEST_DB", "sqlite:///x.sqlite3")
        assert config["ENGINE"] == "django.db.backends.postgresql"
        assert (config["HOST"], config["PORT"], config["NAME"], config["USER"]) == (
            "db.internal",
            5432,
            "callgate",
            "callgate",
        )
        os.environ.pop("CG_TEST_DB", None)
        assert (
            env_database("CG_TEST_DB", "sqlite:////tmp/cg.sqlite3")["ENGINE"]
            == "django.db.backends.sqlite3"
        )

    def test_it_rejects_malformed_database_urls_naming_the_variable(self):
        for raw in [
            "callgate",
            "localhost:5432/callgate",
            "nosuchdb://host/db",
            "postgres://host:notaport/db",
            "postgres://host:5432",
        ]:
            with _env(CG_TEST_DB=raw), pytest.raises(ImproperlyConfigured) as caught:
                env_database("CG_TEST_DB", "sqlite:///x.sqlite3")
            assert "CG_TEST_DB" in str(caught.value), raw
            assert raw in str(caught.value), raw


class _tmpdir:
    """A temporary directory as a context manager (for ``enterContext``)."""

    def __enter__(self) -> str:
        import tempfile

        self._dir = tempfile.TemporaryDirectory()
        return self._dir.__enter__()

    def __exit__(self, *exc) -> None:
        self._dir.__exit__(*exc)


class SettingsStartupTests(SimpleTestCase):
    """The settings module as a whole, loaded in a fresh process like production does."""

    def test_it_refuses_to_start_with_a_malformed_database_url(self):
        result = _manage("check", DEBUG="true", DATABASE_URL="not-a-url")
        assert result.returncode != 0
        assert "ImproperlyConfigured: DATABASE_URL must be a URL" in result.stderr

    def test_it_refuses_to_start_with_a_malformed_boolean(self):
        result = _manage("check", DEBUG="maybe")
        assert result.returncode != 0
        assert "ImproperlyConfigured: DEBUG must be 'true' or 'false', got 'maybe'" in result.stderr

    def test_it_needs_a_secret_key_without_debug(self):
        result = _manage(
            "check", DEBUG="false", SECRET_KEY="", SECRET_KEY_FILE="", ALLOWED_HOSTS="example.com"
        )
        assert result.returncode != 0
        assert "SECRET_KEY is required when DEBUG is off" in result.stderr

    def test_postgresql_statements_of_the_ingest_path_are_prepared_unless_turned_off(self):
        show = (
            "from django.conf import settings; "
            "options = settings.DATABASES['default']['OPTIONS']; "
            "print(options.get('prepare_threshold'), repr(options.get('options')))"
        )
        url = "postgres://postgres@127.0.0.1:5432/callgate"
        generic = "'-c plan_cache_mode=force_generic_plan'"
        for raw, printed in (("", f"5 {generic}"), ("2", f"2 {generic}"), ("0", "None None")):
            result = _manage(
                "shell", "-c", show, DEBUG="true", DATABASE_URL=url, DATABASE_PREPARE_THRESHOLD=raw
            )
            assert result.returncode == 0, result.stderr
            assert result.stdout.strip().splitlines()[-1] == printed, (raw, result.stdout)
        result = _manage(
            "check", DEBUG="true", DATABASE_URL=url, DATABASE_PREPARE_THRESHOLD="often"
        )
        assert result.returncode != 0
        assert "DATABASE_PREPARE_THRESHOLD must be an integer, got 'often'" in result.stderr
        sqlite = _manage("shell", "-c", show, DEBUG="true", DATABASE_URL="sqlite:///:memory:")
        assert sqlite.stdout.strip().splitlines()[-1] == "None None", sqlite.stdout

    def test_it_passes_the_deploy_checks_but_for_tls_only_items(self):
        result = _manage(
            "check",
            "--deploy",
            DEBUG="false",
            SECRET_KEY=secrets.token_urlsafe(50),
            SECRET_KEY_FILE="",
            ALLOWED_HOSTS="example.com",
        )
        assert result.returncode == 0, result.stderr
        found = set(re.findall(r"\((\w+\.[WE]\d+)\)", result.stdout + result.stderr))
        assert found <= TLS_ONLY_CHECKS, result.stdout + result.stderr


class CeleryRedeliveryTests(SimpleTestCase):
    """A task held by a killed worker is redelivered within minutes, never while it runs."""

    def test_the_visibility_timeout_covers_the_time_limit_and_every_countdown(self):
        from django.conf import settings

        from callgate import tasks
        from reviews import webhooks

        timeout = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
        longest_countdown = max(
            tasks.RECONCILE_BACKOFF_CAP,
            webhooks.WEBHOOK_BACKOFF_BASE * 2 ** (webhooks.WEBHOOK_MAX_ATTEMPTS - 2),
            tasks.DRAIN_RETRY_DELAY,
        )
        self.assertGreater(timeout, settings.CELERY_TASK_TIME_LIMIT)
        self.assertGreater(timeout, longest_countdown)
        self.assertLessEqual(timeout, 600)
