"""callgate settings: one module, read from the environment.

Every value comes from an environment variable through a typed reader that raises
``ImproperlyConfigured`` with the variable's name on a bad value, so a typo fails at
start-up instead of at the first request. ``NAME_FILE`` variants (Docker secrets) are
accepted for secrets. Test-only overrides live in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from callgate import queues

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str | None = None) -> str | None:
    """A string, or the contents of the file named by ``NAME_FILE`` (Docker secrets)."""
    file_name = os.getenv(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {file_name!r}: {exc}") from exc
    return os.getenv(name, default)


def env_bool(name: str, default: bool) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``); anything else raises."""
    raw = os.getenv(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"true", "1", "yes", "on"}:
        return True
    if value in {"false", "0", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be 'true' or 'false', got {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.getenv(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """A comma-separated list; empty items are dropped."""
    raw = os.getenv(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_database(name: str, default: str) -> dj_database_url.DBConfig:
    """A database URL (``postgres://…``, ``sqlite:///path``) parsed by dj-database-url."""
    raw = os.getenv(name) or default
    if "://" not in raw:
        raise ImproperlyConfigured(
            f"{name} must be a URL such as postgres://user@host/db, got {raw!r}"
        )
    try:
        config = dj_database_url.parse(raw, conn_max_age=60, conn_health_checks=True)
    except (ValueError, KeyError) as exc:
        raise ImproperlyConfigured(f"{name} is not a usable database URL ({raw!r}): {exc}") from exc
    if not config.get("ENGINE") or not config.get("NAME"):
        raise ImproperlyConfigured(f"{name} names no database: {raw!r}")
    return config


DEBUG = env_bool("DEBUG", False)

SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is required when DEBUG is off (or set SECRET_KEY_FILE)"
        )
    SECRET_KEY = "insecure-local-development-key-only-used-with-DEBUG-on"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "axes",
    "health_check",
    "django_prometheus",
    "callgate",
    "reviews",
    "mcp_gateway",
    "alerts",
]
#: The demo fleet, the target-system simulator (``/simulator/``) and their commands.
CALLGATE_DEMO = env_bool("CALLGATE_DEMO", DEBUG)
if CALLGATE_DEMO:
    INSTALLED_APPS.append("demo")

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "callgate.logmask.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "callgate.middleware.RejectNulMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "callgate.throttling.RateLimitHeadersMiddleware",
    # last: django-axes locks out repeated failed logins (AXES_* below)
    "axes.middleware.AxesMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
#: django-axes: after CALLGATE_LOGIN_FAILURE_LIMIT wrong passwords for one user name from
#: one address, that pair is locked out for CALLGATE_LOGIN_COOLOFF_MINUTES (answer 429).
AXES_FAILURE_LIMIT = env_int("CALLGATE_LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("CALLGATE_LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_HANDLER = "axes.handlers.cache.AxesCacheHandler"

ROOT_URLCONF = "callgate.urls"
WSGI_APPLICATION = "callgate.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "callgate.context_processors.navigation",
            ],
        },
    },
]

