"""The gateway's Prometheus metrics, served with django-prometheus's own at /metrics.

Each web worker writes its samples to files in PROMETHEUS_MULTIPROC_DIR (prometheus_client's
multiprocess mode, prepared by sentinel.web) and a scrape of any worker adds up all of them. The
variable must be set before prometheus_client is first imported in a process.

Labels are few and bounded: `model` is an alias an admin defined (empty when the request never got
that far, so a client cannot mint series with made-up names), `provider` and `deployment` are admin
rows, `status` and `code` come from Sentinel's fixed error codes (`code` is empty on success).
`tenant` appears on tokens and cost only; a `key` label (the key's id) only when
SENTINEL_METRICS_KEY_LABELS is on.

Recording, for the rest of the gateway:
    request_finished(record, ...)       the pipeline's finish(): latency, overhead, TTFT, counts, money
    request_refused(status, code)       a refusal before the key was known (never reaches finish)
    upstream_attempt(provider, code)    one call to a provider, "" for success or its error code
    breaker_state(deployment, state)    a breaker's state ("closed" | "half_open" | "open") as this
                                        process found it (the gauge only)
    breaker_transition(deployment, state)  a breaker entered a state: the gauge and a count
    admission_rejected(limit)           a request refused by one limit (a name from a fixed set:
                                        "requests_per_minute", "tokens_per_minute", "concurrency",
                                        "budget", ...)
"""

from __future__ import annotations

from django.conf import settings
from prometheus_client import Counter, Gauge, Histogram

from billing.ledger import LedgerRecord

# Seconds. Latency spans cache hits (milliseconds) to long generations; overhead is the gateway's
# own cost, which should stay around a millisecond.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

KEY_LABELS = settings.METRICS_KEY_LABELS
_money_labels = ("tenant", "model", "key") if KEY_LABELS else ("tenant", "model")

REQUEST_SECONDS = Histogram(
    "sentinel_request_duration_seconds",
    "Time from a chat completion request's arrival to its last byte (to the answer when not streamed).",
    ("model", "provider", "cache_tier"),
    buckets=LATENCY_BUCKETS,
)
TTFT_SECONDS = Histogram(
    "sentinel_time_to_first_token_seconds",
    "Time from a streamed request's arrival to its first token.",
    ("model", "provider", "cache_tier"),
    buckets=TTFT_BUCKETS,
)
OVERHEAD_SECONDS = Histogram(
    "sentinel_gateway_overhead_seconds",
    "Time the gateway added: until the answer (or, streamed, the first token) minus the time spent "
    "waiting on providers.",
    ("model", "provider", "cache_tier"),
    buckets=OVERHEAD_BUCKETS,
)
REQUESTS = Counter(
    "sentinel_requests",
    "Chat completion requests by outcome (code is empty on success).",
    ("model", "provider", "status", "code"),
)
UPSTREAM_ATTEMPTS = Counter(
    "sentinel_upstream_attempts",
    "Calls to providers, fallbacks included, by outcome (code is empty on success).",
    ("provider", "code"),
)
TOKENS = Counter(
    "sentinel_tokens",
    "Tokens billed, by tenant, model and type (prompt or completion).",
    (*_money_labels, "type"),
)
COST = Counter("sentinel_cost_usd", "Cost billed in USD.", _money_labels)
SAVED = Counter("sentinel_saved_cost_usd", "Provider cost the cache saved, in USD.", _money_labels)
CACHE = Counter(
    "sentinel_cache_requests",
    "Answered requests (status 200) by cache tier: hit-exact, hit-semantic, miss or bypass.",
    ("tier",),
)
BREAKER_STATE = Gauge(
    "sentinel_breaker_state",
    "Circuit breaker state per deployment: 0 closed, 1 half-open, 2 open.",
    ("deployment",),
    multiprocess_mode="mostrecent",  # the breaker lives in Redis; the latest word of any worker counts
)
BREAKER_TRANSITIONS = Counter(
    "sentinel_breaker_transitions",
    "Circuit breaker state changes per deployment, by the state entered.",
    ("deployment", "state"),
)
ADMISSION_REJECTIONS = Counter(
    "sentinel_admission_rejections",
    "Requests refused by admission control, by the limit that refused them.",
    ("limit",),
)

BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}

# Exported metric names (as a scrape shows them), for alert rules and tests to check against.
EXPORTED = (REQUEST_SECONDS, TTFT_SECONDS, OVERHEAD_SECONDS, REQUESTS, UPSTREAM_ATTEMPTS, TOKENS, COST, SAVED)
EXPORTED += (CACHE, BREAKER_STATE, BREAKER_TRANSITIONS, ADMISSION_REJECTIONS)


def exported_names() -> set[str]:
    names = set()
    for metric in EXPORTED:
        name = metric._name
        if metric._type == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        elif metric._type == "counter":
            names |= {f"{name}_total", f"{name}_created"}
        else:
            names.add(name)
    return names


_children: dict[tuple, object] = {}


def _child(metric, *labels):
    """metric.labels(*labels), remembered: labels() converts and locks on every call, and a request
    records about ten samples (label sets are bounded, so this dict is too)."""
    key = (metric, labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def request_finished(record: LedgerRecord, *, tenant: str, elapsed_seconds: float, upstream_seconds: float) -> None:
    """Everything the end of one authenticated request tells: called once per request."""
    served = record.status_code < 400 or bool(record.provider)
    model = record.model_requested if served else ""
    provider = record.provider
    tier = record.cache_tier
    status = record.status_code
    _child(REQUESTS, model, provider, status, record.error_code).inc()
    _child(REQUEST_SECONDS, model, provider, tier).observe(elapsed_seconds)
    if record.ttft_ms is not None:
        until_answer = record.ttft_ms / 1000
        _child(TTFT_SECONDS, model, provider, tier).observe(until_answer)
    else:
        until_answer = elapsed_seconds
    _child(OVERHEAD_SECONDS, model, provider, tier).observe(max(until_answer - upstream_seconds, 0.0))
    if status == 200:
        _child(CACHE, tier).inc()
    money = (tenant, model, str(record.key_id)) if KEY_LABELS else (tenant, model)
    if record.prompt_tokens:
        _child(TOKENS, *money, "prompt").inc(record.prompt_tokens)
    if record.completion_tokens:
        _child(TOKENS, *money, "completion").inc(record.completion_tokens)
    # Floats are fine here: metrics show trends; the ledger's Decimals are the money of record.
    cost = float(record.cost_usd)
    if cost:
        _child(COST, *money).inc(cost)
    saved = float(record.saved_cost_usd)
    if saved:
        _child(SAVED, *money).inc(saved)


def request_refused(status: int, code: str) -> None:
    _child(REQUESTS, "", "", status, code).inc()


def upstream_attempt(provider: str, code: str) -> None:
    _child(UPSTREAM_ATTEMPTS, provider, code).inc()


def breaker_state(deployment: str, state: str) -> None:
    """The state a process found a breaker in (e.g. read from Redis): the gauge only."""
    _child(BREAKER_STATE, deployment).set(BREAKER_STATES[state])


def breaker_transition(deployment: str, state: str) -> None:
    """A breaker entered `state` (call it once, where the transition is made): gauge and count."""
    _child(BREAKER_STATE, deployment).set(BREAKER_STATES[state])
    _child(BREAKER_TRANSITIONS, deployment, state).inc()


def admission_rejected(limit: str) -> None:
    _child(ADMISSION_REJECTIONS, limit).inc()
