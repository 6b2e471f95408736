"""Prices (versioned by effective date) and the append-only ledger of every request."""

from __future__ import annotations

import uuid

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone

END_USER_LENGTH = 256


def _kind_price(help_text: str) -> models.DecimalField:
    return models.DecimalField(max_digits=20, decimal_places=15, null=True, blank=True, help_text=help_text)


class Price(models.Model):
    """USD per token for one model, effective from a moment on. Never edited in place once used:
    a price change is a new row, so every ledger row keeps pointing at the version it was billed at."""

    model = models.CharField(max_length=200, db_index=True, help_text="Model as litellm's price map names it.")
    input_per_token = models.DecimalField(max_digits=20, decimal_places=15)
    output_per_token = models.DecimalField(max_digits=20, decimal_places=15)
    # The other kinds of token (docs/billing.md, "Every kind of token"): empty means the kind is
    # billed at the rate it falls back to.
    cache_read_per_token = _kind_price("Prompt tokens read from the provider's prompt cache. Empty: the input price.")
    cache_write_per_token = _kind_price("Prompt tokens written to the provider's prompt cache. Empty: the input price.")
    reasoning_per_token = _kind_price("Reasoning tokens (part of the completion). Empty: the output price.")
    batch_input_per_token = _kind_price("Prompt tokens of a batch request. Empty: the input price.")
    batch_output_per_token = _kind_price("Completion tokens of a batch request. Empty: the output price.")
    batch_cache_read_per_token = _kind_price(
        "Cache reads of a batch request. Empty: the cache read price, else the batch input price."
    )
    batch_cache_write_per_token = _kind_price(
        "Cache writes of a batch request. Empty: the cache write price, else the batch input price."
    )
    effective_from = models.DateTimeField(default=timezone.now)
    source = models.CharField(max_length=40, default="manual")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "-effective_from"]
        constraints = [models.UniqueConstraint(fields=["model", "effective_from"], name="one_price_per_moment")]

    def __str__(self) -> str:
        return f"{self.model} from {self.effective_from:%Y-%m-%d %H:%M}"


