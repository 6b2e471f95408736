"""Tenants, their members and the virtual keys their apps call the gateway with."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex, OpClass
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models.functions import Upper
from django.utils import timezone


class RateLimitTier(models.Model):
    """A named preset of limits (free / pro / enterprise) a tenant or key can point at."""

    name = models.CharField(max_length=60, unique=True)
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


LIMIT_FIELDS = {"rpm": "requests_per_minute", "tpm": "tokens_per_minute", "concurrency": "max_concurrent"}
LIMIT_NAMES = {"rpm": "requests per minute", "tpm": "tokens per minute", "concurrency": "concurrent requests"}


class Limits(models.Model):
    """Limits set on the object itself win over its tier's; empty means the tier's (or none)."""

    tier = models.ForeignKey(RateLimitTier, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Prompt estimate plus max_tokens, reconciled with actual usage."
    )
    max_concurrent = models.PositiveIntegerField(null=True, blank=True, help_text="Requests in flight at once.")

    class Meta:
        abstract = True

    def effective_limits(self) -> dict[str, int]:
        """{"rpm"|"tpm"|"concurrency": limit} for every limit that applies."""
        limits = {}
        for kind, field in LIMIT_FIELDS.items():
            value = getattr(self, field)
            if value is None and self.tier is not None:
                value = getattr(self.tier, field)
            if value is not None:
                limits[kind] = value
        return limits

    def limits_over(self, ceiling: dict[str, int], whose: str) -> dict[str, str]:
        """An error for each limit past `ceiling`'s (an owner's effective limits), on the limit's own
        field, or on the tier when the limit is the tier's: "At most {whose} requests per minute (100)."."""
        errors = {}
        for kind, value in self.effective_limits().items():
            if kind in ceiling and value > ceiling[kind]:
                field = LIMIT_FIELDS[kind]
                errors[field if getattr(self, field) is not None else "tier"] = (
                    f"At most {whose} {LIMIT_NAMES[kind]} ({ceiling[kind]})."
                )
        return errors


