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
    breaker_transition(deployment, state)  a breaker entered a state (breakers.breaker_transition)
    admission_rejected(limit)           a request refused by one limit: a RateLimit policy name
                                        (key-rpm, tenant-tpm, model-concurrency, ...), key-budget,
                                        tenant-budget, or local (counted while Redis is unreachable)
    screening_decision(tenant, check, direction, action)  a screening check fired (gateway.screening)
    screening_outage(tenant, check, direction, outcome)   a screening service gave no answer
    guardrail_call(outcome, seconds)    one call to a tenant's HTTP guardrail

Breaker states are not recorded but read from Redis when /metrics is scraped (breakers.BreakerStates): the
breakers live there, and a process that saw a breaker open must not keep saying so after another
closed it. The ledger's queue and its dead letters are read the same way (LedgerState): Celery
workers drain the ledger, and no scrape reaches them.
"""

from __future__ import annotations

import os

from django.conf import settings
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

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
ENDPOINT_REQUESTS = Counter(
    "sentinel_endpoint_requests",
    "Requests to the hot API endpoints (chat_completions, embeddings, images_generations, images_edits, "
    "images_variations, responses, messages, "
    "messages_count_tokens, models) by the status answered (a stream counts when it starts).",
    ("endpoint", "status"),
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
CACHE_FAILURES = Counter(
    "sentinel_cache_failures",
    "Cache lookups and stores that failed open (an error, or a lookup slower than its bound): the request "
    "went upstream, or the answer was not kept. By stage: lookup or store.",
    ("stage",),
)
CACHE_SEMANTIC = Counter(
    "sentinel_cache_semantic_lookups",
    "Semantic-tier lookups after an exact miss: searched (by the static first stage; MiniLM runs only "
    "where a hit is possible: sentinel_cache_embedded_prompts); skipped_empty, the partition held no entry "
    "(nothing to find, so the prompt was neither embedded nor searched); skipped_cold, the partition is "
    "cold (SENTINEL_CACHE_COLD_AFTER answers stored there with no hit; one lookup in "
    "SENTINEL_CACHE_COLD_PROBE still searches).",
    ("outcome",),
)
CACHE_COALESCED = Counter(
    "sentinel_cache_coalesced_waits",
    "Requests that found an identical request asking the provider and waited for its answer instead of asking "
    "too, by how the wait ended: served (its answer, from the exact tier), released (it ended without an answer "
    "to store; this one asked the provider) or timeout (SENTINEL_CACHE_COALESCE_MS).",
    ("outcome",),
)
CACHE_EMBEDDED = Counter(
    "sentinel_cache_embedded_prompts",
    "Prompts MiniLM embedded for the semantic tier: query (a lookup that found an entry the verifier could "
    "accept) or deferred (such an entry, stored without MiniLM's vector, embedded beside it).",
    ("kind",),
)
CACHE_EMBED_RUNS = Counter(
    "sentinel_cache_embed_runs",
    "Runs of the embedding model for the semantic tier: prompts embedded over runs is the mean batch "
    "(each run embeds every prompt waiting, up to 8).",
)
BREAKER_TRANSITIONS = Counter(
    "sentinel_breaker_transitions",
    "Circuit breaker state changes per deployment, by the state entered.",
    ("deployment", "state"),
)
SATURATION_TRANSITIONS = Counter(
    "sentinel_saturation_transitions",
    "Self-hosted deployments becoming saturated or recovering, by the state entered.",
    ("deployment", "state"),
)
ADMISSION_REJECTIONS = Counter(
    "sentinel_admission_rejections",
    "Requests refused by admission control, by the limit that refused them.",
    ("limit",),
)

SCREENING_DECISIONS = Counter(
    "sentinel_screening_decisions",
    "Screening checks that fired, by tenant, check, direction (in, out) and what was done (log, redact, block).",
    ("tenant", "check", "direction", "action"),
)
SCREENING_OUTAGES = Counter(
    "sentinel_screening_outages",
    "Screening services (moderation provider, guardrail) that gave no answer, by what followed: open "
    "(let through) or closed (refused or withheld).",
    ("tenant", "check", "direction", "outcome"),
)
GUARDRAIL_SECONDS = Histogram(
    "sentinel_guardrail_duration_seconds",
    "Calls to tenants' HTTP guardrails, by outcome (ok, timeout, status, error, malformed, refused).",
    ("outcome",),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


class LedgerState(Collector):
    """The ledger queue's length and the age of its oldest record (Redis), and the records ever set
    aside as dead letters by kind (Postgres, sentinel_ledger_dead_letters_total: a counter, since
    dead letters are never deleted)."""

    NAMES = (
        "sentinel_ledger_queued_records",
        "sentinel_ledger_oldest_record_age_seconds",
        "sentinel_ledger_dead_letters_total",
    )

    def describe(self):
        return []

    def collect(self):
        import redis
        from django.db import DatabaseError

        from billing.ledger import backlog
        from billing.selectors import dead_letter_counts

        families = []
        try:
            queued, oldest_age = backlog()
        except redis.RedisError:
            pass  # no word from Redis is no figure, not "empty"
        else:
            families.append(
                GaugeMetricFamily(
                    "sentinel_ledger_queued_records",
                    "Ledger records handed off and not yet in Postgres (nor set aside as dead letters).",
                    value=queued,
                )
            )
            families.append(
                GaugeMetricFamily(
                    "sentinel_ledger_oldest_record_age_seconds",
                    "Seconds since the oldest queued ledger record was handed off (0 when none is queued).",
                    value=oldest_age,
                )
            )
        try:
            counts = dead_letter_counts()
        except DatabaseError:
            return families
        dead = CounterMetricFamily(
            "sentinel_ledger_dead_letters",
            "Ledger records the database refused (or that were no ledger record), set aside as dead letters "
            "instead of billed, by reason: undecodable, value, constraint or other.",
            labels=("reason",),
        )
        for kind, count in counts.items():
            dead.add_metric([kind], count)
        return [*families, dead]


# Exported metric names (as a scrape shows them), for alert rules and tests to check against.
EXPORTED = (
    REQUEST_SECONDS,
    TTFT_SECONDS,
    OVERHEAD_SECONDS,
    REQUESTS,
    ENDPOINT_REQUESTS,
    UPSTREAM_ATTEMPTS,
    TOKENS,
    COST,
    SAVED,
)
EXPORTED += (
    CACHE,
    CACHE_FAILURES,
    CACHE_SEMANTIC,
    CACHE_COALESCED,
    CACHE_EMBEDDED,
    CACHE_EMBED_RUNS,
    BREAKER_TRANSITIONS,
    SATURATION_TRANSITIONS,
    ADMISSION_REJECTIONS,
    SCREENING_DECISIONS,
    SCREENING_OUTAGES,
    GUARDRAIL_SECONDS,
)


LEDGER_REGISTRY = CollectorRegistry(auto_describe=False)
LEDGER_REGISTRY.register(LedgerState())


def exposition(*read_at_scrape: CollectorRegistry) -> bytes:
    """What /metrics serves: every worker's samples (django-prometheus's and the gateway's; one
    process's own when not in multiprocess mode), the registries given (the breaker states:
    gateway.upstream.breakers.STATE_REGISTRY, read from Redis by their owner; the tenants' false hits,
    gateway.cache.shadow.STATE_REGISTRY) and the ledger's state."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    scraped = b"".join(generate_latest(extra) for extra in read_at_scrape)
    return generate_latest(registry) + scraped + generate_latest(LEDGER_REGISTRY)


