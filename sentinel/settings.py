"""Sentinel's one settings module: everything an operator may change comes from the environment.

Every variable is read through a typed helper (sentinel.env), which also records it with its default
and meaning; the configuration table in docs/configuration.md is checked against that record by a test. A bad value
fails loudly at start-up instead of being guessed at.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.templatetags.static import static

from sentinel import egress, logs, redis_keys, redis_urls
from sentinel.env import (  # noqa: F401
    DATA_DIR_DEFAULT,
    ENV_VARS,
    data_dir,
    envbool,
    envfloat,
    envint,
    envlist,
    envstr,
    envusd,
    read_env,
)

BASE_DIR = Path(__file__).resolve().parent.parent


# --- Where state lives -------------------------------------------------------------------------

envstr(
    "SENTINEL_DATA_DIR",
    DATA_DIR_DEFAULT,
    "Folder for the embedded servers' data and generated local secrets (relative to the project).",
)
DATA_DIR = data_dir()

# Importing settings starts nothing: the entry points (manage.py, sentinel.run, sentinel.web,
# sentinel.asgi, the Celery app) start the embedded servers first for whichever URL is unset
# (sentinel.embedded.ensure_environment). Left empty, settings still load (collectstatic needs
# neither store); anything that connects then fails with Django's or redis-py's error.
DATABASE_URL = envstr(
    "DATABASE_URL",
    "",
    "PostgreSQL (with pgvector) URL. Unset: an embedded PostgreSQL 18 under SENTINEL_DATA_DIR.",
)
REDIS_URL = envstr(
    "REDIS_URL",
    "",
    "Redis or Valkey URL; redis+cluster://host:port (rediss+cluster:// with TLS) names a Valkey/Redis Cluster by any "
    "of its nodes (docs/cluster.md). Unset: an embedded Valkey under SENTINEL_DATA_DIR.",
)
REDIS_TIMEOUT_MS = envint(
    "SENTINEL_REDIS_TIMEOUT_MS",
    100,
    "Longest a request waits for Redis (admission, cache, ledger hand-off); no answer by then: Redis counts as "
    "unreachable, each tenant's fail-open / fail-closed choice applies, and requests stop waiting on it until it "
    "answers again.",
)


def _local_secret(filename: str, nbytes: int = 48) -> str:
    """A random secret generated once and kept in the data folder (readable by its owner only)."""
    path = DATA_DIR / filename
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(nbytes))
    return path.read_text().strip()


SECRET_KEY = envstr(
    "SENTINEL_SECRET_KEY", "", "Django secret key. Unset: generated once into SENTINEL_DATA_DIR."
) or _local_secret("secret_key")
ENCRYPTION_KEY = (
    envstr(
        "SENTINEL_ENCRYPTION_KEY",
        "",
        "Key that encrypts provider API keys at rest (any string; keep it stable). Unset: derived from the secret key.",
    )
    or SECRET_KEY
)

DEBUG = envbool("SENTINEL_DEBUG", False, "Django debug mode. Never on in production.")
ALLOWED_HOSTS = envlist("SENTINEL_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]", "Comma-separated host names served.")
CSRF_TRUSTED_ORIGINS = envlist(
    "SENTINEL_CSRF_TRUSTED_ORIGINS", "", "Comma-separated origins trusted for console forms."
)

# --- HTTPS -------------------------------------------------------------------------------------

# Behind a TLS-terminating proxy, Django learns a request came over HTTPS from the scheme uvicorn
# sets: uvicorn takes X-Forwarded-Proto (and X-Forwarded-For) only from the proxies listed in
# FORWARDED_ALLOW_IPS. SECURE_PROXY_SSL_HEADER would take the header from any client that reaches
# the web process directly, so it stays unset.
HTTPS = envbool(
    "SENTINEL_HTTPS",
    False,
    "Sentinel is reached over HTTPS (through a proxy listed in FORWARDED_ALLOW_IPS that sends "
    "X-Forwarded-Proto): Secure cookies, HSTS, and plain-HTTP console pages redirected to HTTPS.",
)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]  # Prometheus scrapes each replica over the internal network
HSTS_SECONDS = envint(
    "SENTINEL_HSTS_SECONDS",
    365 * 24 * 3600,
    "With SENTINEL_HTTPS: how long browsers keep to HTTPS for this host and its subdomains (HSTS max-age).",
)
SECURE_HSTS_SECONDS = HSTS_SECONDS if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS

# --- Django ------------------------------------------------------------------------------------

INSTALLED_APPS = [
    # Unfold (the console's theme) before the admin: its templates and widgets take precedence.
    "unfold.apps.BasicAppConfig",  # templates and widgets only: the site stays ConsoleSite
    "unfold.contrib.filters",  # its text filter's template (the request log's user)
    "sentinel.console.apps.ConsoleAdminConfig",  # Django's admin, on the console's own site (dashboard, circuits)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp_webauthn",
    "mozilla_django_oidc",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "django_prometheus",
    "channels",
    "tenants",
    "gateway",
    "gateway.screening",
    "billing",
    "sentinel.console",
    "sentinel",
]

# The console's stack. The OpenAI-compatible API (/v1) is served without it: see sentinel/asgi.py.
MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "sentinel.middleware.RefuseMalformedInput",  # before anything reads the database with it
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",  # request.user.is_verified(): signed in with a one-time code
    "sentinel.console.audit.AuditContextMiddleware",  # who and from where, for the audit log
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "sentinel.urls"
ASGI_APPLICATION = "sentinel.asgi.application"

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
            ]
        },
    }
]

# No URL (settings read without storage, e.g. collectstatic): a database with no name, which Django
# refuses to connect to with its own "improperly configured" error.
_db = dj_database_url.parse(DATABASE_URL or "postgres://")
_db["ENGINE"] = "django_prometheus.db.backends.postgresql"  # Django's, plus query counts and timings
_db["CONN_MAX_AGE"] = 0  # the pool below keeps connections; Django's own reuse must stay off
_db.setdefault("OPTIONS", {})["pool"] = {
    "min_size": 1,
    "max_size": envint("SENTINEL_DB_POOL_SIZE", 10, "Database connections per process, at most."),
    "timeout": 10,
}
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# On a cluster (REDIS_URL redis+cluster://...), Django's cache and Channels get what works there
# (sentinel.redis_urls; docs/cluster.md).
CACHES = redis_urls.caches(REDIS_URL, redis_keys.DJANGO_CACHE_PREFIX)
CHANNEL_LAYERS = redis_urls.channel_layers(REDIS_URL, redis_keys.CHANNELS_PREFIX)

# Every sign-in with a password (console login, HTTP Basic on the API) passes the brute-force guard.
AUTHENTICATION_BACKENDS = ["sentinel.authentication.GuardedModelBackend"]

# --- Console governance: two-factor sign-in, single sign-on (docs/governance.md) --------------------

REQUIRE_TWO_FACTOR = envbool(
    "SENTINEL_REQUIRE_TWO_FACTOR",
    False,
    "Every console account that signs in with a password must also give a second factor (a one-time code or a "
    "security key); "
    "tenants can require it of their own members alone.",
)
OTP_TOTP_ISSUER = "Sentinel"


def _webauthn_origin() -> str:
    """Where browsers open the console, from SENTINEL_WEBAUTHN_ORIGIN or else the installation's own
    host settings: https://<first host name in SENTINEL_ALLOWED_HOSTS> behind SENTINEL_HTTPS, otherwise
    http://<that name>:<SENTINEL_PORT> (http://localhost:8000 by default). Never the request's Host."""
    origin = envstr(
        "SENTINEL_WEBAUTHN_ORIGIN",
        "",
        "The console's origin as browsers reach it (scheme://host[:port]): security keys and passkeys are bound "
        "to its host name (the WebAuthn relying party). Unset: https://<first host name in SENTINEL_ALLOWED_HOSTS> "
        "with SENTINEL_HTTPS, else http://<that name>:<SENTINEL_PORT>.",
    )
    if not origin:
        names = [host for host in ALLOWED_HOSTS if _is_host_name(host)]
        name = names[0] if names else "localhost"
        port = envint("SENTINEL_PORT", 8000, "Port of the gateway (API, console, websockets) under `make run`.")
        origin = f"https://{name}" if HTTPS else f"http://{name}:{port}"
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not _is_host_name(parts.hostname or "") or parts.path not in ("", "/"):
        raise ValueError(f"SENTINEL_WEBAUTHN_ORIGIN must be scheme://host[:port] with a host name, not {origin!r}")
    return f"{parts.scheme}://{parts.netloc}"