DATABASES = {"default": env_database("DATABASE_URL", f"sqlite:///{BASE_DIR / 'callgate.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite: no persistent connections; WAL lets the demo's agents and the web server share it.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
else:
    # PostgreSQL: psycopg prepares a statement sent with its parameters apart (the ingest hot
    # path's ``bound_cursor``) once it has run this often on a connection, so its plan is
    # reused; 0 turns preparing off (a pooler in transaction mode that cannot keep them).
    # Django's default cursor quotes parameters into the text and is never prepared.
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    _options["prepare_threshold"] = env_int("DATABASE_PREPARE_THRESHOLD", 5) or None
    if _options["prepare_threshold"]:
        # A prepared statement runs its generic plan from the start: the default ("auto")
        # plans each of the first five runs anew and, after, whenever a plan for the values
        # looks cheaper (0.3 ms of the gate's calls look-up). The statements are written so
        # that their generic plan is linear in the batch (joins of unnest, index conditions:
        # tests/callgate/test_inbox.py BatchLookupPlanTests). Only prepared statements are
        # concerned; a server parameter set at connection start (libpq ``options``).
        _options["options"] = " ".join(
            filter(None, [_options.get("options", ""), "-c plan_cache_mode=force_generic_plan"])
        )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"  # redirects to the first project (the overview needs a slug)
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# Our own CSS/JS, and the third-party assets that the set-up installs from the npm
# registry into node_modules/ (never committed, never from a CDN).
STATICFILES_DIRS = [
    BASE_DIR / "static",
    ("vendor/htmx", BASE_DIR / "node_modules" / "htmx.org" / "dist"),
    ("vendor/chartjs", BASE_DIR / "node_modules" / "chart.js" / "dist"),
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# --- Security (secure defaults; `manage.py check --deploy` is clean but for TLS-only items)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)  # TLS terminates in front of us
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if env_bool("BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    },
}

# --- REST API
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "callgate.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "callgate.api.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": [
        "callgate.throttling.ApiKeyRateThrottle",
        "callgate.throttling.ProjectRateThrottle",
    ],
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "callgate API",
    "DESCRIPTION": (
        "Report tool-call events, check proposed calls at the gate, and read verdicts. "
        "Authenticate with `Authorization: Bearer <api key>`."
    ),
    "VERSION": "1",
    "OAS_VERSION": "3.1.0",  # pydantic emits JSON Schema 2020-12 (numeric exclusiveMinimum)
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",  # served from our static files, not a CDN
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "callgate.api.openapi_every_operation",  # 401 and 429 on every operation
    ],
}
# Request bodies up to the batch limit (5 MB) reach the view, which answers 413 itself.
DATA_UPLOAD_MAX_MEMORY_SIZE = 6 * 1024 * 1024

# --- Celery: unset broker means tasks run eagerly in-process (the embedded default)
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or None
CELERY_TASK_ALWAYS_EAGER = CELERY_BROKER_URL is None
CELERY_TASK_EAGER_PROPAGATES = False
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND") or (
    CELERY_BROKER_URL if CELERY_BROKER_URL else None
)
#: Four queues (``callgate.queues``): ingest, reconcile, webhooks, default; each worker reads
#: the ones it is started with (``-Q``). The prefix keeps deployments sharing a broker apart.
CALLGATE_QUEUE_PREFIX = env_str("CALLGATE_QUEUE_PREFIX") or ""
CELERY_TASK_DEFAULT_QUEUE = queues.queue_name(queues.DEFAULT, CALLGATE_QUEUE_PREFIX)
CELERY_TASK_QUEUES = [
    Queue(name, routing_key=name) for name in queues.queue_names(CALLGATE_QUEUE_PREFIX)
]
CELERY_TASK_ROUTES = queues.task_routes(CALLGATE_QUEUE_PREFIX)
#: Acknowledged late, and handed out again when their worker dies, only where running twice is
#: safe (``queues.REDELIVER_ON_WORKER_LOST``); any other task is acknowledged when it starts.
CELERY_TASK_ACKS_LATE = False
CELERY_TASK_REJECT_ON_WORKER_LOST = False
CELERY_TASK_ANNOTATIONS = {
    name: {"acks_late": True, "reject_on_worker_lost": True}
    for name in queues.REDELIVER_ON_WORKER_LOST
}
#: One task at a time per worker process: a long look-up never holds tasks another process
#: could run.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300  # seconds; below the Redis visibility timeout
CELERY_TASK_SOFT_TIME_LIMIT = 240
#: Redis redelivers a task a worker took and never acknowledged (acks_late: it died) after
#: this many seconds: above the hard time limit (a running task is never handed out twice)
#: and above every retry countdown (webhooks: at most 32 s, reconcile 30 s, drain 1 s), far
#: below the hour it was (a killed worker's tasks waited that long).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_TASK_TIME_LIMIT + 60}
CELERY_TASK_SERIALIZER = "json"
#: Django's cache (API throttles, login lockouts): shared by every web worker, so Redis in
#: production (CACHE_URL, else a redis:// broker URL); in-process memory in the embedded default.
CACHE_URL = env_str("CACHE_URL") or (
    CELERY_BROKER_URL if (CELERY_BROKER_URL or "").startswith(("redis://", "rediss://")) else None
)
CACHES = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CACHE_URL,
            "KEY_PREFIX": "callgate",
        }
        if CACHE_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}
