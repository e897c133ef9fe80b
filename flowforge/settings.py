"""Django settings for FlowForge.

Everything comes from the environment with working local defaults, so a fresh
checkout runs against the PostgreSQL and Redis of a developer machine:

- ``DATABASE_URL``  default ``postgres://postgres@127.0.0.1:5432/flowforge``
- ``REDIS_URL``     default ``redis://127.0.0.1:6379/0``
- ``BROKER_URL``    default: ``REDIS_URL``; an ``amqp://`` URL selects RabbitMQ
- ``BROKER_NAMESPACE`` Redis key / queue-name prefix, so parallel checkouts and the
  test suite do not consume each other's messages (default ``flowforge``)
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    """Read a boolean environment variable ("1", "true", "yes", "on" are true; "0",
    "false", "no", "off" and "" false; any case). Raises ImproperlyConfigured naming the
    variable for anything else: a typo must not silently turn a setting off."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in {"1", "true", "yes", "on"}:
        return True
    if word in {"0", "false", "no", "off", ""}:
        return False
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"{name}={raw!r}: expected true or false (1/0, yes/no, on/off)")


def env_float(name: str, default: float) -> float:
    """Read a finite number from environment variable ``name`` (``default`` when unset or
    empty). Raises ImproperlyConfigured naming the variable for anything else."""
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"{name}={raw!r}: expected a finite number (e.g. {default:g})")
    return value


# The development default; with DEBUG off it is refused (see "Production safety" below).
DEV_SECRET_KEY = "dev-insecure-flowforge-secret-key-change-me-in-production"
SECRET_KEY = os.environ.get("SECRET_KEY", DEV_SECRET_KEY)
DEBUG = env_bool("DEBUG", True)
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # BrinIndex (engine.models.OutboxMessage: idx_outbox_created_brin).
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "allauth",
    "allauth.account",
    "allauth.mfa",
    "tenancy",
    "engine",
    "audit",
    "api",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (CSS, JS, htmx, Swagger UI) served by the app server itself, gunicorn included.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "flowforge.middleware.RequestContextMiddleware",
    # Problem details for every /api/ error, and the request body limit (api.middleware).
    "api.middleware.ApiProblemMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
]

# Content-Security-Policy (Django 6's built-in middleware): scripts only from this
# site or with the per-request nonce — no 'unsafe-inline' scripts anywhere.
from django.utils.csp import CSP  # noqa: E402

SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "font-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}
# Behind HTTPS (production), cookies are secure-only and HSTS is on.
HTTPS = env_bool("HTTPS", not DEBUG)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = 31536000 if HTTPS else 0
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_PROXY", False) else None

ROOT_URLCONF = "flowforge.urls"
WSGI_APPLICATION = "flowforge.wsgi.application"
ASGI_APPLICATION = "flowforge.asgi.application"

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
                "django.template.context_processors.csp",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/flowforge")
# A connection is kept (checked before each request or message that reuses it) for this
# many seconds after it opened. Long, because each new connection prepares and plans the
# hot statements again (engine.repositories.driver): measured, the first start on a new
# connection took 40 to 80 ms more than the next ones (README "Latency").
DB_CONN_MAX_AGE_SECONDS = int(os.environ.get("DB_CONN_MAX_AGE_SECONDS", "3600"))
DATABASES = {
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=DB_CONN_MAX_AGE_SECONDS, conn_health_checks=True),
}
# Each request is one transaction, so an audit record commits or rolls back with the
# change it records (views that stream, such as server-sent events, opt out).
DATABASES["default"]["ATOMIC_REQUESTS"] = True
# A session idle inside a transaction (a frozen process) must not hold row locks forever.
DATABASES["default"].setdefault("OPTIONS", {})["options"] = "-c idle_in_transaction_session_timeout=60000"
# Server-side prepared statements for the engine's hot path (engine.repositories.driver
# runs it through psycopg cursors with prepare=True): without a threshold psycopg disables
# preparing altogether, and PostgreSQL parses and plans every transition again. Django's
# own queries bind parameters client-side and are never prepared.
DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 5
# Those statements take arrays of ids, and PostgreSQL's default plan choice kept custom
# plans for them: re-planned on every call (~1 ms each, measured). A generic plan is made
# once per statement and connection. Only prepared statements are affected.
DATABASES["default"]["OPTIONS"]["options"] += " -c plan_cache_mode=force_generic_plan"
if os.environ.get("TEST_DATABASE_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": os.environ["TEST_DATABASE_NAME"]}

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
BROKER_URL = os.environ.get("BROKER_URL", REDIS_URL)
BROKER_NAMESPACE = os.environ.get("BROKER_NAMESPACE", "flowforge")

AUTH_USER_MODEL = "tenancy.User"
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "/"

# --- django-allauth: email is the login, verified before first sign-in ----------------
ACCOUNT_USER_MODEL_USERNAME_FIELD = None
ACCOUNT_LOGIN_METHODS = {"email"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = "mandatory"
ACCOUNT_UNIQUE_EMAIL = True
ACCOUNT_LOGIN_ON_EMAIL_CONFIRMATION = True
ACCOUNT_CONFIRM_EMAIL_ON_GET = False
ACCOUNT_LOGOUT_ON_PASSWORD_CHANGE = False
ACCOUNT_RATE_LIMITS = {
    # allauth's defaults, written out so they are visible and reviewable.
    "login_failed": "10/m/ip,5/5m/key",
    "login": "30/m/ip",
    "signup": "20/m/ip",
    "confirm_email": "1/3m/key",
    "reset_password": "20/m/ip,5/m/key",
    "reset_password_from_key": "20/m/ip",
    "change_password": "5/m/user",
}
MFA_SUPPORTED_TYPES = ["totp", "recovery_codes"]
MFA_TOTP_ISSUER = "FlowForge"

# Email (Django 6.1 MAILERS): the console by default; SMTP when EMAIL_HOST is set.
if os.environ.get("EMAIL_HOST"):
    MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {
                "host": os.environ["EMAIL_HOST"],
                "port": int(os.environ.get("EMAIL_PORT", "587")),
                "username": os.environ.get("EMAIL_HOST_USER", ""),
                "password": os.environ.get("EMAIL_HOST_PASSWORD", ""),
                "use_tls": env_bool("EMAIL_USE_TLS", True),
                # Seconds each step of a send (connecting, each read and write) may wait: a hung
                # mail server fails the send (the page says the mail could not be sent) instead
                # of holding the request for ever.
                "timeout": env_float("EMAIL_TIMEOUT", 10.0),
            },
        }
    }
