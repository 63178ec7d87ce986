"""Lockstep console settings.

Embedded defaults with nothing set: SQLite, Channels' in-memory layer, Celery tasks run
in-process. Production parts switch on with `DATABASE_URL` (PostgreSQL through psycopg 3)
and `REDIS_URL` (Celery broker and results, channels-redis, cache, agent wake-ups).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from console.env import database_from_url, env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("LOCKSTEP_VAR_DIR", str(BASE_DIR / "var")))

def _dev_secret_key(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        key = "insecure-dev-" + secrets.token_urlsafe(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process of this setup made it first
            return path.read_text().strip()
        with os.fdopen(fd, "w") as fh:
            fh.write(key)
        return key


# --- core -----------------------------------------------------------------------------------

SECRET_KEY = env_str("SECRET_KEY")
# Production behaviour unless development is asked for explicitly (`make demo` and the tests set
# DEBUG=true): a missing SECRET_KEY is an error, not a quiet switch to debug mode.
DEBUG = env_bool("DEBUG", default=False)
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set (or DEBUG=true for development only: the demo and "
                                   "the tests set it)")
    # Debug only: a key generated once and kept under var/, so every process of a dev setup
    # (console, worker, management commands) agrees on it. Never used in production.
    SECRET_KEY = _dev_secret_key(VAR_DIR / "dev-secret-key")

# Token digests are HMACs with this pepper, so rotating SECRET_KEY (sessions) can be done
# without invalidating every API token and node credential.
TOKEN_PEPPER = env_str("LOCKSTEP_TOKEN_PEPPER", SECRET_KEY)

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["*"] if DEBUG else ["localhost", "127.0.0.1"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# The URL agents and browsers use to reach this console; the install command is built from it.
# Empty means: derive it from each request.
PUBLIC_URL = env_str("LOCKSTEP_PUBLIC_URL", "").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "console.core",
    "console.tenancy",
    "console.fleet",
    "console.commands",
    "console.telemetry",
    "console.incidents",
    "console.live",
    "console.agentdist",
    "console.web",
    "console.audits",
    "console.clocks",
    "api",
    "axes",
    "console.jobs",
]

MIDDLEWARE = [
    "console.core.middleware.TenantScopeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "console.core.pageheaders.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = None

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
                "console.web.context.organizations",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------

DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": database_from_url(DATABASE_URL)}
    # Under ASGI every sync request runs on a fresh thread, so persistent connections would pile
    # up in dead threads (0 closes them per request). The agent endpoints' thread pool keeps its
    # own connections open (console/core/asyncdb.py).
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("DB_CONN_MAX_AGE", 0)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(VAR_DIR / "lockstep.sqlite3")),
            # Long-poll threads and request threads write concurrently: wait, do not fail.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
            # A file, not memory, so tests can share the database with a live server process.
            "TEST": {"NAME": str(VAR_DIR / "test-lockstep.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis: channels, celery, cache ---------------------------------------------------------

REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 10000, "prefix": "lockstep:ch"},
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "lockstep",
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = REDIS_URL or "cache+memory://"
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_RESULT_EXPIRES = timedelta(hours=1)
CELERY_BEAT_SCHEDULE = {
    "sweep-lost-nodes": {
        "task": "console.fleet.tasks.sweep_lost_nodes",
        "schedule": timedelta(seconds=env_int("LOCKSTEP_SWEEP_INTERVAL_S", 15)),
    },
    "requeue-expired-commands": {
        "task": "console.commands.tasks.requeue_expired_commands",
        "schedule": timedelta(seconds=env_int("LOCKSTEP_SWEEP_INTERVAL_S", 15)),
    },
    "advance-audits": {
        "task": "console.audits.tasks.advance_audits",
        "schedule": timedelta(seconds=env_int("LOCKSTEP_AUDIT_TICK_S", 2)),
    },
    "start-scheduled-audits": {
        "task": "console.audits.tasks.start_scheduled_audits",
        "schedule": timedelta(seconds=env_int("LOCKSTEP_SWEEP_INTERVAL_S", 15)),
    },
    "clocks-replan-and-sweep": {
        "task": "console.clocks.tasks.replan_and_sweep",
        "schedule": timedelta(seconds=env_int("LOCKSTEP_CLOCK_SWEEP_INTERVAL_S", 15)),
    },
    "sweep-probe-windows": {
        "task": "console.incidents.tasks.sweep_probe_windows",
        "schedule": timedelta(seconds=5),
    },
    "refresh-probe-plans": {
        "task": "console.incidents.tasks.refresh_probe_plans",
        "schedule": timedelta(seconds=env_int("LOCKSTEP_PROBE_PLAN_REFRESH_S", 30)),
    },
}

# --- auth, sessions, security ---------------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Sign-in attempts are counted by django-axes (the page and, when on, the admin site): after
# LOCKSTEP_LOGIN_FAILURE_LIMIT wrong passwords for one username from one address, that pair is
# refused (429) for LOCKSTEP_LOGIN_LOCKOUT_S, even with the right password. The address is the
# socket's peer: behind a proxy, run uvicorn with --proxy-headers --forwarded-allow-ips.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("LOCKSTEP_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("LOCKSTEP_LOGIN_LOCKOUT_S", 900))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
# Django's admin site is not served unless asked for (it shows no tenant model, but it is one
# more sign-in form and one more surface); when on, its sign-in is counted the same way.
ADMIN_ENABLED = env_bool("LOCKSTEP_ADMIN", False)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "clusters"
LOGOUT_REDIRECT_URL = "login"

HTTPS = env_bool("LOCKSTEP_HTTPS", default=not DEBUG)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = 31536000 if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Every page: scripts, styles, images and connections from this console only, no inline code
# (console.core.pageheaders.ContentSecurityPolicyMiddleware; templates/static/ holds them all).
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
                           "form-action 'self'; frame-ancestors 'none'")
# Error pages never show settings or a traceback, in any mode: the traceback goes to the log.
DEFAULT_EXCEPTION_REPORTER = "console.core.pageheaders.LogOnlyExceptionReporter"
if env_bool("LOCKSTEP_BEHIND_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Agents and health probes speak plain HTTP inside a cluster's management network even when
# the browser console is served over HTTPS; they are exempt from the redirect.
SECURE_REDIRECT_EXEMPT = [r"^api/v1/agent/", r"^install\.sh$", r"^agent/", r"^healthz$", r"^metrics$"]

# --- i18n, static ---------------------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "templates" / "static"]

# --- REST API -------------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["api.permissions.IsOrganizationMember"],
    "DEFAULT_PAGINATION_CLASS": "api.pagination.Pagination",
    "PAGE_SIZE": 100,
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "api.filtersets.StrictOrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    # Bodies are JSON only (the browsable API posts JSON too): one format to read strictly.
    "DEFAULT_PARSER_CLASSES": ["api.parsers.StrictJSONParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Lockstep API",
    "DESCRIPTION": "Fabric health and fault tolerance for GPU clusters: fleet, topology, agents.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # Swagger UI served from this console, not a CDN: consoles often run without internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "api.errors.document_errors"],
    "ENUM_NAME_OVERRIDES": {
        # an audit's state is not a node's or a command's
        "AuditRunStateEnum": "console.audits.models.RunState",
        "IncidentStateEnum": "console.incidents.models.IncidentState",
        "ProbeWindowStateEnum": "console.incidents.models.WindowState",
        "CulpritKindEnum": "console.incidents.models.CulpritKind",
    },
}

# --- Lockstep -------------------------------------------------------------------------------

LOCKSTEP = {
    # A node is lost when it has not been heard from for this long.
    "NODE_LOST_AFTER_S": env_int("LOCKSTEP_NODE_LOST_AFTER_S", 90),
    # Every agent request also marks its node seen, and a poll returns at least every
    # AGENT_POLL_MAX_WAIT_S: a heartbeat only needs to beat the lost-after window comfortably.
    "AGENT_HEARTBEAT_INTERVAL_S": env_int("LOCKSTEP_AGENT_HEARTBEAT_INTERVAL_S", 30),
    # Long-poll: the longest an agent's GET /commands is held open.
    "AGENT_POLL_MAX_WAIT_S": env_int("LOCKSTEP_AGENT_POLL_MAX_WAIT_S", 60),
    # Backstop re-check of the database while a poll waits, in case a wake-up was missed.
    "AGENT_POLL_RECHECK_S": env_int("LOCKSTEP_AGENT_POLL_RECHECK_S", 5),
    # Agent endpoints run ORM work on their own thread pool (off only in in-process tests).
    "DB_THREAD_POOL": env_bool("LOCKSTEP_DB_THREAD_POOL", True),
    "COMMAND_MAX_ATTEMPTS": env_int("LOCKSTEP_COMMAND_MAX_ATTEMPTS", 3),
    "TELEMETRY_MAX_BATCH_BYTES": env_int("LOCKSTEP_TELEMETRY_MAX_BATCH_BYTES", 1024 * 1024),
    "TELEMETRY_MAX_RECORDS": env_int("LOCKSTEP_TELEMETRY_MAX_RECORDS", 5000),
    # Telemetry batches stored at once per console process (of LOCKSTEP_DB_THREADS), and how long
    # a batch waits for its turn before it is answered 503 (the agent sends it again later).
    "TELEMETRY_CONCURRENCY": env_int("LOCKSTEP_TELEMETRY_CONCURRENCY", 2),
    "TELEMETRY_QUEUE_WAIT_S": env_int("LOCKSTEP_TELEMETRY_QUEUE_WAIT_S", 10),
    # Fair shares (console/telemetry/fairshare.py): batches of one node stored or waiting at once per
    # console process, and one node's sustained bytes per second and burst. (Organizations take the
    # turns in rotation: console.core.asyncdb.FairSlots.)
    "TELEMETRY_NODE_CONCURRENCY": env_int("LOCKSTEP_TELEMETRY_NODE_CONCURRENCY", 1),
    "TELEMETRY_NODE_BYTES_PER_S": env_int("LOCKSTEP_TELEMETRY_NODE_BYTES_PER_S", 256 * 1024),
    "TELEMETRY_NODE_BURST_BYTES": env_int("LOCKSTEP_TELEMETRY_NODE_BURST_BYTES", 4 * 1024 * 1024),
    "INVENTORY_MAX_BYTES": env_int("LOCKSTEP_INVENTORY_MAX_BYTES", 2 * 1024 * 1024),
    "TOPOLOGY_MAX_BYTES": env_int("LOCKSTEP_TOPOLOGY_MAX_BYTES", 64 * 1024 * 1024),
    # Bodies of every other route (pages, the API, anonymous or not) and of the small agent routes
    # (enroll, heartbeat), refused with 413 before they are read (console/core/bodylimit.py).
    "BODY_MAX_BYTES": env_int("LOCKSTEP_BODY_MAX_BYTES", 256 * 1024),
    "AGENT_BODY_MAX_BYTES": env_int("LOCKSTEP_AGENT_BODY_MAX_BYTES", 64 * 1024),
    # Live updates: more events than this for one group in one flush collapse into a refresh.
    "LIVE_MAX_EVENTS_PER_FLUSH": env_int("LOCKSTEP_LIVE_MAX_EVENTS_PER_FLUSH", 50),
    # Clock sync (console/clocks): the network solve runs at most this often per cluster, a node's
    # correction is re-sent at least this often, and estimates older than this are left out.
    "CLOCK_SOLVE_MIN_INTERVAL_S": env_int("LOCKSTEP_CLOCK_SOLVE_MIN_INTERVAL_S", 2),
    "CLOCK_CORRECT_EVERY_S": env_int("LOCKSTEP_CLOCK_CORRECT_EVERY_S", 10),
    "CLOCK_ESTIMATE_MAX_AGE_S": env_int("LOCKSTEP_CLOCK_ESTIMATE_MAX_AGE_S", 30),
}

# /metrics (console/core/metrics.py): a bearer token, or a client in one of these networks.
METRICS_TOKEN = env_str("LOCKSTEP_METRICS_TOKEN")
try:
    METRICS_ALLOW = [ipaddress.ip_network(net, strict=False)
                     for net in env_list("LOCKSTEP_METRICS_ALLOW", ["127.0.0.0/8", "::1/128"])]
except ValueError as exc:
    raise ImproperlyConfigured(f"LOCKSTEP_METRICS_ALLOW: {exc}") from None

# Large topology documents (9k GPUs) are accepted by the topology endpoint only.
DATA_UPLOAD_MAX_MEMORY_SIZE = LOCKSTEP["TOPOLOGY_MAX_BYTES"]

LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "kv": {"format": "ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "kv"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "django.db.backends": {"level": "WARNING"},
        "uvicorn.access": {"level": env_str("ACCESS_LOG_LEVEL", "WARNING")},
    },
}