if not CACHE_URL:
    # django-axes warns that an in-process cache is not shared between processes; the
    # embedded default runs one process, and production sets CACHE_URL (or a redis broker).
    SILENCED_SYSTEM_CHECKS = ["axes.W001"]
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BEAT_SCHEDULE: dict = {
    # periodic jobs of callgate.tasks; each is idempotent and bounded per run ("expires": a
    # run that waited longer than its period in the queue is dropped, the next one comes)
    "inbox-sweep": {
        "task": "callgate.tasks.sweep_inbox",
        "schedule": 10.0,
        "options": {"expires": 10},
    },
    "reconcile-outbox-sweep": {
        "task": "callgate.tasks.sweep_reconciling",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    "retry-deadline-sweep": {
        "task": "callgate.tasks.sweep_deadlines",
        "schedule": 30.0,
        "options": {"expires": 30},
    },
    "retention-purge": {
        "task": "callgate.tasks.purge_events",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
    # reviews: lapse claims whose lease ran out, expire approval items past their timeout
    # reviews: decisions whose webhook delivery is overdue in the outbox (a lost task)
    "webhook-outbox-sweep": {
        "task": "reviews.tasks.sweep_webhooks",
        "schedule": 30.0,
        "options": {"expires": 30},
    },
    "reviews-housekeeping": {
        "task": "reviews.tasks.review_housekeeping",
        "schedule": 30.0,
        "options": {"expires": 30},
    },
    # report rollups (callgate.reports.rollups): recompute the hour buckets of calls changed since the last run
    "refresh-rollups": {
        "task": "callgate.rollups.refresh_rollups",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    # alerts: evaluate every enabled rule from the rollups, notify on firing and resolving
    "evaluate-alerts": {
        "task": "alerts.tasks.evaluate_alerts",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
}

# --- email (alert notifications): the console in DEBUG unless EMAIL_BACKEND is set
EMAIL_BACKEND = env_str("EMAIL_BACKEND") or (
    "django.core.mail.backends.console.EmailBackend"
    if DEBUG
    else "django.core.mail.backends.smtp.EmailBackend"
)
EMAIL_HOST = env_str("EMAIL_HOST") or "localhost"
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL") or "callgate@localhost"

# --- callgate
CALLGATE_RECONCILE_AUTH_HEADER = env_str("CALLGATE_RECONCILE_AUTH_HEADER") or ""
#: Origins (scheme://host[:port]) that may receive CALLGATE_RECONCILE_AUTH_HEADER. Contracts are
#: written by agents, so the credential never goes to an origin that is not listed here.
CALLGATE_RECONCILE_AUTH_ORIGINS = env_list("CALLGATE_RECONCILE_AUTH_ORIGINS", [])
#: Origins reconcile look-ups may go to. Empty: any origin whose host has only public
#: addresses (plus the AUTH origins above); loopback, private and link-local are refused.
CALLGATE_RECONCILE_ORIGINS = env_list("CALLGATE_RECONCILE_ORIGINS", [])
#: What the outbound guard (``callgate.outbound``: reconcile look-ups, decision and alert
#: webhooks) admits beyond public addresses: networks in CIDR notation and host names. The
#: demo admits loopback: its rules deliver to its own webhook sink on this server.
CALLGATE_OUTBOUND_ALLOW = env_list(
    "CALLGATE_OUTBOUND_ALLOW", ["127.0.0.0/8", "::1/128"] if CALLGATE_DEMO else []
)
#: Where people reach this callgate (scheme://host[:port], no trailing slash): the absolute
#: links of notifications (alert and review-item emails, Slack messages, webhooks;
#: ``callgate.paths.absolute_url``).
CALLGATE_BASE_URL = (env_str("CALLGATE_BASE_URL") or "http://127.0.0.1:8000").rstrip("/")
#: API throttles (DRF rates "<n>/<second|minute|hour|day>"): per key, per project, and failed
#: key look-ups per client address and minute (0: off). Counted in the shared cache.
CALLGATE_THROTTLE_KEY = env_str("CALLGATE_THROTTLE_KEY") or "6000/min"
CALLGATE_THROTTLE_PROJECT = env_str("CALLGATE_THROTTLE_PROJECT") or "30000/min"
CALLGATE_AUTH_FAILURES_PER_MINUTE = env_int("CALLGATE_AUTH_FAILURES_PER_MINUTE", 30)
#: Backpressure (``callgate.inbox.inbox_over_limit``): pending inbox events per project past
#: which POST /api/v1/events, the gate and the OTLP receiver answer 429 with Retry-After (0: no limit), and the seconds that Retry-After says.
CALLGATE_INBOX_LIMIT = env_int("CALLGATE_INBOX_LIMIT", 20_000)
CALLGATE_INBOX_RETRY_AFTER = env_int("CALLGATE_INBOX_RETRY_AFTER", 5, minimum=1)
#: Milliseconds a process keeps a project's backpressure answer before probing the inbox again.
CALLGATE_INBOX_PROBE_MS = env_int("CALLGATE_INBOX_PROBE_MS", 1000)
#: Readiness (/ready/): the oldest pending inbox event may wait this many seconds.
CALLGATE_READY_INBOX_LAG = env_int("CALLGATE_READY_INBOX_LAG", 300, minimum=1)
CALLGATE_RECONCILE_TIMEOUT = env_int("CALLGATE_RECONCILE_TIMEOUT", 5, minimum=1)  # seconds
#: Dotted path of a factory of the look-ups' httpx transport (``callgate.reconcile.make_client``).
#: Empty: the network, guarded. The demo answers look-ups of ``/simulator/…`` in-process.
CALLGATE_RECONCILE_TRANSPORT = env_str("CALLGATE_RECONCILE_TRANSPORT") or (
    "demo.simulator.lookup_transport" if CALLGATE_DEMO else ""
)
CALLGATE_REVIEW_CLAIM_LEASE = env_int("CALLGATE_REVIEW_CLAIM_LEASE", 15 * 60, minimum=60)  # seconds
#: Slack app's signing secret: interactions (POST /integrations/slack/actions) are verified
#: with it (empty: every interaction is refused).
CALLGATE_SLACK_SIGNING_SECRET = env_str("CALLGATE_SLACK_SIGNING_SECRET") or ""
#: Seconds an email decision link stays valid.
CALLGATE_EMAIL_LINK_MAX_AGE = env_int("CALLGATE_EMAIL_LINK_MAX_AGE", 24 * 3600, minimum=60)

#: "text" (default) or "json": one JSON object per line (python-json-logger) with the
#: request ID and operation ID of the work at hand (callgate.logmask).
LOG_FORMAT = env_str("LOG_FORMAT") or "text"
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be 'text' or 'json', got {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "mask_api_keys": {"()": "callgate.logmask.MaskApiKeysFilter"},
        "context": {"()": "callgate.logmask.ContextFilter"},
    },
    "formatters": {
        "json": {
            "()": "callgate.logmask.MaskedJsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(operation_id)s",
        }
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["mask_api_keys", "context"],
            **({"formatter": "json"} if LOG_FORMAT == "json" else {}),
        }
    },
    "root": {"handlers": ["console"], "level": os.getenv("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "celery.app.trace": {
            "level": "WARNING"
        },  # one line per task run is noise; failures still show
    },
}