class Tenant(Limits):
    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        SUSPENDED = "suspended", "Suspended"

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=80, unique=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    allowed_models = ArrayField(
        models.CharField(max_length=200),
        default=list,
        blank=True,
        help_text="Model names (aliases) this tenant's keys may call. Empty: every model.",
    )

    class RedisOutage(models.TextChoices):
        FAIL_OPEN = "open", "Admit and count locally in each process"
        FAIL_CLOSED = "closed", "Refuse with 503"

    cache_enabled = models.BooleanField(default=True, help_text="Answer repeated requests from the cache.")
    semantic_cache_enabled = models.BooleanField(
        default=True, help_text="Also answer paraphrases (verified before they are served)."
    )
    semantic_threshold = models.FloatField(
        null=True, blank=True, help_text="Cosine similarity a candidate must reach. Empty: the built-in default."
    )
    shadow_share = models.DecimalField(
        max_digits=5,
        decimal_places=2,
        default=Decimal("1"),
        validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="Percent of semantic hits also asked of the provider in the background (billed, marked "
        "shadow in the ledger) to measure how often the cache serves a wrong answer. 0: never.",
    )
    false_hit_target = models.DecimalField(
        max_digits=5,
        decimal_places=2,
        default=Decimal("2"),
        validators=[MinValueValidator(Decimal("0.01")), MaxValueValidator(100)],
        help_text="Percent of semantic hits allowed to be wrong. When the 95% upper bound of the measured "
        "rate exceeds it, the semantic tier switches itself off (exact hits only).",
    )
    shadow_since = models.DateTimeField(
        default=timezone.now,
        help_text="Start of the false-hit measurement: shadow checks before it (an earlier threshold or "
        "verifier) do not count. Moved when the semantic settings change or the tier tightens itself.",
    )
    semantic_tightened_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the semantic tier last switched itself off."
    )
    semantic_tightened_reason = models.CharField(max_length=300, blank=True, editable=False)
    cache_ttl_seconds = models.PositiveIntegerField(default=86_400, help_text="How long an answer stays cached.")
    cache_max_entries = models.PositiveIntegerField(
        default=50_000,
        help_text="Above this, the least recently used entries are evicted, down to a twentieth below it.",
    )
    on_redis_outage = models.CharField(
        max_length=8,
        choices=RedisOutage.choices,
        default=RedisOutage.FAIL_OPEN,
        help_text="What admission does when Redis (the shared counters) cannot be reached.",
    )
    auto_fast_model = models.CharField(
        max_length=200, default="fast", help_text='Where `model: "auto"` sends simple prompts (a model alias).'
    )
    auto_smart_model = models.CharField(
        max_length=200,
        default="smart",
        help_text='Where `model: "auto"` sends demanding prompts, and where refusals escalate to (a model alias).',
    )
    escalate_refusals = models.BooleanField(
        default=False,
        help_text="When a model refuses or apologizes instead of answering (non-streamed), ask the smart model "
        "once more.",
    )

    class OnSaturation(models.TextChoices):
        REJECT = "reject", "Reject fast: go on to the next deployment at once"
        QUEUE = "queue", "Queue: wait for the saturated deployment, up to the deadline"

    on_saturation = models.CharField(
        max_length=8,
        choices=OnSaturation.choices,
        default=OnSaturation.REJECT,
        help_text="When a self-hosted deployment is saturated (docs/routing.md).",
    )
    saturation_wait_ms = models.PositiveIntegerField(
        default=2000,
        validators=[MaxValueValidator(60_000)],
        help_text="Queue: the longest a request waits for a saturated deployment before going on.",
    )
    budget_fallback_model = models.CharField(
        max_length=200,
        blank=True,
        help_text="A cheaper model alias to route requests to once a hard budget they count against is nearly "
        "spent (the key must be allowed it). Empty: off (docs/routing.md).",
    )
    budget_fallback_percent = models.PositiveSmallIntegerField(
        default=90,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Nearly spent: this share of the budget's limit is spent or held by requests in flight.",
    )
    content_policy_model = models.CharField(
        max_length=200,
        blank=True,
        help_text="A model alias to ask when every provider the request reaches refuses it under its content "
        "policy (the key must be allowed it). Empty: the refusal goes back to the client (docs/routing.md).",
    )
    knowledge_quota_bytes = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Bytes of files this tenant's vector stores may hold; empty: SENTINEL_KNOWLEDGE_QUOTA_BYTES. "
        "Set by operators.",
    )
    log_prompts = models.BooleanField(
        default=False,
        help_text="Write each answered request's messages and answer to the request log (after screening's "
        "redaction). Off: prompts and answers are never logged.",
    )
    batch_requests_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Pace of this tenant's batch jobs, kept below its interactive limit. Empty: half of the "
        "tenant's requests-per-minute limit, or no pace of its own when it has none.",
    )
    require_two_factor = models.BooleanField(
        default=False,
        help_text="Members must sign in to the console with a one-time code (TOTP) as well as their password; "
        "members without an authenticator app enrol at their next sign-in. Single sign-on users are exempt: "
        "their identity provider checks them.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        interactive = self.effective_limits().get("rpm")
        pace = self.batch_requests_per_minute
        if pace is not None and interactive is not None and pace >= interactive:
            raise ValidationError(
                {
                    "batch_requests_per_minute": f"Batch work must stay below the interactive limit "
                    f"({interactive} requests per minute)."
                }
            )

    def batch_pace(self) -> int | None:
        """Batch requests per minute: the tenant's setting, else half its interactive limit."""
        if self.batch_requests_per_minute is not None:
            return self.batch_requests_per_minute
        interactive = self.effective_limits().get("rpm")
        return max(1, interactive // 2) if interactive is not None else None

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE


class Membership(models.Model):
    class Role(models.TextChoices):
        ADMIN = "admin", "Admin"
        FINANCE = "finance", "Finance"
        VIEWER = "viewer", "Viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class Team(Limits):
    """A team (project) inside a tenant: its keys, its allowlist, limits and budgets (each within the
    tenant's), and its members, who reach only its keys, spend and logs (docs/governance.md). A key
    without a team is bound by the tenant's settings alone, as before teams existed."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="teams")
    name = models.CharField(max_length=200)
    allowed_models = ArrayField(
        models.CharField(max_length=200),
        default=list,
        blank=True,
        help_text="Model names this team's keys may call, within the tenant's list. Empty: the tenant's list.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["tenant__name", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="one_team_name_per_tenant")]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """A team narrows its tenant, never widens it: its allowlist within the tenant's, each of its
        limits at most the tenant's."""
        from django.core.exceptions import ValidationError

        if self.tenant_id is None:
            return
        errors: dict[str, str] = {}
        tenant = self.tenant
        outside = [
            model for model in self.allowed_models if tenant.allowed_models and model not in tenant.allowed_models
        ]
        if outside:
            errors["allowed_models"] = (
                f"Not on the tenant's allowlist: {', '.join(outside)}. "
                f"The tenant allows {', '.join(tenant.allowed_models)}."
            )
        errors.update(self.limits_over(tenant.effective_limits(), "the tenant's"))
        if errors:
            raise ValidationError(errors)


class TeamMembership(models.Model):
    """A person's role in one team: its admins manage the team's keys and see its spend and logs; its
    viewers only see them. Neither reaches another team's keys, spend or logs."""

    class Role(models.TextChoices):
        ADMIN = "admin", "Team admin"
        VIEWER = "viewer", "Team viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        verbose_name = "team membership"
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in team {self.team} ({self.role})"


class VirtualKey(Limits):
    """A key an app calls the gateway with. Only a digest of the secret is stored."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        REVOKED = "revoked", "Revoked"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="keys")
    team = models.ForeignKey(
        Team,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="keys",
        help_text="Its team's allowlist, limits and budgets bind it too. Empty: the tenant's alone.",
    )
    name = models.CharField(max_length=200)
    prefix = models.CharField(
        max_length=32, editable=False, help_text="The first characters of the secret, to tell keys apart."
    )
    digest = models.CharField(max_length=64, unique=True, editable=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    expires_at = models.DateTimeField(null=True, blank=True)
    allowed_models = ArrayField(
        models.CharField(max_length=200),
        default=list,
        blank=True,
        help_text="Model names this key may call, within the tenant's list. Empty: the tenant's list.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Latest request, as of the last ledger batch."
    )
    successor = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="predecessors",
        editable=False,
        help_text="The key that replaced this one when it was rotated.",
    )

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "virtual key"
        # The key list's order (the admin adds -id), for one tenant's admin and for operators: a page
        # is read from the index instead of sorting every key (seconds at a million).
        indexes = [
            models.Index(fields=["tenant", "-created_at", "-id"], name="key_list_by_tenant"),
            models.Index(fields=["-created_at", "-id"], name="key_list"),
            # The key list's search (Django's icontains: UPPER(column) LIKE '%...%'), by trigrams.
            GinIndex(OpClass(Upper("name"), name="gin_trgm_ops"), name="key_name_search"),
            GinIndex(OpClass(Upper("prefix"), name="gin_trgm_ops"), name="key_prefix_search"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.team_id is None or self.tenant_id is None:
            return
        team = self.team
        if team.tenant_id != self.tenant_id:
            raise ValidationError({"team": "A team of the key's own tenant."})
        # A key narrows its team as a team narrows its tenant (Team.clean). Both bind a request anyway
        # (the stricter applies); a key set past its team's says so rather than promise more.
        errors = self.limits_over(team.effective_limits(), f"team {team.name}'s")
        outside = [name for name in self.allowed_models if team.allowed_models and name not in team.allowed_models]
        if outside:
            errors["allowed_models"] = (
                f"Not on team {team.name}'s list of models: {', '.join(outside)}. A key narrows it only."
            )
        if errors:
            raise ValidationError(errors)

    @property
    def state(self) -> str:
        """What the gateway does with the key now: active, rotated (working until its grace ends),
        expired or revoked."""
        if self.status == self.Status.REVOKED:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= timezone.now():
            return "expired"
        if self.successor_id is not None:
            return "rotated"
        return "active"


class Budget(models.Model):
    """A spending limit in USD for a tenant, or one of its keys, per UTC day or month."""

    class Period(models.TextChoices):
        DAILY = "daily", "Daily (UTC)"
        MONTHLY = "monthly", "Monthly (UTC)"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    key = models.ForeignKey(
        VirtualKey,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="budgets",
        help_text="Empty: the budget covers the whole tenant (or the team).",
    )
    team = models.ForeignKey(
        Team,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="budgets",
        help_text="A team's budget covers every key of the team. Empty: the tenant's (or the key's).",
    )
    period = models.CharField(max_length=8, choices=Period.choices, default=Period.MONTHLY)
    limit_usd = models.DecimalField(max_digits=14, decimal_places=4)
    alert_at_percent = models.PositiveSmallIntegerField(
        null=True, blank=True, default=80, help_text="Raise an alert once per period at this share of the limit."
    )
    hard = models.BooleanField(default=True, help_text="Reject requests (402) that could exceed the limit.")

    class Meta:
        ordering = ["tenant", "team", "key", "period"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(key__isnull=True) | models.Q(team__isnull=True),
                name="budget_of_a_key_or_a_team",
                violation_error_message="A budget is a key's or a team's, not both.",
            )
        ]

    def __str__(self) -> str:
        if self.key_id:
            scope = f"key {self.key}"
        elif self.team_id:
            scope = f"team {self.team}"
        else:
            scope = f"tenant {self.tenant}"
        return f"{self.get_period_display()} ${self.limit_usd} for {scope}"

    def clean(self) -> None:
        """A team's budget is its own tenant's team, and at most the tenant's budget of its period."""
        from django.core.exceptions import ValidationError

        if self.team_id is None or self.tenant_id is None:
            return
        if self.key_id is not None:
            raise ValidationError({"team": "A budget is a key's or a team's, not both."})
        if self.team.tenant_id != self.tenant_id:
            raise ValidationError({"team": "A team of the budget's own tenant."})
        ceiling = (
            Budget.objects.filter(tenant_id=self.tenant_id, key__isnull=True, team__isnull=True, period=self.period)
            .order_by("limit_usd")
            .values_list("limit_usd", flat=True)
            .first()
        )
        if ceiling is not None and self.limit_usd is not None and self.limit_usd > ceiling:
            raise ValidationError({"limit_usd": f"At most the tenant's {self.period} budget (${ceiling})."})


class EndUserLimit(models.Model):
    """What each end user (the OpenAI `user` field) or each session (`x-sentinel-session`, or
    `metadata.session_id`) of an app holding the key may spend or use per UTC day or month: a budget in
    USD, a cap in tokens (prompt and completion), or both. The same for every end user of the key: an
    end user Sentinel has never seen is held to it from its first request (docs/governance.md)."""

    class Scope(models.TextChoices):
        END_USER = "end_user", "Each end user"
        SESSION = "session", "Each session"

    key = models.ForeignKey(VirtualKey, on_delete=models.CASCADE, related_name="end_user_limits")
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.END_USER)
    period = models.CharField(max_length=8, choices=Budget.Period.choices, default=Budget.Period.DAILY)
    limit_usd = models.DecimalField(
        max_digits=14,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0))],
        help_text="USD per period (402 past it). Empty: no budget.",
    )
    token_cap = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Prompt and completion tokens per period (429 past it). Empty: no cap."
    )

    class Meta:
        ordering = ["key", "scope", "period"]
        verbose_name = "end-user limit"
        constraints = [
            models.UniqueConstraint(fields=["key", "scope", "period"], name="one_end_user_limit_per_period"),
            models.CheckConstraint(
                condition=models.Q(limit_usd__isnull=False) | models.Q(token_cap__isnull=False),
                name="end_user_limit_sets_something",
                violation_error_message="Set a budget, a token cap, or both.",
            ),
        ]

    def __str__(self) -> str:
        what = " and ".join(
            part
            for part in (
                f"${self.limit_usd}" if self.limit_usd is not None else "",
                f"{self.token_cap} tokens" if self.token_cap is not None else "",
            )
            if part
        )
        return f"{self.get_scope_display()}: {what} {self.period}"