class LedgerEntry(models.Model):
    """One request, as billed. Written once (idempotent on `id`), never updated."""

    class CacheTier(models.TextChoices):
        MISS = "miss"
        EXACT = "hit-exact"
        SEMANTIC = "hit-semantic"
        BYPASS = "bypass"
        # A semantic hit asked of the provider too, to measure false hits (gateway/cache/shadow.py):
        # billed, never served; it carries the hit's request id.
        SHADOW = "shadow"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    request_id = models.CharField(max_length=128, db_index=True)
    created_at = models.DateTimeField(db_index=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    key = models.ForeignKey("tenants.VirtualKey", null=True, on_delete=models.PROTECT, related_name="+")
    # A plain id (no constraint), as the audit log's tenant: a team deleted later keeps its history.
    team = models.ForeignKey(
        "tenants.Team",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        help_text="The key's team when the request was made; empty: a key of no team.",
    )
    model_requested = models.CharField(max_length=200)
    model_served = models.CharField(max_length=200, blank=True)
    deployment = models.CharField(max_length=120, blank=True)
    provider = models.CharField(max_length=80, blank=True)
    stream = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField()
    error_code = models.CharField(max_length=60, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    # Of the prompt tokens, those read from and written to the provider's prompt cache; of the
    # completion tokens, the reasoning ones; and what each of those kinds cost (part of cost_usd).
    # db_default: rows inserted by a version without the columns (a rolling deploy's old workers).
    cache_read_tokens = models.PositiveIntegerField(default=0, db_default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0, db_default=0)
    reasoning_tokens = models.PositiveIntegerField(default=0, db_default=0)
    cost_usd = models.DecimalField(max_digits=20, decimal_places=10, default=0)
    cache_read_cost_usd = models.DecimalField(max_digits=20, decimal_places=10, default=0, db_default=0)
    cache_write_cost_usd = models.DecimalField(max_digits=20, decimal_places=10, default=0, db_default=0)
    reasoning_cost_usd = models.DecimalField(max_digits=20, decimal_places=10, default=0, db_default=0)
    batch = models.BooleanField(default=False, db_default=False, help_text="A Batch API item, billed at batch rates.")
    price = models.ForeignKey(Price, null=True, on_delete=models.PROTECT, related_name="+")
    retrieval_tokens = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Tokens of the queries embedded to search the tenant's vector stores (file_search, /search).",
    )
    retrieval_cost_usd = models.DecimalField(
        max_digits=20,
        decimal_places=10,
        default=0,
        db_default=0,
        help_text="What searching the vector stores cost: part of cost_usd.",
    )
    images = models.PositiveIntegerField(
        default=0, db_default=0, help_text="Images generated (POST /v1/images/generations); 0 for other requests."
    )
    cache_tier = models.CharField(max_length=16, choices=CacheTier.choices, default=CacheTier.MISS)
    saved_cost_usd = models.DecimalField(max_digits=20, decimal_places=10, default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    ttft_ms = models.PositiveIntegerField(null=True)
    fallbacks = models.PositiveSmallIntegerField(default=0)
    fallback_reasons = models.CharField(
        max_length=500,
        blank=True,
        db_default="",  # rows inserted by a version without the column (a rolling deploy's old workers)
        help_text="Each deployment passed over and why: `<deployment>=<timeout|server_error|rate_limited|"
        "context_window|content_policy|saturated|circuit_open|...>`, comma-separated.",
    )
    route = models.CharField(max_length=8, blank=True, help_text='What `model: "auto"` chose: fast or smart.')
    route_reason = models.CharField(max_length=60, blank=True, help_text="Why the auto route chose it.")
    escalated_from = models.CharField(
        max_length=120, blank=True, help_text="The deployment whose refusal was retried on the smart model."
    )
    screening = models.JSONField(
        null=True, blank=True, help_text="Safety screening: checks that ran, what fired and what was done (no text)."
    )
    # Rows inserted by a version without these columns (a rolling deploy's old workers) get "".
    end_user = models.CharField(
        "user",
        max_length=END_USER_LENGTH,
        blank=True,
        db_default="",
        help_text="The end user the app named (OpenAI's `user` field; Messages' metadata.user_id).",
    )
    session_id = models.CharField(
        max_length=256, blank=True, db_default="", help_text="The session the app named (x-sentinel-session)."
    )

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "ledger entry"
        verbose_name_plural = "ledger entries"
        indexes = [
            # A tenant's rows in a period, newest first; with the status and latency, so the dashboard's
            # latency percentiles read the index alone (1.9 s for 30 days of a 10M-row ledger from the
            # table, 0.7 s from this index).
            models.Index(
                fields=["tenant", "created_at"], include=["status_code", "latency_ms"], name="ledger_tenant_window"
            ),
            # An end user's or session's spend in a period (admission starts its counters from it);
            # partial, so rows that name neither cost nothing.
            models.Index(
                fields=["key", "end_user", "created_at"], name="ledger_end_user", condition=~models.Q(end_user="")
            ),
            models.Index(
                fields=["key", "session_id", "created_at"], name="ledger_session", condition=~models.Q(session_id="")
            ),
            # The request log filtered by one user, across the tenant's keys.
            models.Index(
                fields=["tenant", "end_user", "created_at"], name="ledger_tenant_end_user", condition=~Q(end_user="")
            ),
            # The request log filtered by status, and its capped count: a rare status (2% of a tenant's
            # rows) is otherwise found by reading the tenant's rows newest first until a page is full.
            models.Index(fields=["tenant", "status_code", "created_at"], name="ledger_tenant_status"),
            # A team's spend in a period (admission starts its budgets' counters from it) and its
            # request log; partial, so rows of keys without a team cost nothing.
            models.Index(fields=["team", "created_at"], name="ledger_team", condition=Q(team__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.request_id} {self.model_requested} {self.status_code}"


class LedgerDeadLetter(models.Model):
    """A ledger record the database refused, or that was no ledger record at all, kept byte for byte
    with the reason, so that one bad record never holds up the others and nothing billed disappears
    unseen. Written by the ledger drain (or the direct write while Redis is away), never edited.

    Every column takes whatever the record holds: the record itself as bytes, the text columns
    escaped and cut to size, the tenant without a foreign-key constraint (a record may name a tenant
    that does not exist). So the write cannot be refused for what the record contains, and when it
    fails all the same, the database is unwell and the record stays queued for a retry."""

    class Kind(models.TextChoices):
        UNDECODABLE = "undecodable", "not a ledger record"
        VALUE = "value", "a value refused"
        CONSTRAINT = "constraint", "a constraint violated"
        OTHER = "other", "other"

    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the record: each is kept once.")
    created_at = models.DateTimeField(default=timezone.now, db_index=True, help_text="When it was set aside.")
    queued_at = models.DateTimeField(null=True, help_text="When the gateway handed the record off.")
    tenant = models.ForeignKey(
        "tenants.Tenant",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
        related_name="+",
        help_text="The tenant the record names, when there is one by that id.",
    )
    request_id = models.CharField(max_length=128, blank=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    reason = models.TextField()
    record = models.BinaryField(help_text="The record as it was queued.")
    stream_id = models.CharField(
        max_length=40, blank=True, help_text="Its id in the ledger stream (empty: written directly, Redis away)."
    )

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "ledger dead letter"
        indexes = [models.Index(fields=["tenant", "created_at"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.request_id or self.stream_id or self.digest[:12]}"


class RollupDue(models.Model):
    """A tenant's day whose rollup is out of date: written with the ledger rows that made it so, in
    the same transaction, and removed by the rollup job that folded them in. An insert, never an
    update, so concurrent ledger batches never contend for a row."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    day = models.DateField()

    class Meta:
        indexes = [models.Index(fields=["tenant", "day"])]

    def __str__(self) -> str:
        return f"tenant {self.tenant_id} on {self.day}"


class DailyRollup(models.Model):
    """Ledger totals per tenant, key, model (as asked for), price version and UTC day. Recomputed from
    the ledger for each tenant's day that got new rows, so it always equals the ledger's sums."""

    day = models.DateField()
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="+")
    key = models.ForeignKey("tenants.VirtualKey", null=True, on_delete=models.PROTECT, related_name="+")
    model = models.CharField(max_length=200, help_text="The model (alias) clients asked for.")
    price = models.ForeignKey(Price, null=True, on_delete=models.PROTECT, related_name="+")
    requests = models.PositiveIntegerField(default=0)
    successful_requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_tokens = models.PositiveBigIntegerField(default=0)
    reasoning_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=24, decimal_places=10, default=0)
    cache_read_cost_usd = models.DecimalField(max_digits=24, decimal_places=10, default=0)
    cache_write_cost_usd = models.DecimalField(max_digits=24, decimal_places=10, default=0)
    reasoning_cost_usd = models.DecimalField(max_digits=24, decimal_places=10, default=0)
    exact_hits = models.PositiveIntegerField(default=0)
    semantic_hits = models.PositiveIntegerField(default=0)
    saved_cost_usd = models.DecimalField(max_digits=24, decimal_places=10, default=0)
    images = models.PositiveBigIntegerField(default=0, help_text="Images generated (their cost is in cost_usd).")
    computed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-day", "tenant", "model"]
        constraints = [
            models.UniqueConstraint(
                fields=["day", "tenant", "key", "model", "price"], name="one_rollup_per_group", nulls_distinct=False
            )
        ]
        indexes = [models.Index(fields=["tenant", "day"])]

    def __str__(self) -> str:
        return f"{self.day} tenant {self.tenant_id} {self.model}"


class DailyTraffic(models.Model):
    """The dashboard's ledger figures per tenant, key, model (as asked for), provider and UTC day,
    counted as the dashboard counts them (hits and misses among answered requests). Recomputed with
    the DailyRollup of the same tenant's day, so a whole day read here equals its ledger rows."""

    day = models.DateField()
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    key = models.ForeignKey("tenants.VirtualKey", null=True, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=200)
    provider = models.CharField(max_length=80, blank=True)
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)  # status other than 200
    server_errors = models.PositiveIntegerField(default=0)  # status 500 and over
    exact_hits = models.PositiveIntegerField(default=0)  # answered
    semantic_hits = models.PositiveIntegerField(default=0)
    misses = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=24, decimal_places=10, default=0)
    saved_usd = models.DecimalField(max_digits=24, decimal_places=10, default=0)

    class Meta:
        indexes = [models.Index(fields=["tenant", "day"])]

    def __str__(self) -> str:
        return f"{self.day} tenant {self.tenant_id} {self.model} {self.provider}"


class DailyUserTraffic(models.Model):
    """Requests, failures and cost per tenant, end user (as the app named them; none: not kept) and
    UTC day: the dashboard's top users over whole days. Recomputed with the day's DailyRollup."""

    day = models.DateField()
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    end_user = models.CharField(max_length=END_USER_LENGTH)
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=24, decimal_places=10, default=0)

    class Meta:
        indexes = [models.Index(fields=["tenant", "day"])]

    def __str__(self) -> str:
        return f"{self.day} tenant {self.tenant_id} {self.end_user}"


class DailyLatency(models.Model):
    """The latencies of a tenant's answered requests (status 200) on a UTC day, counted at the ledger's
    1 ms resolution: `latencies` holds each distinct latency_ms once, ascending, and `counts` how many
    answered requests took it. Adding up the days of a window gives every answered request's latency,
    so its percentiles are exactly PostgreSQL's percentile_cont over those rows (docs/console.md).
    One row per tenant's day, recomputed with the day's DailyRollup."""

    day = models.DateField()
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    latencies = ArrayField(models.IntegerField())
    counts = ArrayField(models.IntegerField())

    class Meta:
        constraints = [
            # Day first: the operator's windows read every tenant's days, a tenant admin's a few tenants'.
            models.UniqueConstraint(fields=["day", "tenant"], name="one_latency_histogram_per_day")
        ]

    def __str__(self) -> str:
        return f"{self.day} tenant {self.tenant_id}: {sum(self.counts)} answered"


class LedgerArchive(models.Model):
    """A month of the ledger exported to a file and detached from the table (`manage.py ledger_archive`,
    billing/archive.py). Its rollups stay, so spend reports over it are unchanged; its rows are in the
    file (CSV, gzip), which the counts and the sum here check."""

    month = models.DateField(help_text="The first day of the UTC month.")
    path = models.CharField(max_length=1000, help_text="The export: CSV with a header row, gzip-compressed.")
    rows = models.PositiveBigIntegerField()
    cost_usd = models.DecimalField(max_digits=24, decimal_places=10, help_text="The rows' cost, summed.")
    sha256 = models.CharField(max_length=64, help_text="Of the file as written.")
    kept_as = models.CharField(
        max_length=63, blank=True, help_text="The detached table still holding the rows; empty: dropped."
    )
    archived_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-month", "-archived_at"]

    def __str__(self) -> str:
        return f"ledger {self.month:%Y-%m}: {self.rows} rows in {self.path}"


class SpendReport(DailyRollup):
    """The spend report's place in the admin (a page, not a list of rows)."""

    class Meta:
        proxy = True
        verbose_name = "spend report"
        verbose_name_plural = "spend report"