def exported_names() -> set[str]:
    # Read at scrape by their owners: the breakers' states, deployments' load, the tenants' measured false hits.
    names = {"sentinel_breaker_state", "sentinel_deployment_load", "sentinel_deployment_saturated", *LedgerState.NAMES}
    names |= {"sentinel_cache_false_hit_rate", "sentinel_cache_shadow_checks_total"}
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


def request_finished(
    record: LedgerRecord,
    *,
    tenant: str,
    elapsed_seconds: float,
    upstream_seconds: float,
) -> None:
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


def endpoint_request(endpoint: str, status: int) -> None:
    """A request to one of the hot API endpoints was answered (gateway.http)."""
    _child(ENDPOINT_REQUESTS, endpoint, status).inc()


def upstream_attempt(provider: str, code: str) -> None:
    _child(UPSTREAM_ATTEMPTS, provider, code).inc()


def breaker_transition(deployment: str, state: str) -> None:
    """A breaker entered `state` (closed, open, half_open, forced_open, forced_closed)."""
    _child(BREAKER_TRANSITIONS, deployment, state).inc()


def saturation_transition(deployment: str, saturated: bool) -> None:
    _child(SATURATION_TRANSITIONS, deployment, "saturated" if saturated else "recovered").inc()


def cache_failure(stage: str) -> None:
    _child(CACHE_FAILURES, stage).inc()


def cache_coalesced(outcome: str) -> None:
    _child(CACHE_COALESCED, outcome).inc()


def cache_semantic(outcome: str) -> None:
    _child(CACHE_SEMANTIC, outcome).inc()


def cache_embedded(kind: str, count: int = 1) -> None:
    _child(CACHE_EMBEDDED, kind).inc(count)


def cache_embed_run() -> None:
    CACHE_EMBED_RUNS.inc()


def admission_rejected(limit: str) -> None:
    _child(ADMISSION_REJECTIONS, limit).inc()


def screening_decision(tenant: str, check: str, direction: str, action: str) -> None:
    _child(SCREENING_DECISIONS, tenant, check, direction, action).inc()


def screening_outage(tenant: str, check: str, direction: str, outcome: str) -> None:
    _child(SCREENING_OUTAGES, tenant, check, direction, outcome).inc()


def guardrail_call(outcome: str, seconds: float) -> None:
    _child(GUARDRAIL_SECONDS, outcome).observe(seconds)