class BudgetAlert(models.Model):
    """A soft threshold crossed: one row per budget and period, so the alert fires once."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    period_start = models.DateField()
    spent_usd = models.DecimalField(max_digits=20, decimal_places=10)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["budget", "period_start"], name="one_alert_per_period")]

    def __str__(self) -> str:
        return f"{self.budget} reached {self.spent_usd} ({self.period_start})"


class WebhookEndpoint(models.Model):
    """Where events are POSTed, signed with HMAC-SHA256. A tenant's endpoints get that tenant's
    events; an endpoint without a tenant (operators') gets every event."""

    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="webhooks",
        help_text="Empty: an operators' endpoint that receives every event.",
    )
    url = models.URLField(max_length=500)
    secret_encrypted = models.BinaryField(editable=False, default=b"")
    events = ArrayField(
        models.CharField(max_length=60),
        default=list,
        blank=True,
        help_text="Event names to send (budget.threshold, breaker.transition, cache.semantic_tightened, ...). "
        "Empty: all.",
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["url"]

    def __str__(self) -> str:
        return self.url

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from sentinel.egress import url_problem

        problem = url_problem(self.url) if self.url else None
        if problem:
            raise ValidationError({"url": problem})

    def set_secret(self, secret: str) -> None:
        from sentinel.crypto import encrypt

        self.secret_encrypted = encrypt("webhook-secrets", secret)

    def secret(self) -> str:
        from sentinel.crypto import decrypt

        return decrypt("webhook-secrets", self.secret_encrypted)


class WebhookDelivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=60)
    payload = models.JSONField()
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["-created_at", "-id"], name="delivery_list")]  # the delivery log's order
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.event} → {self.endpoint} ({self.status})"


