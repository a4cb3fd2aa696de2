"""Test-wide settings overrides. The database is whatever DATABASE_URL names (PostgreSQL
in CI, the SQLite default elsewhere); Celery runs eagerly unless a test starts a worker."""

from __future__ import annotations

import pytest


def pytest_configure(config):
    import os
    import tempfile

    from django.conf import settings

    # before any setUpTestData creates users: the default hasher costs ~0.3 s a user
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.sqlite3":
        # a file, one per test process, not Django's shared-cache in-memory database: there
        # a second thread (a live server, a LangGraph ToolNode's pool) met table locks
        # ("database table is locked") where the file's WAL and busy timeout let it wait
        database.setdefault("TEST", {})["NAME"] = os.path.join(
            tempfile.gettempdir(), f"callgate-test-{os.getpid()}.sqlite3"
        )
    # the outbound guard admits nothing beyond public addresses (the demo's default admits
    # loopback); tests that reach a local server or a mocked host list it themselves
    settings.CALLGATE_OUTBOUND_ALLOW = []


def pytest_report_header(config):
    from tests.factories import CASES_FILE, load_cases

    cases = load_cases()
    if not cases:
        return f"shared cases: MISSING at {CASES_FILE}; their tests are not collected (set CALLGATE_CASES)"
    return f"shared cases: {len(cases)} from {CASES_FILE}"


@pytest.fixture(autouse=True)
def _test_settings(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    settings.ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    settings.CALLGATE_RECONCILE_AUTH_ORIGINS = [
        "http://sim"
    ]  # the in-process simulator of the tests
    from callgate.celery import app

    app.conf.task_always_eager = True


@pytest.fixture(autouse=True)
def _celery_join_flag():
    """Eager tasks run in several threads at once (a live server, a LangGraph ToolNode) race
    on Celery's process-wide "inside a task" flag (``denied_join_result`` sets and restores
    it without a lock), which can stay set and make a later ``result.get()`` refuse."""
    yield
    from celery._state import _set_task_join_will_block

    _set_task_join_will_block(False)


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Each test starts with empty per-process caches (contracts, keys, backpressure
    answers): a rolled-back test's project and agent IDs may come again (SQLite reuses
    them) at the same ``config_version``."""
    from callgate.auth import _keys_cache
    from callgate.inbox import _over_limit_memo
    from callgate.ingest import _tools_cache

    _tools_cache.clear()
    _keys_cache.clear()
    _over_limit_memo.clear()