else:
    # Printed decoded and whole (frontend/mail_backends.py): Django's console backend prints
    # quoted-printable, whose soft line breaks cut the confirmation link in var/log/web.log.
    MAILERS = {"default": {"BACKEND": "frontend.mail_backends.DecodedConsoleEmailBackend"}}
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "FlowForge <no-reply@flowforge.local>")

# Shared cache (allauth's rate limits, verified API keys): Redis, so every process
# sees the same counters and a revoked key is refused everywhere at once.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": BROKER_NAMESPACE,
    }
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.authentication.ApiKeyAuthentication",
        "api.authentication.CsrfSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "api.exceptions.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "api.schema.ProblemAutoSchema",
    # FLOWFORGE_API_RATE_LIMIT_PER_MINUTE per API key (per user for a session) and
    # FLOWFORGE_API_RATE_LIMIT_PER_MINUTE_PER_ORG per organization, in Redis.
    "DEFAULT_THROTTLE_CLASSES": ["api.throttling.ApiRateThrottle"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "FlowForge API",
    "DESCRIPTION": "Workflows, runs, events, triggers and organization administration. "
    "Authenticate with `Authorization: Bearer ffk_...`.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI's assets come from the drf-spectacular-sidecar package: served by this
    # site, so the docs work offline and under the site's Content-Security-Policy.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "WorkflowStateEnum": "engine.models.WorkflowState",
        "RunStateEnum": "engine.models.RunState",
        "TaskRunStateEnum": "engine.models.TaskRunState",
        "RunLimitPolicyEnum": "engine.models.RunLimitPolicy",
        # A member's role and an API key's (which adds "worker"): two fields named role.
        "RoleEnum": "tenancy.models.Role",
        "KeyRoleEnum": "tenancy.models.KeyRole",
        # Notifications (issue 19): the types a webhook subscribes to, a delivery's state.
        "NotificationTypeEnum": "engine.states.NotificationType",
        "DeliveryStateEnum": "engine.states.DeliveryState",
        # An invitation's state, in its own serializer and the created one's (email_sent).
        "InvitationStateEnum": "tenancy.models.InvitationState.values",
    },
}
# Largest request body accepted, in bytes (a bigger one is a 413).
FLOWFORGE_MAX_BODY_BYTES = int(os.environ.get("FLOWFORGE_MAX_BODY_BYTES", str(1024 * 1024)))
DATA_UPLOAD_MAX_MEMORY_SIZE = FLOWFORGE_MAX_BODY_BYTES
# Requests per minute per API key (Redis-backed); past it, 429 with Retry-After.
FLOWFORGE_API_RATE_LIMIT_PER_MINUTE = int(os.environ.get("FLOWFORGE_API_RATE_LIMIT_PER_MINUTE", "600"))
# Requests per minute per organization (all its keys and session users together; issue
# 16), by default four keys' worth; past it, 429 naming the organization's budget. 0 disables it.
FLOWFORGE_API_RATE_LIMIT_PER_MINUTE_PER_ORG = int(os.environ.get(
    "FLOWFORGE_API_RATE_LIMIT_PER_MINUTE_PER_ORG", str(4 * FLOWFORGE_API_RATE_LIMIT_PER_MINUTE)))
# Invitations are mail to any address a member types: at most this many may be sent in any
# 24 hours by one organization, and by one person across every organization (an API key
# sends on its creator's behalf), so that anyone who signs up cannot use the deployment's
# mail to spam (tenancy.services.invite_member; a re-sent invitation counts again). 0
# disables either limit.
FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG = int(os.environ.get("FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG", "50"))
FLOWFORGE_INVITATIONS_PER_DAY_PER_USER = int(os.environ.get("FLOWFORGE_INVITATIONS_PER_DAY_PER_USER", "100"))
for _name in ("FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG", "FLOWFORGE_INVITATIONS_PER_DAY_PER_USER"):
    if globals()[_name] < 0:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"{_name} ({globals()[_name]}) must be 0 (no limit) or more")
# A worker's calls on the tasks it holds (heartbeat, complete, fail) have their own budget
# (api.throttling.WorkerLeaseThrottle): polls and log lines cannot spend what its
# heartbeats need. 0 disables either.
FLOWFORGE_WORKER_LEASE_CALLS_PER_MINUTE = int(os.environ.get("FLOWFORGE_WORKER_LEASE_CALLS_PER_MINUTE", "6000"))
FLOWFORGE_WORKER_LEASE_CALLS_PER_MINUTE_PER_ORG = int(os.environ.get(
    "FLOWFORGE_WORKER_LEASE_CALLS_PER_MINUTE_PER_ORG", str(4 * FLOWFORGE_WORKER_LEASE_CALLS_PER_MINUTE)))
# Failed API key authentications per client address per minute; past it, 429 without
# verifying (each failure costs an Argon2 check). 0 disables the limit.
FLOWFORGE_API_KEY_FAILURES_PER_MINUTE = int(os.environ.get("FLOWFORGE_API_KEY_FAILURES_PER_MINUTE", "30"))
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
# Where offloaded payloads (task outputs over the row's cap: engine.offload) are kept: the
# filesystem under var/offload by default; S3 or any S3-compatible store (MinIO, R2, ...)
# with FLOWFORGE_OFFLOAD_STORAGE=s3 and django-storages' AWS_* settings from the environment
# (AWS_STORAGE_BUCKET_NAME, AWS_S3_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
FLOWFORGE_OFFLOAD_STORAGE = os.environ.get("FLOWFORGE_OFFLOAD_STORAGE", "filesystem").strip().lower()
if FLOWFORGE_OFFLOAD_STORAGE == "filesystem":
    _offload = {"BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": os.environ.get("FLOWFORGE_OFFLOAD_DIR", str(BASE_DIR / "var" / "offload")),
                            "base_url": None}}
elif FLOWFORGE_OFFLOAD_STORAGE == "s3":
    _offload = {"BACKEND": "storages.backends.s3.S3Storage",
                "OPTIONS": {"bucket_name": os.environ.get("AWS_STORAGE_BUCKET_NAME", ""),
                            "endpoint_url": os.environ.get("AWS_S3_ENDPOINT_URL") or None,
                            "location": os.environ.get("FLOWFORGE_OFFLOAD_PREFIX", "flowforge-offload"),
                            "default_acl": None, "querystring_auth": True, "file_overwrite": True}}
else:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"FLOWFORGE_OFFLOAD_STORAGE={FLOWFORGE_OFFLOAD_STORAGE!r}: expected filesystem or s3")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "offload": _offload,
}
# WhiteNoise serves straight from the apps' static folders (no collectstatic needed to run;
# the Docker image runs collectstatic and serves the compressed copies).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Engine -----------------------------------------------------------------
# Seconds a started task run holds its lease before the reaper may take it back.
# Workers heartbeat every third of this.
FLOWFORGE_LEASE_SECONDS = env_float("FLOWFORGE_LEASE_SECONDS", 30.0)
# Seconds a claimed generation may wait in the broker for a worker to start it before
# the reaper assumes the message was lost and dispatches a new generation. Longer than
# the run lease, so a queue backlog is not mistaken for a lost message.
FLOWFORGE_DISPATCH_LEASE_SECONDS = env_float("FLOWFORGE_DISPATCH_LEASE_SECONDS", 300.0)
# Seconds between heartbeats of a running task (defaults to a third of the lease).
FLOWFORGE_HEARTBEAT_SECONDS = env_float("FLOWFORGE_HEARTBEAT_SECONDS", FLOWFORGE_LEASE_SECONDS / 3)
# --- the organizations' own workers (issue 18, docs/workers.md) ---
# Seconds a task handed to an organization's worker holds its lease; the worker heartbeats
# every third of it (the poll's heartbeat_interval_seconds). A worker that stops
# heartbeating loses the task within this time, and it is handed out again.
FLOWFORGE_WORKER_LEASE_SECONDS = env_float("FLOWFORGE_WORKER_LEASE_SECONDS", 60.0)
if FLOWFORGE_WORKER_LEASE_SECONDS < 1:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"FLOWFORGE_WORKER_LEASE_SECONDS ({FLOWFORGE_WORKER_LEASE_SECONDS:g}) must be at least 1 second"
    )
# Long polls (POST /api/v1/worker/poll waiting for work) one web process holds at once, at
# most half of them one organization's; each holds a web server thread, so keep it below
# the threads per process. A poll past it that finds nothing ready gets a 503 with Retry-After.
FLOWFORGE_WORKER_POLLS_PER_PROCESS = int(os.environ.get("FLOWFORGE_WORKER_POLLS_PER_PROCESS", "6"))
# Longest a poll waits for work, in seconds, whatever its wait_seconds asks (0 to 30): lower it
# where a proxy in front cuts requests sooner.
FLOWFORGE_WORKER_POLL_MAX_WAIT_SECONDS = env_float("FLOWFORGE_WORKER_POLL_MAX_WAIT_SECONDS", 30.0)
# Seconds since a worker's last poll within which the workers page, GET /api/v1/workers/ and
# the run page count it live. An idle worker polls at least every 30 s (the longest
# wait_seconds; the SDK's default is 20 s) and its last_seen_at is written at most every
# 10 s (engine.repositories.worker_queues.WORKER_SEEN_RESOLUTION_SECONDS), so 90 s is three
# missed polls. A worker whose slots are all busy does not poll: it counts live while it
# holds a task whose lease its heartbeats keep current.
FLOWFORGE_WORKER_LIVE_SECONDS = env_float("FLOWFORGE_WORKER_LIVE_SECONDS", 90.0)
if FLOWFORGE_WORKER_LIVE_SECONDS <= 0:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"FLOWFORGE_WORKER_LIVE_SECONDS ({FLOWFORGE_WORKER_LIVE_SECONDS:g}) must be above 0 seconds"
    )
# How many dependents in a row a worker thread runs itself after a success, instead of
# sending them through the broker (engine.worker.execute); 0 sends every one.
FLOWFORGE_INLINE_CONTINUATIONS = int(os.environ.get("FLOWFORGE_INLINE_CONTINUATIONS", "100"))
# Most broker messages one publish of dispatches is split into: a publish of more
# generations than this (a claim burst) sends exactly this many messages, each carrying
# several generations that one worker thread runs in turn (engine.relay.group_rows).
# Keep it at least the worker threads of the whole deployment (16: 2 processes x 8 threads,
# as `make run` and docker-compose.yml start them); 0 sends one message each. Measured
# against 64 in `make bench` (2,000 independent tasks, 3 runs x 3 rounds alternated, with
# FLOWFORGE_DISPATCH_AHEAD 128 against 64): 0.30 against 0.24 of raw Dramatiq's throughput,
# since fewer broker messages (fetch, ack, enqueue) carry the same generations.
FLOWFORGE_DISPATCH_FANOUT = int(os.environ.get("FLOWFORGE_DISPATCH_FANOUT", "16"))
# Seconds one such message may run before the generations in it not yet started are
# handed back to the broker, one message each, for other threads (engine.worker.handoff.HandOff).
FLOWFORGE_GROUP_HANDOFF_SECONDS = env_float("FLOWFORGE_GROUP_HANDOFF_SECONDS", 1.0)
# A new run's roots are claimed in the transaction that creates it and published by the
# starting process after the commit (the fair claim decides, as the scheduler's would):
# no broker hop to the scheduler before the first task; the roots of runs started inside
# a caller's transaction are claimed together right after its commit. Off: the start
# nudges the scheduler, which claims them (issue 17; README "Latency").
FLOWFORGE_CLAIM_ON_START = env_bool("FLOWFORGE_CLAIM_ON_START", True)
# Idle worker consumers are woken by each enqueue (a Redis pub/sub notification) and by
# their own acks instead of polling with back-off (flowforge.redis_wakeup). Off: upstream
# Dramatiq's polling consumer. Redis broker only.
FLOWFORGE_BROKER_WAKEUP = env_bool("FLOWFORGE_BROKER_WAKEUP", True)
# Redis brokers (issue 22, flowforge/broker_recovery.py): every worker process beats every
# HEARTBEAT seconds, and the messages a process fetched and never acknowledged go back to
# their queues once it has been silent DEAD_AFTER seconds (a SIGKILLed pool's prefetched
# messages: back within DEAD_AFTER + HEARTBEAT). Lower recovers sooner; too low takes a
# process stalled that long (a task holding the GIL) for dead: its messages are delivered
# again, and the fencing token refuses the second start, so the cost is a wasted delivery.
FLOWFORGE_BROKER_HEARTBEAT_SECONDS = env_float("FLOWFORGE_BROKER_HEARTBEAT_SECONDS", 5.0)
FLOWFORGE_BROKER_DEAD_AFTER_SECONDS = env_float("FLOWFORGE_BROKER_DEAD_AFTER_SECONDS", 20.0)
if FLOWFORGE_BROKER_HEARTBEAT_SECONDS <= 0:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"FLOWFORGE_BROKER_HEARTBEAT_SECONDS ({FLOWFORGE_BROKER_HEARTBEAT_SECONDS:g}) must be above 0"
    )