def _is_host_name(host: str) -> bool:
    """A DNS name a WebAuthn relying party can be (not an IP address, not an ALLOWED_HOSTS pattern)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return bool(host) and not host.startswith(".") and "*" not in host
    return False


# Security keys and passkeys (django-otp-webauthn): a second factor after the password, never a
# sign-in alone (sentinel.console.securitykeys).
WEBAUTHN_ORIGIN = _webauthn_origin()
OTP_WEBAUTHN_RP_ID = urlsplit(WEBAUTHN_ORIGIN).hostname
OTP_WEBAUTHN_RP_NAME = "Sentinel console"
OTP_WEBAUTHN_ALLOWED_ORIGINS = [WEBAUTHN_ORIGIN]
OTP_WEBAUTHN_ALLOW_PASSWORDLESS_LOGIN = False
PASSWORD_SIGN_IN = envstr(
    "SENTINEL_PASSWORD_SIGN_IN",
    "all",
    "Who may sign in with a local password (console and the management API's HTTP Basic): all; operators "
    "(superusers alone, a way in while the single sign-on provider is down); none (single sign-on only).",
)
if PASSWORD_SIGN_IN not in ("all", "operators", "none"):
    raise ValueError(f"SENTINEL_PASSWORD_SIGN_IN must be all, operators or none, not {PASSWORD_SIGN_IN!r}")
OIDC_ISSUER = envstr(
    "SENTINEL_OIDC_ISSUER",
    "",
    "Single sign-on to the console: the OpenID Connect provider's issuer URL (its endpoints are read from "
    "<issuer>/.well-known/openid-configuration). Unset: no single sign-on.",
)
OIDC_RP_CLIENT_ID = envstr("SENTINEL_OIDC_CLIENT_ID", "", "Single sign-on: Sentinel's client id at the provider.")
OIDC_RP_CLIENT_SECRET = envstr(
    "SENTINEL_OIDC_CLIENT_SECRET", "", "Single sign-on: Sentinel's client secret at the provider."
)
OIDC_PROVIDER_NAME = envstr(
    "SENTINEL_OIDC_PROVIDER_NAME", "single sign-on", "Single sign-on: the provider's name on the sign-in page."
)
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_RP_SCOPES = "openid email profile groups"
OIDC_USE_PKCE = True
OIDC_TIMEOUT = 10
OIDC_CALLBACK_CLASS = "sentinel.console.sso.SignOnCallbackView"
OIDC_AUTHENTICATE_CLASS = "sentinel.console.sso.SignOnRequestView"
LOGIN_REDIRECT_URL_FAILURE = "/admin/login/?sso=failed"
# The provider's endpoints come from its discovery document (sentinel.console.sso); these are set
# there, never by hand.
OIDC_OP_AUTHORIZATION_ENDPOINT = OIDC_OP_TOKEN_ENDPOINT = OIDC_OP_USER_ENDPOINT = OIDC_OP_JWKS_ENDPOINT = ""
AUTHENTICATION_BACKENDS.append("sentinel.console.sso.SignOnBackend")  # answers only the provider's callback
# Unfold's sign-in form posts no `next` field (Django's did): a sign-in lands on the console, not /accounts/profile/.
LOGIN_REDIRECT_URL = "admin:index"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# The console's look (django-unfold): a sidebar built per request from what the user may open
# (sentinel.console.navigation), light and dark themes, the console's own styles on every page.
UNFOLD = {
    "SITE_TITLE": "Sentinel console",
    "SITE_HEADER": "Sentinel",
    "SITE_SUBHEADER": "LLM gateway console",
    "SITE_SYMBOL": "shield",
    "SITE_URL": "/admin/",
    "SHOW_VIEW_ON_SITE": False,
    "STYLES": [lambda request: static("console/console.css")],
    "SIDEBAR": {
        "show_search": False,
        "show_all_applications": False,
        "navigation": "sentinel.console.navigation.sidebar",
    },
}

REST_FRAMEWORK = {
    # Basic first: a request without credentials gets 401 with a WWW-Authenticate challenge (with
    # the session first it would be a bare 403). Session logins (the console) work either way.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "sentinel.authentication.GuardedBasicAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Sentinel API",
    "DESCRIPTION": (
        "The OpenAI-compatible gateway API (authenticated with a virtual key) and the management API "
        "(authenticated with a console session)."
    ),
    "VERSION": "1",
    "OAS_VERSION": "3.1.0",  # JSON Schema 2020-12, which the gateway's pydantic schemas are written in
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI and Redoc are served from this server's static files, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The gateway's endpoints are plain async Django views: gateway.openapi documents them.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gateway.openapi.add_gateway_endpoints",
    ],
}

RATELIMIT_USE_CACHE = "default"
LOGIN_RATE_PER_USER = envstr(
    "SENTINEL_LOGIN_RATE_PER_USER",
    "5/m",
    "Failed sign-ins (console login, API Basic) allowed per account name from one client address "
    "(django-ratelimit rate).",
)
LOGIN_RATE_PER_IP = envstr(
    "SENTINEL_LOGIN_RATE_PER_IP",
    "30/m",
    "Failed sign-ins (console login, API Basic) allowed per client address, whatever the account "
    "(django-ratelimit rate).",
)

# --- Celery ------------------------------------------------------------------------------------

CELERY_BROKER_URL = envstr(
    "SENTINEL_BROKER_URL",
    "",
    "Celery's broker (a single Redis or Valkey). Unset: REDIS_URL. Required when REDIS_URL names a "
    "cluster: Celery has no cluster transport (docs/cluster.md).",
) or (REDIS_URL if not redis_urls.is_cluster_url(REDIS_URL) else "")
if not CELERY_BROKER_URL and REDIS_URL:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        "REDIS_URL names a Valkey/Redis Cluster: set SENTINEL_BROKER_URL to a single Redis or Valkey for "
        "Celery's queue (docs/cluster.md)."
    )
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Batch slices run for many seconds: a worker takes one message at a time, so others go to idle workers.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
LOAD_SAMPLE_SECONDS = envfloat(
    "SENTINEL_LOAD_SAMPLE_SECONDS",
    2.0,
    "How often beat has self-hosted deployments' load read from their metrics (docs/routing.md).",
)
AUDIT_RETENTION_DAYS = envint(
    "SENTINEL_AUDIT_RETENTION_DAYS",
    0,
    "How long the console's audit log keeps an entry, in days (at least 30; the database refuses deleting "
    "younger ones); 0 keeps every entry.",
)
if AUDIT_RETENTION_DAYS and AUDIT_RETENTION_DAYS < 30:
    raise ValueError(f"SENTINEL_AUDIT_RETENTION_DAYS must be 0 or at least 30, not {AUDIT_RETENTION_DAYS}")
RESPONSES_RETENTION_DAYS = envint(
    "SENTINEL_RESPONSES_RETENTION_DAYS",
    30,
    "How long a stored response (POST /v1/responses without store: false) can be read back and continued, "
    "in days, as OpenAI keeps them; 0 keeps them forever.",
)
CELERY_BEAT_SCHEDULE = {
    "prune-responses": {
        "task": "gateway.tasks.prune_responses",
        "schedule": 3_600.0,
        "options": {"expires": 600},
    },
    "prune-audit-log": {"task": "tenants.tasks.prune_audit_log", "schedule": 86_400.0, "options": {"expires": 3_600}},
    "prune-cache": {"task": "gateway.tasks.prune_cache", "schedule": 300.0, "options": {"expires": 240}},
    "drain-ledger": {
        "task": "billing.tasks.drain_ledger",
        "schedule": envfloat(
            "SENTINEL_LEDGER_DRAIN_SECONDS", 1.0, "How often workers move queued ledger records to Postgres."
        ),
        "options": {"expires": 10},
    },
    "sweep-batches": {
        "task": "gateway.batches.tasks.sweep_batches",
        "schedule": envfloat(
            "SENTINEL_BATCH_SWEEP_SECONDS",
            15.0,
            "How often beat looks for batch work nobody is doing (a dead worker's), expiries and cancellations.",
        ),
        "options": {"expires": 60},
    },
    # The ledger's monthly partitions, made months ahead (billing/partitions.py); at start, then daily.
    "ledger-partitions": {
        "task": "billing.tasks.ensure_ledger_partitions",
        "schedule": 86_400.0,
        "options": {"expires": 3_600},
    },
    "roll-up-spend": {
        "task": "billing.tasks.roll_up_spend",
        "schedule": envfloat(
            "SENTINEL_ROLLUP_SECONDS", 60.0, "How often beat folds new ledger rows into the daily spend rollups."
        ),
        "options": {"expires": 300},
    },
    "index-cache-partitions": {
        "task": "gateway.tasks.index_cache_partitions",
        "schedule": envfloat(
            "SENTINEL_CACHE_PARTITION_INDEX_SECONDS",
            120.0,
            "How often beat gives large semantic-cache partitions their own HNSW index (and drops shrunk ones').",
        ),
        "options": {"expires": 600},
    },
    "index-knowledge-stores": {
        "task": "gateway.tasks.index_knowledge_stores",
        "schedule": envfloat(
            "SENTINEL_KNOWLEDGE_INDEX_SECONDS",
            300.0,
            "How often beat gives large vector stores their own HNSW index (and drops shrunk ones').",
        ),
        "options": {"expires": 600},
    },
    "sample-deployment-load": {
        "task": "gateway.tasks.sample_deployment_load",
        "schedule": LOAD_SAMPLE_SECONDS,
        "options": {"expires": LOAD_SAMPLE_SECONDS},
    },
    "publish-live-console": {
        "task": "sentinel.console.tasks.publish_live",
        "schedule": envfloat(
            "SENTINEL_LIVE_SECONDS", 2.0, "How often the console's live dashboards get each active tenant's figures."
        ),
        "options": {"expires": 10},
    },
}
# A record a worker read but did not acknowledge within this time (the worker died, or its batch is
# stuck) is taken over by another worker. Inserting it twice is harmless (idempotent on its id).
LEDGER_CLAIM_IDLE_MS = envint(
    "SENTINEL_LEDGER_CLAIM_IDLE_MS",
    30_000,
    "Milliseconds before another worker takes over ledger records a worker read but never acknowledged.",
)

# --- Gateway -----------------------------------------------------------------------------------

MAX_BODY_BYTES = envint("SENTINEL_MAX_BODY_BYTES", 4 * 1024 * 1024, "Largest accepted API request body; above: 413.")
MAX_HEADER_BYTES = envint(
    "SENTINEL_MAX_HEADER_BYTES",
    32 * 1024,
    "Largest request head (request line and headers) the web server reads; above: 431.",
)
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_BODY_BYTES
KEY_CACHE_SECONDS = envfloat(
    "SENTINEL_KEY_CACHE_SECONDS",
    30.0,
    "How long a process keeps a virtual key's settings in memory. Revocation does not wait for "
    "it: every request checks the key's status in Redis.",
)
KEY_ROTATION_GRACE_SECONDS = envint(
    "SENTINEL_KEY_ROTATION_GRACE_SECONDS",
    86_400,
    "How long a rotated key keeps working beside its successor, so apps can switch.",
)
RATE_WINDOW_SECONDS = envint(
    "SENTINEL_RATE_WINDOW_SECONDS",
    60,
    "Length of the sliding window of request and token rate limits (their limits are per window).",
)
CHAIN_DEADLINE_SECONDS = envfloat(
    "SENTINEL_CHAIN_DEADLINE_SECONDS",
    120.0,
    "Upper bound on one request's time across all retries and fallbacks.",
)
CACHE_LOOKUP_TIMEOUT_MS = envint(
    "SENTINEL_CACHE_LOOKUP_TIMEOUT_MS",
    500,
    "Longest the semantic cache may spend (embedding, then search); slower: the request goes upstream.",
)
CACHE_COALESCE_MS = envint(
    "SENTINEL_CACHE_COALESCE_MS",
    30_000,
    "Longest a request waits for the answer to an identical one already asked of the provider (exact cache "
    "tier), instead of asking too; then it asks. 0: identical requests in flight each ask the provider.",
)
CACHE_DATABASE_URL = envstr(
    "SENTINEL_CACHE_DATABASE_URL",
    "",
    "PostgreSQL (pgvector) for the semantic cache's vectors, if not the main database. Unset: DATABASE_URL.",
)
CACHE_COLD_AFTER = envint(
    "SENTINEL_CACHE_COLD_AFTER",
    256,
    "Answers stored in a semantic-cache partition with no hit from either tier, after which the partition is cold: "
    "only one lookup in SENTINEL_CACHE_COLD_PROBE embeds its prompt and searches; a hit warms it again. 0: never.",
)
CACHE_COLD_PROBE = envint(
    "SENTINEL_CACHE_COLD_PROBE",
    16,
    "In a cold semantic-cache partition, one lookup in this many still searches (twice as few from 4 times "
    "SENTINEL_CACHE_COLD_AFTER answers with no hit, four times as few from 16 times).",
)
EMBEDDER_THREADS = envint("SENTINEL_EMBEDDER_THREADS", 1, "onnxruntime threads per web process for prompt embeddings.")
INJECTION_SECOND_LOOK = envbool(
    "SENTINEL_INJECTION_SECOND_LOOK",
    True,
    "Look again, through the prompt embedding, at text the injection check's word model puts just under its threshold.",
)
CACHE_EF_SEARCH = envint(
    "SENTINEL_CACHE_EF_SEARCH", 100, "pgvector hnsw.ef_search for semantic lookups (recall versus speed)."
)
CACHE_PARTITION_INDEX_ROWS = envint(
    "SENTINEL_CACHE_PARTITION_INDEX_ROWS",
    500,
    "Entries from which a semantic-cache partition gets its own HNSW index; smaller ones are searched exactly.",
)
SHED_WAIT_MS = envint(
    "SENTINEL_SHED_WAIT_MS",
    250,
    "Longest an interactive request waits for a slot when every deployment of its chain is at its concurrency "
    "limit; then 503 overloaded.",
)

# --- Batches -----------------------------------------------------------------------------------

BATCH_MAX_FILE_BYTES = envint(
    "SENTINEL_BATCH_MAX_FILE_BYTES",
    50 * 1024 * 1024,
    "Largest file /v1/files accepts (batch input files and documents for vector stores).",
)
KNOWLEDGE_QUOTA_BYTES = envint(
    "SENTINEL_KNOWLEDGE_QUOTA_BYTES",
    1024 * 1024 * 1024,
    "Each tenant's storage for vector stores: the bytes of the distinct files in its stores (docs/knowledge.md).",
)
KNOWLEDGE_USD_PER_THOUSAND_SEARCHES = envusd(
    "SENTINEL_KNOWLEDGE_USD_PER_THOUSAND_SEARCHES",
    "0",
    "What a search of the vector stores costs the tenant, per thousand (a grounded request or a /search call; "
    "in the ledger's retrieval_cost_usd and counted in cost_usd and budgets). OpenAI charges 2.50.",
)
KNOWLEDGE_INDEX_ROWS = envint(
    "SENTINEL_KNOWLEDGE_INDEX_ROWS",
    2_000,
    "Chunks from which a vector store gets its own HNSW index; smaller stores are searched exactly.",
)
BATCH_MAX_REQUESTS = envint("SENTINEL_BATCH_MAX_REQUESTS", 50_000, "Most requests (lines) one batch may hold.")
BATCH_LEASE_SECONDS = envfloat(
    "SENTINEL_BATCH_LEASE_SECONDS",
    60.0,
    "A worker's lease on the batch items it runs (renewed while they run); after it, another worker takes them.",
)
BATCH_CONCURRENCY = envint("SENTINEL_BATCH_CONCURRENCY", 8, "Batch items one worker runs at once.")
BATCH_RUNNERS = envint("SENTINEL_BATCH_RUNNERS", 2, "Workers that start on a new batch at once.")
BATCH_MAX_TRIES = envint(
    "SENTINEL_BATCH_MAX_TRIES", 5, "Runs of a batch item that failed in a way retrying can fix, before it fails."
)
BATCH_RETRY_SECONDS = envfloat(
    "SENTINEL_BATCH_RETRY_SECONDS", 10.0, "First backoff before a failed batch item runs again (then doubling)."
)

MOCK_PROVIDER_URL = envstr(
    "SENTINEL_MOCK_URL",
    "http://127.0.0.1:8100",
    "Where `make run` starts the mock provider; the demo deployments point here.",
)

LITELLM_LOCAL_MODEL_COST_MAP = envstr(
    "LITELLM_LOCAL_MODEL_COST_MAP",
    "True",
    "Keep litellm on its bundled price map (it would fetch one from the web otherwise).",
)
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = LITELLM_LOCAL_MODEL_COST_MAP
os.environ.setdefault("LITELLM_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# --- Egress ------------------------------------------------------------------------------------

# Tenant-set URLs (webhooks, guardrails) never reach internal addresses unless listed here (a bad
# entry fails at start-up). Provider API bases are the operators' own and are not limited.
EGRESS_ALLOW = egress.Allowlist.parse(
    envlist(
        "SENTINEL_EGRESS_ALLOW",
        "",
        "Comma-separated CIDRs and host names that tenant-set URLs (webhooks, guardrails) and self-hosted "
        "deployments' metrics URLs may reach although internal (see docs/egress.md).",
    )
)

# --- Logging -----------------------------------------------------------------------------------

LOG_LEVEL = envstr("SENTINEL_LOG_LEVEL", "INFO", "Log level of Sentinel's own loggers.")
LOGGING = logs.config(LOG_LEVEL)  # JSON lines on stdout, each with its request id: see sentinel/logs.py

# --- Metrics -----------------------------------------------------------------------------------

read_env(
    "PROMETHEUS_MULTIPROC_DIR",
    "",
    "Folder where web workers share metrics (prometheus_client reads it). `make run` and "
    "`python -m sentinel.web` set and clear it; set it yourself only to choose the folder.",
)
METRICS_KEY_LABELS = envbool(
    "SENTINEL_METRICS_KEY_LABELS",
    False,
    "Label token and cost metrics with the key's id too (one series per key: mind the cardinality).",
)
