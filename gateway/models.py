"""Where requests go: providers, their deployments, and the model names clients ask for."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from pgvector.django import VectorField

from sentinel.crypto import decrypt, encrypt


class Provider(models.Model):
    """An upstream account: a litellm provider kind, where it lives and how to authenticate."""

    name = models.SlugField(max_length=80, unique=True)
    kind = models.CharField(
        max_length=60,
        default="openai",
        help_text="litellm provider (openai, anthropic, azure, bedrock, vertex_ai, ...).",
    )
    api_base = models.URLField(max_length=500, blank=True)
    api_key_encrypted = models.BinaryField(blank=True, default=b"", editable=False)
    api_key_env = models.CharField(
        max_length=120,
        blank=True,
        help_text="Name of an environment variable holding the API key (instead of storing it).",
    )
    max_retries = models.PositiveSmallIntegerField(
        default=1,
        help_text="Retries on the same deployment (429, 5xx, connection errors) before failing over. "
        "Timeouts fail over at once.",
    )
    timeout_seconds = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0.1)],
        help_text="Per attempt: a call that takes longer is abandoned and retried or failed over.",
    )
    first_token_timeout_seconds = models.FloatField(
        default=20.0,
        validators=[MinValueValidator(0.1)],
        help_text="Streaming: longest wait for the first token before failing over.",
    )

    class Transport(models.TextChoices):
        AUTO = "auto", "Fast path when the provider answers in OpenAI's format"
        LITELLM = "litellm", "Always litellm.acompletion"

    transport = models.CharField(
        max_length=16,
        choices=Transport.choices,
        default=Transport.AUTO,
        help_text="Both honor the same contract; the fast path relays OpenAI-format answers unparsed.",
    )
    litellm_params = models.JSONField(
        default=dict, blank=True, help_text="Extra litellm arguments (api_version, region, ...)."
    )
    daily_spend_cap_usd = models.DecimalField(
        max_digits=14,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="Spend per UTC day at this provider; once reached, its deployments are skipped (traffic moves "
        "to the next deployment in each chain) until the day ends. Empty: no cap.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def set_api_key(self, secret: str) -> None:
        self.api_key_encrypted = encrypt("provider-keys", secret)

    def api_key(self) -> str | None:
        """The key to call the provider with: the stored one, else the named variable's value."""
        if self.api_key_encrypted:
            return decrypt("provider-keys", self.api_key_encrypted)
        if self.api_key_env:
            return os.environ.get(self.api_key_env)
        return None

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key_encrypted) or bool(self.api_key_env)


class BreakerPolicy(models.Model):
    """How a deployment's circuit breaker judges it (Resilience4j-like). Deployments without one use
    the built-in default (gateway.upstream.breakers.DEFAULT_POLICY)."""

    name = models.CharField(max_length=60, unique=True)
    window_seconds = models.PositiveIntegerField(default=60, help_text="Sliding window of recent calls.")
    minimum_calls = models.PositiveIntegerField(default=20, help_text="Calls in the window before it can open.")
    failure_rate_percent = models.PositiveSmallIntegerField(default=50)
    slow_call_seconds = models.FloatField(
        default=20.0, help_text="A call slower than this is slow (streams: time to the first token)."
    )
    slow_rate_percent = models.PositiveSmallIntegerField(default=80)
    open_seconds = models.FloatField(default=30.0, help_text="Open time; doubles with each repeated opening.")
    max_open_seconds = models.FloatField(default=600.0)
    half_open_probes = models.PositiveSmallIntegerField(
        default=3, help_text="Calls let through while half-open; all must succeed to close."
    )

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "breaker policies"

    def __str__(self) -> str:
        return self.name


def _price_override(help_text: str) -> models.DecimalField:
    return models.DecimalField(
        max_digits=20,
        decimal_places=15,
        null=True,
        blank=True,
        help_text=help_text + " Empty: the fallback in docs/billing.md (its input or output override, else the table).",
    )