class AuditEntry(models.Model):
    """One thing someone did in the console or to a key: who, when, from where, to what, and which
    fields changed (before and after; secrets never). Append-only: a database trigger refuses every
    UPDATE and DELETE of these rows (migration 0012), and the console only reads them. Tenant and
    actor are plain ids, not foreign keys, so the history outlives the rows it speaks of."""

    class Action(models.TextChoices):
        KEY_ISSUED = "key.issued", "Key issued"
        KEY_ROTATED = "key.rotated", "Key rotated"
        KEY_REVOKED = "key.revoked", "Key revoked"
        CHANGED = "object.changed", "Changed"
        ADDED = "object.added", "Added"
        DELETED = "object.deleted", "Deleted"
        TENANT_STATUS = "tenant.status", "Tenant suspended or reactivated"
        MEMBER_ADDED = "member.added", "Member added"
        MEMBER_ROLE = "member.role", "Member's role changed"
        MEMBER_REMOVED = "member.removed", "Member removed"
        LOGIN = "login.succeeded", "Signed in"
        LOGIN_SSO = "login.sso", "Signed in with single sign-on"
        LOGIN_FAILED = "login.failed", "Sign-in failed"
        TWO_FACTOR_ENROLLED = "twofactor.enrolled", "Two-factor sign-in enrolled"
        TWO_FACTOR_REMOVED = "twofactor.removed", "Two-factor sign-in removed"
        EXPORT = "export.downloaded", "Export downloaded"

    created_at = models.DateTimeField(default=timezone.now, editable=False, db_index=True)
    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        help_text="Empty: the installation's (operators only).",
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_name = models.CharField(max_length=150, blank=True, help_text="Empty: Sentinel itself.")
    address = models.GenericIPAddressField(null=True, blank=True, help_text="The client's address.")
    action = models.CharField(max_length=32, choices=Action.choices)
    target = models.CharField(max_length=300, blank=True, help_text="What was acted on.")
    changes = models.JSONField(default=dict, blank=True, help_text="{field: [before, after]}; secrets never.")
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "audit log entry"
        verbose_name_plural = "audit log"
        indexes = [models.Index(fields=["tenant", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_name or 'Sentinel'} {self.action} {self.target}"


class SingleSignOnRule(models.Model):
    """Who a single sign-on (OpenID Connect) login makes a member of which tenant, read from the ID
    token's claims: an email domain, or a group in the groups claim. Set by operators only: a rule
    grants access."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sso_rules")
    role = models.CharField(
        max_length=16,
        choices=Membership.Role.choices,
        default=Membership.Role.VIEWER,
        blank=True,
        help_text="The tenant role it gives. Empty for a rule naming a team: it gives the team role alone.",
    )
    team = models.ForeignKey(
        Team,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="sso_rules",
        help_text="A team of the tenant: the rule makes people members of that team (not of the whole tenant).",
    )
    team_role = models.CharField(max_length=16, choices=TeamMembership.Role.choices, blank=True)
    email_domain = models.CharField(
        max_length=200, blank=True, help_text="e.g. example.com: people whose verified email is at this domain."
    )
    group = models.CharField(max_length=200, blank=True, help_text="A value of the provider's groups claim.")

    class Meta:
        ordering = ["tenant__name", "role"]
        verbose_name = "single sign-on rule"

    def __str__(self) -> str:
        who = f"@{self.email_domain}" if self.email_domain else f"group {self.group}"
        if self.team_id is not None:
            return f"{who} → {self.tenant} / team {self.team} ({self.team_role})"
        return f"{who} → {self.tenant} ({self.role})"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if bool(self.email_domain) == bool(self.group):
            raise ValidationError("Name either an email domain or a group, not both.")
        if self.team_id is not None:
            if self.tenant_id is not None and self.team.tenant_id != self.tenant_id:
                raise ValidationError({"team": "A team of the rule's own tenant."})
            if not self.team_role:
                raise ValidationError({"team_role": "A rule naming a team gives a team role: choose one."})
            if self.role:
                raise ValidationError({"role": "A rule naming a team gives the team role alone: leave this empty."})
        elif self.team_role:
            raise ValidationError({"team": "A team role needs a team."})
        elif not self.role:
            raise ValidationError({"role": "Choose the tenant role the rule gives (or name a team)."})
        self.email_domain = self.email_domain.strip().lstrip("@").lower()


class SingleSignOnIdentity(models.Model):
    """The console account a provider's subject signs in as. Accounts are matched by the provider's
    stable subject, never by email: a provider account with an operator's email address must not
    become the operator."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity")
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique_subject")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