if FLOWFORGE_BROKER_DEAD_AFTER_SECONDS < 3 * FLOWFORGE_BROKER_HEARTBEAT_SECONDS:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"FLOWFORGE_BROKER_DEAD_AFTER_SECONDS ({FLOWFORGE_BROKER_DEAD_AFTER_SECONDS:g}) must be at least 3 x "
        f"FLOWFORGE_BROKER_HEARTBEAT_SECONDS ({FLOWFORGE_BROKER_HEARTBEAT_SECONDS:g}): a live worker that misses "
        "a beat or two would be taken for dead"
    )
# Each web process sends itself one request before it serves (flowforge/wsgi.py), so no
# client's request pays for its lazy imports and URL maps.
FLOWFORGE_WEB_WARM_UP = env_bool("FLOWFORGE_WEB_WARM_UP", True)
# Task runs claimed per scheduler transaction, and outbox rows relayed per batch.
FLOWFORGE_CLAIM_BATCH = int(os.environ.get("FLOWFORGE_CLAIM_BATCH", "200"))
FLOWFORGE_RELAY_BATCH = int(os.environ.get("FLOWFORGE_RELAY_BATCH", "200"))
# --- Sharing the workers between organizations (issue 16; docs/scheduling.md) ---
# Generations of one organization claimed but not yet started (in the broker or a
# worker's prefetch), per unit of its weight: the broker queue holds at most this much of
# one organization's backlog in front of another's work. Keep it at least the worker
# threads of the whole deployment (plus their prefetch), or one organization alone cannot
# keep every worker busy. A refill claims once a quarter of it has started, so it also sets
# the size of a refill's claim (32 at 128: fewer, larger claim transactions).
FLOWFORGE_DISPATCH_AHEAD = int(os.environ.get("FLOWFORGE_DISPATCH_AHEAD", "128"))
# Of those, how many (per unit of weight) go to the first lane (engine.states.TASK_FIRST_QUEUE),
# which workers take before any bulk message: an organization with little waiting starts
# its next task ahead of another organization's whole backlog.
FLOWFORGE_DISPATCH_FIRST = int(os.environ.get("FLOWFORGE_DISPATCH_FIRST", "2"))
# Threads of each worker process, beside Dramatiq's --threads, that take only first-lane
# generations and control actors (flowforge.dramatiq_middleware.LaneWorkQueue): when every
# ordinary thread is busy with one organization's backlog, another organization's first
# task starts at once instead of waiting for one of them to finish. 0: none.
FLOWFORGE_WORKER_RESERVED_THREADS = int(os.environ.get("FLOWFORGE_WORKER_RESERVED_THREADS", "1"))
# A worker process's refill thread claims for the organizations its batches recorded
# (refills their dispatch-ahead) at most once per this many seconds; batches themselves
# claim only the dependents their successes promote (engine.worker.batching.Refiller).
FLOWFORGE_REFILL_INTERVAL_SECONDS = env_float("FLOWFORGE_REFILL_INTERVAL_SECONDS", 0.02)
# A worker process's batch of starts and successes that begins right after the last one
# released several threads waits up to this long for their next requests, so they share
# one transaction (engine.worker.combiner.Combiner's linger, which also ends once none has
# come for a quarter of it; 0: off). 2 x 8 threads, 2,000 independent no-op tasks: about
# 1,550 against 1,420 tasks/s, 0.57-0.61 against 0.62-0.69 ms of PostgreSQL CPU a task.
FLOWFORGE_BATCH_LINGER_SECONDS = env_float("FLOWFORGE_BATCH_LINGER_SECONDS", 0.0015)
# Each plan's defaults: weight (share of the workers against other organizations with
# ready work), max_running_task_runs (claimed or running at once), max_runs_per_minute
# (runs started in any 60 s, every channel), max_definition_bytes (stored definitions,
# every version). An organization's *_override columns replace single values (admin).
FLOWFORGE_PLANS = {
    "free": {"weight": 1, "max_running_task_runs": 100, "max_runs_per_minute": 600,
             "max_definition_bytes": 10 * 1024 * 1024},
    "team": {"weight": 2, "max_running_task_runs": 400, "max_runs_per_minute": 3000,
             "max_definition_bytes": 50 * 1024 * 1024},
    "business": {"weight": 4, "max_running_task_runs": 2000, "max_runs_per_minute": 12000,
                 "max_definition_bytes": 250 * 1024 * 1024},
}
# Clock periods in seconds: the safety net behind the on-commit nudges.
FLOWFORGE_CLOCK_SCHEDULE_SECONDS = env_float("FLOWFORGE_CLOCK_SCHEDULE_SECONDS", 1.0)
FLOWFORGE_CLOCK_REAP_SECONDS = env_float("FLOWFORGE_CLOCK_REAP_SECONDS", 2.0)
FLOWFORGE_CLOCK_RELAY_SECONDS = env_float("FLOWFORGE_CLOCK_RELAY_SECONDS", 2.0)
# When set, /metrics requires "Authorization: Bearer <this>".
FLOWFORGE_METRICS_TOKEN = os.environ.get("FLOWFORGE_METRICS_TOKEN", "")
# Organizations labelled by slug in /metrics' per-organization gauges (the most ready +
# running task runs); the rest are summed under org="other", bounding the series.
FLOWFORGE_METRICS_TOP_ORGS = int(os.environ.get("FLOWFORGE_METRICS_TOP_ORGS", "10"))
FLOWFORGE_CLOCK_TRIGGER_SECONDS = env_float("FLOWFORGE_CLOCK_TRIGGER_SECONDS", 5.0)
FLOWFORGE_CLOCK_SWEEP_SECONDS = env_float("FLOWFORGE_CLOCK_SWEEP_SECONDS", 10.0)
FLOWFORGE_CLOCK_HOUSEKEEPING_SECONDS = env_float("FLOWFORGE_CLOCK_HOUSEKEEPING_SECONDS", 300.0)
# How often the clock lets the cron triggers' backfills go on (engine.backfill), in seconds.
FLOWFORGE_CLOCK_BACKFILL_SECONDS = env_float("FLOWFORGE_CLOCK_BACKFILL_SECONDS", 2.0)
# Backfills (engine.backfill): the most instants (runs) one backfill may cover, and the most
# backfills an organization may have going at once.
FLOWFORGE_BACKFILL_MAX_RUNS = int(os.environ.get("FLOWFORGE_BACKFILL_MAX_RUNS", "1000"))
FLOWFORGE_BACKFILL_MAX_RUNNING_PER_ORG = int(os.environ.get("FLOWFORGE_BACKFILL_MAX_RUNNING_PER_ORG", "5"))
# Largest task output stored, in bytes of its JSON encoding; larger outputs are replaced by a summary.
FLOWFORGE_MAX_OUTPUT_BYTES = int(os.environ.get("FLOWFORGE_MAX_OUTPUT_BYTES", str(256 * 1024)))
# Largest run input (a start by any channel, a cron trigger's input), in bytes of its JSON as
# stored (flowforge.jsonb.stored_bytes: numbers written in full); by default the request body cap.
FLOWFORGE_MAX_INPUT_BYTES = int(os.environ.get("FLOWFORGE_MAX_INPUT_BYTES", str(FLOWFORGE_MAX_BODY_BYTES)))
# An output over FLOWFORGE_MAX_OUTPUT_BYTES (the largest kept in the task-run row) is offloaded
# to the "offload" storage (engine.offload) up to this size in bytes of JSON; over it the task fails.
FLOWFORGE_MAX_OFFLOADED_OUTPUT_BYTES = int(os.environ.get("FLOWFORGE_MAX_OFFLOADED_OUTPUT_BYTES", str(32 * 1024 * 1024)))
# Run retention (engine.retention, docs/retention.md): finished runs older than this many days
# are removed with everything they own; an organization's run_retention_days (staff, admin)
# replaces it; 0 keeps runs forever. At most 36,500 days, as the admin allows an organization.
_retention_days = env_float("FLOWFORGE_RUN_RETENTION_DAYS", 30)
if _retention_days < 0 or _retention_days > 36500 or _retention_days != int(_retention_days):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"FLOWFORGE_RUN_RETENTION_DAYS={os.environ.get('FLOWFORGE_RUN_RETENTION_DAYS')!r}: "
                               "expected a whole number of days from 0 to 36500 (0 keeps runs forever; "
                               "FLOWFORGE_RUN_RETENTION_SECONDS takes fractions)")