class Deployment(models.Model):
    """One model at one provider, as litellm names it (e.g. `openai/gpt-4o-mini`)."""

    name = models.SlugField(max_length=120, unique=True)
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="deployments")
    litellm_model = models.CharField(max_length=200)
    weight = models.PositiveIntegerField(
        default=1, help_text="Share of traffic among deployments at the same position of a chain."
    )
    enabled = models.BooleanField(default=True)
    breaker_policy = models.ForeignKey(
        BreakerPolicy, null=True, blank=True, on_delete=models.PROTECT, related_name="deployments"
    )

    class Forced(models.TextChoices):
        NONE = "", "Automatic"
        OPEN = "open", "Forced open (no traffic)"
        CLOSED = "closed", "Forced closed (always tried)"

    forced_state = models.CharField(
        max_length=8, choices=Forced.choices, default=Forced.NONE, blank=True, editable=False
    )
    max_concurrent = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Calls in flight at once, across every gateway process. Past it, requests overflow to the next "
        "deployment of the chain; when the whole chain is full, interactive requests wait briefly, then get 503 "
        "`overloaded`, and batch items wait their turn. Empty: no limit.",
    )
    self_hosted = models.BooleanField(
        default=False,
        help_text="A server you run (vLLM, Ollama, ...): its own load is sampled from its load URL, and above the "
        "thresholds below it counts as saturated (docs/routing.md).",
    )

    class LoadSource(models.TextChoices):
        VLLM = "vllm", "vLLM: Prometheus metrics"
        OLLAMA = "ollama", "Ollama: /api/ps"
        JSON = "json", "Generic: a JSON document with the queue depth"

    load_source = models.CharField(
        max_length=8,
        choices=LoadSource.choices,
        default=LoadSource.VLLM,
        help_text="Self-hosted: what its load URL answers, and so how it is read (docs/routing.md).",
    )
    load_metrics_url = models.URLField(
        max_length=500,
        blank=True,
        help_text="Self-hosted: where its load is read (vLLM: http://host:8000/metrics; Ollama: "
        "http://host:11434/api/ps; generic: a URL answering JSON). Requests to it go through the egress "
        "guard (docs/egress.md).",
    )
    load_running_field = models.CharField(
        max_length=100,
        blank=True,
        help_text="Generic JSON: the dotted path of the number of requests running (`running`, `stats.active`).",
    )
    load_waiting_field = models.CharField(
        max_length=100,
        blank=True,
        help_text="Generic JSON: the dotted path of the number of requests waiting (`queue_depth`, `queue.depth`).",
    )
    saturated_running = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Saturated at this many requests running (vllm:num_requests_running; generic: the running "
        "field); Ollama: at this many models loaded.",
    )
    saturated_waiting = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Saturated at this many requests waiting (vllm:num_requests_waiting; generic: the waiting field).",
    )
    saturated_kv_cache_percent = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text="Saturated at this KV-cache usage, in percent (vllm:kv_cache_usage_perc); Ollama: at this share "
        "of its loaded models' memory outside VRAM.",
    )
    recover_percent = models.PositiveSmallIntegerField(
        default=80,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Hysteresis: a saturated deployment takes traffic again once every signal is below this "
        "share of its threshold.",
    )
    saturation_queue_limit = models.PositiveIntegerField(
        default=100,
        help_text="Requests of tenants that queue for it may wait at once while it is saturated; more fail over.",
    )
    input_price_override = models.DecimalField(
        max_digits=20,
        decimal_places=15,
        null=True,
        blank=True,
        help_text="USD per prompt token, instead of the price table.",
    )
    output_price_override = models.DecimalField(
        max_digits=20,
        decimal_places=15,
        null=True,
        blank=True,
        help_text="USD per completion token, instead of the price table.",
    )
    # The other kinds of token (docs/billing.md). With both prices above set, the deployment is off
    # the price table: an empty one below falls back to them. Without them, one set below replaces
    # that kind's price from the table.
    cache_read_price_override = _price_override("USD per prompt token read from the provider's cache.")
    cache_write_price_override = _price_override("USD per prompt token written to the provider's cache.")
    reasoning_price_override = _price_override("USD per reasoning token.")
    batch_input_price_override = _price_override("USD per prompt token of a batch request.")
    batch_output_price_override = _price_override("USD per completion token of a batch request.")
    batch_cache_read_price_override = _price_override("USD per cache-read prompt token of a batch request.")
    batch_cache_write_price_override = _price_override("USD per cache-write prompt token of a batch request.")
    image_price_override = models.DecimalField(
        max_digits=20,
        decimal_places=15,
        null=True,
        blank=True,
        help_text="USD per generated image, whatever its size and quality, instead of litellm's per-image prices.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from sentinel.egress import url_problem

        if self.self_hosted and not self.load_metrics_url:
            raise ValidationError({"load_metrics_url": "A self-hosted deployment needs the URL of its metrics."})
        if (
            self.self_hosted
            and self.load_source == self.LoadSource.JSON
            and not (self.load_running_field or self.load_waiting_field)
        ):
            raise ValidationError(
                {"load_waiting_field": "A generic load source needs the field of its queue depth, or of its running."}
            )
        problem = url_problem(self.load_metrics_url) if self.load_metrics_url else None
        if problem:
            raise ValidationError({"load_metrics_url": problem})


class ModelAlias(models.Model):
    """A model name clients ask for (`fast`, `smart`, `gpt-4o-mini`) and the chain that serves it."""

    name = models.CharField(max_length=200, unique=True)
    description = models.CharField(max_length=300, blank=True)
    # Global limits on the model, across all tenants, so one heavy user cannot monopolize a provider.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent = models.PositiveIntegerField(null=True, blank=True)
    # Which failures of a deployment send the request on to the next one of the chain; the others are
    # returned to the client (docs/routing.md, "Fallbacks by kind of failure").
    fallback_on_timeout = models.BooleanField(default=True, help_text="A timeout fails over.")
    fallback_on_server_error = models.BooleanField(
        default=True, help_text="A 5xx or connection error fails over (after the provider's retries)."
    )
    fallback_on_rate_limit = models.BooleanField(
        default=True, help_text="A provider's 429 fails over (after its retries), without opening the breaker."
    )
    fallback_on_context_window = models.BooleanField(
        default=False,
        help_text="A prompt over the deployment's context window goes to the next deployment with a larger one "
        "(litellm's model map).",
    )
    fallback_on_content_policy = models.BooleanField(
        default=False, help_text="A provider's content-policy refusal goes to the next deployment."
    )
    deployments = models.ManyToManyField(Deployment, through="ChainEntry", related_name="aliases")

    class Meta:
        ordering = ["name"]
        verbose_name = "model alias"
        verbose_name_plural = "model aliases"

    def __str__(self) -> str:
        return self.name


class ChainEntry(models.Model):
    """A deployment's place in an alias's chain: lower positions are tried first."""

    alias = models.ForeignKey(ModelAlias, on_delete=models.CASCADE, related_name="chain")
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+")
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["alias", "position", "id"]
        constraints = [models.UniqueConstraint(fields=["alias", "deployment"], name="deployment_once_per_chain")]
        verbose_name = "chain entry"
        verbose_name_plural = "chain entries"

    def __str__(self) -> str:
        return f"{self.alias} #{self.position}: {self.deployment}"


BREAKER_STATE_LABELS = {"half_open": "half-open", "forced_open": "forced open", "forced_closed": "forced closed"}


def breaker_state_label(state: str) -> str:
    """A breaker state as people read it (`forced_open` is the stored and exported name)."""
    return BREAKER_STATE_LABELS.get(state, state)


class BreakerTransition(models.Model):
    """Every change of a breaker's state, automatic or manual: the audit trail operators watch."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    reason = models.CharField(max_length=300, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.deployment}: {self.change}"

    @property
    def change(self) -> str:
        return f"{breaker_state_label(self.from_state)} → {breaker_state_label(self.to_state)}"


class KillSwitch(models.Model):
    """Sends all traffic (of one tenant, or of everyone) to a designated fallback model."""

    tenant = models.ForeignKey(
        "tenants.Tenant",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="Empty: the global switch.",
    )
    fallback = models.ForeignKey(ModelAlias, on_delete=models.PROTECT, related_name="+")
    active = models.BooleanField(default=False)
    reason = models.CharField(max_length=300, blank=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "kill switches"
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_switch_per_tenant", nulls_distinct=False)]

    def __str__(self) -> str:
        return f"kill switch ({self.tenant or 'global'}) → {self.fallback}"


class ControlAction(models.Model):
    """Who did what to the traffic by hand, when and why (forced breakers, kill switches)."""

    action = models.CharField(max_length=40)
    subject = models.CharField(max_length=200)
    reason = models.CharField(max_length=300)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} {self.subject}"


class CacheEntry(models.Model):
    """A stored answer. Found by its exact digest (through Redis) or, in the semantic tier, by the
    embedding of its prompt, strictly inside its partition: tenant, resolved model, the parameters
    that change an answer, the conversation before the prompt, and the namespace."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    partition = models.CharField(max_length=64, db_index=True)
    exact_digest = models.CharField(max_length=64, db_index=True)
    model = models.CharField(max_length=200)
    prompt = models.TextField(help_text="The prompt (last user message) as normalized for matching.")
    # MiniLM's vector of the prompt, computed only when a lookup needed it (gateway/cache/static.py).
    embedding = VectorField(dimensions=384, null=True)
    # The static first stage's vector: what the semantic tier searches (null only for old rows).
    static_embedding = VectorField(dimensions=256, null=True)
    answer = models.JSONField(help_text="content, finish_reason, usage, model as served")
    cost_usd = models.DecimalField(max_digits=20, decimal_places=10, help_text="What the answer cost upstream.")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    last_hit_at = models.DateTimeField(null=True, blank=True)
    hits = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name_plural = "cache entries"
        indexes = [
            models.Index(fields=["tenant", "last_hit_at"], name="cache_tenant_lru"),
            # No HNSW index over the whole table: large partitions get their own partial ones, kept by
            # beat (gateway/cache/indexes.py); small ones are searched exactly through the btree.
        ]

    def __str__(self) -> str:
        return f"{self.model}: {self.prompt[:60]}"


class ShadowCheck(models.Model):
    """A semantic hit asked of the provider too (gateway/cache/shadow.py): the cached answer and the
    fresh one compared, or why no fresh one was asked for. Written once, never edited; counted from
    the tenant's `shadow_since` on."""

    class Outcome(models.TextChoices):
        AGREE = "agree", "Answers agree"
        DIFFER = "differ", "Answers differ (a false hit)"
        SKIPPED = "skipped", "Skipped (budget or limits)"
        FAILED = "failed", "Provider failed"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    request_id = models.CharField(max_length=128, help_text="The hit's request id (its shadow ledger row's too).")
    entry_id = models.BigIntegerField(help_text="The cache entry served (it may be evicted since).")
    prompt_similarity = models.FloatField(help_text="Cosine of the asked and the cached prompt.")
    outcome = models.CharField(max_length=8, choices=Outcome.choices)
    answer_similarity = models.FloatField(null=True, blank=True, help_text="Cosine of the two answers.")
    reason = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "created_at"], name="shadow_tenant_time")]

    def __str__(self) -> str:
        return f"{self.request_id}: {self.outcome}"


from gateway.batches.models import Batch, BatchFile, BatchItem  # noqa: E402,F401  (models of the gateway app)
from gateway.knowledge.models import Chunk, VectorStore, VectorStoreFile  # noqa: E402,F401  (models of the gateway app)
from gateway.responses.models import StoredResponse  # noqa: E402,F401  (a model of the gateway app)