FLOWFORGE_RUN_RETENTION_DAYS = int(_retention_days)
# The same in seconds, when set: it replaces FLOWFORGE_RUN_RETENTION_DAYS (a soak keeps minutes).
FLOWFORGE_RUN_RETENTION_SECONDS = env_float("FLOWFORGE_RUN_RETENTION_SECONDS", FLOWFORGE_RUN_RETENTION_DAYS * 86400)
if not 0 <= FLOWFORGE_RUN_RETENTION_SECONDS <= 36500 * 86400:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"FLOWFORGE_RUN_RETENTION_SECONDS={os.environ.get('FLOWFORGE_RUN_RETENTION_SECONDS')!r}: "
                               "expected a number of seconds from 0 to 3153600000 (100 years; 0 keeps runs forever)")
# History partitions (engine.partitions, migration 0033): the events and log lines of runs created
# in one period of this many seconds (60 to 31 days) share a partition, dropped whole once no run
# of the period is kept; the clock's housekeeping keeps FLOWFORGE_HISTORY_PARTITIONS_AHEAD (2 to
# 100) periods created ahead.
FLOWFORGE_HISTORY_PARTITION_SECONDS = int(env_float("FLOWFORGE_HISTORY_PARTITION_SECONDS", 86400))
FLOWFORGE_HISTORY_PARTITIONS_AHEAD = int(env_float("FLOWFORGE_HISTORY_PARTITIONS_AHEAD", 14))
if not 60 <= FLOWFORGE_HISTORY_PARTITION_SECONDS <= 31 * 86400 or not 2 <= FLOWFORGE_HISTORY_PARTITIONS_AHEAD <= 100:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("FLOWFORGE_HISTORY_PARTITION_SECONDS: expected 60 to 2678400 seconds (31 days), and "
                               "FLOWFORGE_HISTORY_PARTITIONS_AHEAD 2 to 100 periods")
# Runs removed per retention transaction, and at most per housekeeping pass.
FLOWFORGE_RETENTION_BATCH_RUNS = int(os.environ.get("FLOWFORGE_RETENTION_BATCH_RUNS", "200"))
FLOWFORGE_RETENTION_MAX_RUNS_PER_PASS = int(os.environ.get("FLOWFORGE_RETENTION_MAX_RUNS_PER_PASS", "20000"))
# After each retention batch the purge waits this many times as long as the batch took (at most 5 s),
# so a backlog is removed beside the engine's work instead of in place of it: 4 keeps the purge
# to a fifth of one connection's time (the soak: flat out, a purge of 1,000,000 runs cost the
# engine 28% of its throughput). 0: flat out.
FLOWFORGE_RETENTION_PAUSE_FACTOR = env_float("FLOWFORGE_RETENTION_PAUSE_FACTOR", 4.0)
if not 0 <= FLOWFORGE_RETENTION_PAUSE_FACTOR <= 100:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("FLOWFORGE_RETENTION_PAUSE_FACTOR: expected 0 (flat out) to 100")
# Published outbox rows are removed this many seconds after publishing (housekeeping).
FLOWFORGE_OUTBOX_KEEP_PUBLISHED_SECONDS = env_float("FLOWFORGE_OUTBOX_KEEP_PUBLISHED_SECONDS", 3600)
# Where example workflows write their reports.
FLOWFORGE_REPORT_DIR = Path(os.environ.get("FLOWFORGE_REPORT_DIR", str(BASE_DIR / "var" / "reports")))

# Logs: JSON lines in production (LOG_FORMAT=json, the default when DEBUG is off), plain
# text in development; every line carries the bound ids (flowforge.logs).
LOG_FORMAT = os.environ.get("LOG_FORMAT", "plain" if DEBUG else "json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "flowforge.logs.ContextFilter"}},
    "formatters": {
        "plain": {"()": "flowforge.logs.PlainFormatter", "format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(organization_id)s "
            "%(workflow_run_id)s %(task_run_id)s %(attempt)s %(fencing_token)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["context"]}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- frontend/identity (helper) ---
# The header of every page (allauth's included) shows the signed-in user and the
# active organization with a switcher; the context processor computes it lazily.
TEMPLATES[0]["OPTIONS"]["context_processors"].append("frontend.context_processors.navigation")
# Invitation tokens travel in the accept link's path; keep them out of Django's request logs.
# (django.server, runserver's access log, is restated from Django's defaults because
# configuring a logger replaces its handlers.)
from django.utils.log import DEFAULT_LOGGING as _DJANGO_LOGGING  # noqa: E402

LOGGING.setdefault("filters", {})["redact_invitation_tokens"] = {"()": "frontend.log_redaction.RedactInvitationTokens"}
LOGGING["formatters"].setdefault("django.server", _DJANGO_LOGGING["formatters"]["django.server"])
LOGGING["handlers"].setdefault("django.server", _DJANGO_LOGGING["handlers"]["django.server"])
LOGGING["loggers"]["django.server"] = {
    **_DJANGO_LOGGING["loggers"]["django.server"],
    "filters": ["redact_invitation_tokens"],
}
LOGGING["loggers"].setdefault("django.request", {}).setdefault("filters", []).append("redact_invitation_tokens")

# --- Production safety and python task callables (sec/callables) ---------------------------
from django.core.exceptions import ImproperlyConfigured  # noqa: E402

# With DEBUG off, a missing, default, placeholder or weak SECRET_KEY stops every process
# (gunicorn, dramatiq flowforge.worker, manage.py run_clock) here, at settings import: a
# known key lets anyone forge sessions, email confirmations and password-reset links.
_SECRET_KEY_HOWTO = (
    'set the SECRET_KEY environment variable to a random value of at least 50 characters, '
    'e.g. the output of: python -c "import secrets; print(secrets.token_urlsafe(50))"'
)


def secret_key_problem(key: str | None) -> str | None:
    """Why ``key`` is unfit for production (a sentence naming SECRET_KEY), or None if it is fit.

    Unfit: missing or empty, the development default, docker-compose's former ``change-me``,
    Django's generated ``django-insecure-`` keys, shorter than 50 characters, or fewer than
    5 distinct characters (Django's ``check --deploy`` thresholds). Never echoes the key.
    """
    if not key:
        return "SECRET_KEY is not set"
    if key == DEV_SECRET_KEY:
        return "SECRET_KEY is the development default of flowforge/settings.py"
    if key == "change-me":
        return "SECRET_KEY is the placeholder 'change-me'"
    if key.startswith("django-insecure"):
        return "SECRET_KEY is a key Django generated for development ('django-insecure-...')"
    if len(key) < 50:
        return f"SECRET_KEY is {len(key)} characters long; at least 50 are needed"
    if len(set(key)) < 5:
        return f"SECRET_KEY has {len(set(key))} distinct characters; at least 5 are needed"
    return None


if not DEBUG:
    _problem = secret_key_problem(os.environ.get("SECRET_KEY"))
    if _problem:
        raise ImproperlyConfigured(f"{_problem} and DEBUG is off: {_SECRET_KEY_HOWTO}.")

# /metrics with DEBUG off: a Bearer FLOWFORGE_METRICS_TOKEN is required, or 403 when none is
# configured; FLOWFORGE_METRICS_PUBLIC=true serves it to anyone (behind a private network only).
FLOWFORGE_METRICS_PUBLIC = env_bool("FLOWFORGE_METRICS_PUBLIC", False)

# Full dotted names of the functions a ``python`` task may call, comma separated; each must
# be a plain function defined under that name (checked at start-up, engine.apps). Default:
# the callables of the shipped examples/ workflows.
DEFAULT_TASK_CALLABLES = [
    f"examples.penguins.tasks.{name}"
    for name in ("extract", "validate", "by_species", "by_island", "by_sex_year", "aggregate", "report")
]
FLOWFORGE_TASK_CALLABLES = [
    n.strip() for n in os.environ.get("FLOWFORGE_TASK_CALLABLES", ",".join(DEFAULT_TASK_CALLABLES)).split(",")
    if n.strip()
]
# The former prefix allowlist admitted any attribute of any module under a prefix; a deployment
# still setting it is told what replaces it rather than silently losing its callables.
if "FLOWFORGE_PYTHON_TASK_ALLOWLIST" in os.environ:
    raise ImproperlyConfigured(
        "FLOWFORGE_PYTHON_TASK_ALLOWLIST is no longer supported (a module prefix admitted every "
        "attribute of every module under it): remove it and list each function a python task may "
        "call by its full dotted name in FLOWFORGE_TASK_CALLABLES (comma separated), e.g. "
        "FLOWFORGE_TASK_CALLABLES=mypackage.tasks.extract,mypackage.tasks.load"
    )

# --- egress policy (security: http task SSRF) ---
# Host names and CIDRs the http task may reach although private/loopback/link-local
# (comma-separated, e.g. "intranet.example,10.20.0.0/16"); empty: public addresses only.
FLOWFORGE_EGRESS_ALLOW = [e.strip() for e in os.environ.get("FLOWFORGE_EGRESS_ALLOW", "").split(",") if e.strip()]

# --- server-sent event streams (issue 14, finding 3) ---
# Open event streams (API run events + web run pages) allowed per API key or per user, deployment-wide (Redis).
FLOWFORGE_SSE_PER_PRINCIPAL = int(os.environ.get("FLOWFORGE_SSE_PER_PRINCIPAL", "5"))
# Open event streams allowed per organization, deployment-wide (Redis).
FLOWFORGE_SSE_PER_ORG = int(os.environ.get("FLOWFORGE_SSE_PER_ORG", "20"))
# Open event streams per web process; keep it below the web server's threads per process so ordinary requests
# (/healthz included) keep threads.
FLOWFORGE_SSE_PER_PROCESS = int(os.environ.get("FLOWFORGE_SSE_PER_PROCESS", "2"))
# Seconds between re-authorizations of an open stream (revoked key, removed member: the stream ends).
FLOWFORGE_SSE_REAUTH_SECONDS = env_float("FLOWFORGE_SSE_REAUTH_SECONDS", 30.0)

# --- limits: definition size and aggregate sizes (issue 14, finding 3) ---
# Dependencies one task may list (depends_on): a fan-in of up to this many tasks. Also
# bounds the per-completion fan-in check of the engine (dependencies of a dependent).
FLOWFORGE_MAX_DEPENDENCIES_PER_TASK = int(os.environ.get("FLOWFORGE_MAX_DEPENDENCIES_PER_TASK", "1000"))
# Dependencies (edges) of one workflow version in total.
FLOWFORGE_MAX_DEPENDENCIES_PER_WORKFLOW = int(os.environ.get("FLOWFORGE_MAX_DEPENDENCIES_PER_WORKFLOW", "50000"))
# Bytes of dependency outputs (JSON text) handed whole to one task; the rest are summaries.
FLOWFORGE_MAX_UPSTREAM_BYTES = int(os.environ.get("FLOWFORGE_MAX_UPSTREAM_BYTES", str(1024 * 1024)))
# Outputs larger than this (bytes of JSON text) are summarized with a link in run details.
FLOWFORGE_INLINE_OUTPUT_BYTES = int(os.environ.get("FLOWFORGE_INLINE_OUTPUT_BYTES", str(4 * 1024)))

# --- audit chain keys (sec/authority helper: issue 14, finding 5; docs/audit.md) ---
# FLOWFORGE_AUDIT_KEYS: "<id>:<base64 key>,..." HMAC keys of the audit chain; the first signs new rows, the rest verify older ones (rotation).
from django.core.exceptions import ImproperlyConfigured  # noqa: E402

from audit.keys import AuditKeyError, dev_audit_keys, parse_audit_keys  # noqa: E402

FLOWFORGE_AUDIT_KEYS = os.environ.get("FLOWFORGE_AUDIT_KEYS", "").strip()
if not FLOWFORGE_AUDIT_KEYS:
    if not DEBUG:
        raise ImproperlyConfigured(
            "FLOWFORGE_AUDIT_KEYS is not set: with DEBUG off the audit log needs a key the database does not "
            "hold. Set FLOWFORGE_AUDIT_KEYS='k1:<base64 of 32 random bytes>', e.g. the output of "
            "python -c \"import base64,secrets; print('k1:' + base64.b64encode(secrets.token_bytes(32)).decode())\" "
            "(docs/audit.md)"
        )
    FLOWFORGE_AUDIT_KEYS = dev_audit_keys(SECRET_KEY)  # DEBUG only, derived from SECRET_KEY: not for production
try:
    parse_audit_keys(FLOWFORGE_AUDIT_KEYS)
except AuditKeyError as exc:
    raise ImproperlyConfigured(str(exc)) from None
# FLOWFORGE_AUDIT_ACCEPT_LEGACY: audit_verify accepts unkeyed (plain SHA-256) rows written before keyed chains; off, so a chain rewritten as "legacy" fails.
FLOWFORGE_AUDIT_ACCEPT_LEGACY = env_bool("FLOWFORGE_AUDIT_ACCEPT_LEGACY", False)
# FLOWFORGE_AUDIT_RETENTION_DAYS: audit rows older than this are removed by housekeeping, each chain
# carried forward by a signed checkpoint (audit.retention, docs/audit.md). 2557 days (7 years; seed
# 001 keeps audit events 84 months); 0 keeps everything; 1..364 is refused (a year at least).
_audit_days = env_float("FLOWFORGE_AUDIT_RETENTION_DAYS", 2557)
if _audit_days != int(_audit_days) or (_audit_days != 0 and _audit_days < 365):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"FLOWFORGE_AUDIT_RETENTION_DAYS={os.environ.get('FLOWFORGE_AUDIT_RETENTION_DAYS')!r}: expected a whole "
        "number of days, at least 365 (audit rows are kept a year at least), or 0 to keep everything"
    )
FLOWFORGE_AUDIT_RETENTION_DAYS = int(_audit_days)
# --- issue 14, finding 7 (smalls helper): secrets at rest, mail in the log ---------------
# Fernet keys encrypting secrets at rest (TOTP secrets, recovery-code seeds), comma-separated:
# the first encrypts, all decrypt (rotation). Required with DEBUG off; with DEBUG on and none
# set, a development key is derived from SECRET_KEY (not for production). flowforge/crypto.py.
from flowforge.crypto import keys_from_environment as _encryption_keys  # noqa: E402

FLOWFORGE_ENCRYPTION_KEYS = _encryption_keys(
    os.environ.get("FLOWFORGE_ENCRYPTION_KEYS", ""), debug=DEBUG, secret_key=SECRET_KEY
)
# --- issue 18: organization secrets (tenancy/vault.py) --------------------------------------
# Fernet keys encrypting the organizations' secrets (the values tasks reference as
# {{ secrets.NAME }}), comma-separated: the first encrypts, all decrypt; after putting a new
# key first, `manage.py rotate_secret_keys` re-encrypts every stored value under it. A key
# ring of its own, apart from FLOWFORGE_ENCRYPTION_KEYS: values sent to tenant-chosen URLs
# are never decrypted with the key that protects users' TOTP secrets. Required with DEBUG
# off; with DEBUG on and none set, a development key is derived from SECRET_KEY.
FLOWFORGE_SECRET_KEYS = _encryption_keys(
    os.environ.get("FLOWFORGE_SECRET_KEYS", ""), debug=DEBUG, secret_key=SECRET_KEY,
    variable="FLOWFORGE_SECRET_KEYS", purpose="the organizations' secrets",
    dev_context=b"flowforge.vault development key v1\x00",
)
# Secrets one organization may hold, and the largest value (bytes of UTF-8).
FLOWFORGE_MAX_SECRETS_PER_ORG = int(os.environ.get("FLOWFORGE_MAX_SECRETS_PER_ORG", "200"))
FLOWFORGE_MAX_SECRET_BYTES = int(os.environ.get("FLOWFORGE_MAX_SECRET_BYTES", str(64 * 1024)))
# allauth stores MFA secrets through this adapter's encrypt/decrypt hooks (tenancy/mfa.py).
MFA_ADAPTER = "tenancy.mfa.EncryptingMFAAdapter"
# No EMAIL_HOST and DEBUG off: the console mailer redacts tokens in links (frontend/mail_backends.py),
# and the web process warns at start-up (frontend.W001). With DEBUG on, links print whole.
if not os.environ.get("EMAIL_HOST") and not DEBUG:
    MAILERS = {"default": {"BACKEND": "frontend.mail_backends.RedactingConsoleEmailBackend"}}
# --- issue 19: every attempt's log lines and traceback (engine/attempt_log.py) --------------
# What one attempt's log keeps (core_tasklog): lines, and bytes of their messages (UTF-8),
# whoever wrote them (a shared worker capturing the handler's logging, stdout and stderr and
# the http task's request summary, or an organization's worker sending lines). Past either
# limit one line says the log was truncated and later lines are dropped (and, for a shared
# worker's attempt, a last line counts them).
FLOWFORGE_TASK_LOG_MAX_LINES = int(os.environ.get("FLOWFORGE_TASK_LOG_MAX_LINES", "2000"))
FLOWFORGE_TASK_LOG_MAX_BYTES = int(os.environ.get("FLOWFORGE_TASK_LOG_MAX_BYTES", str(512 * 1024)))
# Seconds between two writes of the lines a shared worker's running attempts captured (one
# statement for every attempt of the process); an attempt's last lines are written when it
# ends, before its completion. A running attempt's lines show after at most this long.
FLOWFORGE_TASK_LOG_FLUSH_SECONDS = env_float("FLOWFORGE_TASK_LOG_FLUSH_SECONDS", 1.0)
# Characters kept of a failed attempt's traceback (its start and its end; the middle is cut),
# at most 100,000.
FLOWFORGE_TASK_TRACEBACK_MAX_CHARS = int(os.environ.get("FLOWFORGE_TASK_TRACEBACK_MAX_CHARS", "16000"))
for _name in ("FLOWFORGE_TASK_LOG_MAX_LINES", "FLOWFORGE_TASK_LOG_MAX_BYTES", "FLOWFORGE_TASK_TRACEBACK_MAX_CHARS"):
    if globals()[_name] < 1:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"{_name} ({globals()[_name]}) must be at least 1")
if FLOWFORGE_TASK_TRACEBACK_MAX_CHARS > 100_000:  # engine.repositories.task_runs.MAX_TRACEBACK_CHARS
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"FLOWFORGE_TASK_TRACEBACK_MAX_CHARS ({FLOWFORGE_TASK_TRACEBACK_MAX_CHARS}) must be at most 100000")
if FLOWFORGE_TASK_LOG_FLUSH_SECONDS <= 0:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"FLOWFORGE_TASK_LOG_FLUSH_SECONDS ({FLOWFORGE_TASK_LOG_FLUSH_SECONDS:g}) must be above 0 seconds")

# --- notifications (issue 19): webhooks and failure emails (docs/notifications.md) ---
# Webhook endpoints one organization may have.
FLOWFORGE_MAX_WEBHOOKS_PER_ORG = int(os.environ.get("FLOWFORGE_MAX_WEBHOOKS_PER_ORG", "10"))
# Workflows one member may subscribe to the failures of, per organization.
FLOWFORGE_MAX_FAILURE_SUBSCRIPTIONS_PER_MEMBER = int(
    os.environ.get("FLOWFORGE_MAX_FAILURE_SUBSCRIPTIONS_PER_MEMBER", "100"))
# One webhook POST: each of connect, write and every read waits at most this many seconds.
FLOWFORGE_WEBHOOK_TIMEOUT_SECONDS = env_float("FLOWFORGE_WEBHOOK_TIMEOUT_SECONDS", 5.0)
# A delivery's whole attempt (connect to the last byte read, or the mail sent) is stopped after
# this many seconds (the actor's Dramatiq time limit), so a receiver that trickles bytes holds a
# worker thread no longer.
FLOWFORGE_NOTIFY_ATTEMPT_SECONDS = env_float("FLOWFORGE_NOTIFY_ATTEMPT_SECONDS", 20.0)
# Bytes of a receiver's answer read and kept in the delivery log; the rest is not read.
FLOWFORGE_WEBHOOK_RESPONSE_BYTES = int(os.environ.get("FLOWFORGE_WEBHOOK_RESPONSE_BYTES", "1024"))
# Attempts of one delivery before it is dead-lettered; failed attempts are retried after
# min(MAX, BASE * 2^(n-1)) seconds times a random 0.5-1 (network errors, timeouts, 408, 429, 5xx).
FLOWFORGE_NOTIFY_MAX_ATTEMPTS = int(os.environ.get("FLOWFORGE_NOTIFY_MAX_ATTEMPTS", "8"))
FLOWFORGE_NOTIFY_BACKOFF_BASE_SECONDS = env_float("FLOWFORGE_NOTIFY_BACKOFF_BASE_SECONDS", 30.0)
FLOWFORGE_NOTIFY_BACKOFF_MAX_SECONDS = env_float("FLOWFORGE_NOTIFY_BACKOFF_MAX_SECONDS", 3600.0)
# Deliveries being sent at once (worker threads they may hold): deployment-wide, per
# organization, per target (a webhook endpoint, or an email's recipient).
FLOWFORGE_NOTIFY_IN_FLIGHT = int(os.environ.get("FLOWFORGE_NOTIFY_IN_FLIGHT", "4"))
FLOWFORGE_NOTIFY_IN_FLIGHT_PER_ORG = int(os.environ.get("FLOWFORGE_NOTIFY_IN_FLIGHT_PER_ORG", "2"))
FLOWFORGE_NOTIFY_IN_FLIGHT_PER_TARGET = int(os.environ.get("FLOWFORGE_NOTIFY_IN_FLIGHT_PER_TARGET", "1"))
# How often the clock claims due deliveries (a delivery also claims the next ones when it ends).
FLOWFORGE_CLOCK_NOTIFY_SECONDS = env_float("FLOWFORGE_CLOCK_NOTIFY_SECONDS", 1.0)
# The address the web UI is served at (e.g. https://flowforge.example.com), for the links in
# failure emails; empty: the emails name the run without a link.
FLOWFORGE_PUBLIC_URL = os.environ.get("FLOWFORGE_PUBLIC_URL", "").rstrip("/")
