"""Authenticate a virtual key: in-process cache, then Redis, then Postgres.

Revocation and suspension take effect on the next request in every process: whatever the caches
hold, each request checks the key's and tenant's block markers in Redis (the same round trip that
reads the configuration generation, see sentinel.localstate).

While Postgres is away, a key is served by the settings last read for it: this process's expired
copy, else the last-known copy in Redis (kept as long as a block marker lives, so no copy can
outlive the marker of a revocation made after it was read). A key read by no process gets a 503.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass

import orjson
from django.conf import settings
from django.db.models import Q

from gateway.errors import DATABASE_UNAVAILABLE, GatewayError
from gateway.screening.policy import Policy, policy_from_model
from sentinel import redis_keys
from sentinel.localstate import (
    DatabaseUnavailable,
    TTLCache,
    blocked_key_marker,
    blocked_tenant_marker,
    current_generation,
    from_database,
)
from sentinel.redis_clients import UNREACHABLE, async_redis, is_cluster
from tenants.models import Budget, EndUserLimit, Tenant, VirtualKey
from tenants.services import BLOCK_MARKER_SECONDS, key_digest

REDIS_TTL_SECONDS = 60
_local = TTLCache(ttl=settings.KEY_CACHE_SECONDS, maxsize=50_000)


@dataclass(frozen=True)
class KeyInfo:
    """What the request path needs to know about a key, cached as a unit."""

    key_id: int
    digest: str
    key_name: str
    tenant_id: int
    tenant_slug: str
    key_active: bool
    tenant_active: bool
    expires_at: float | None  # unix time
    allowed_models: tuple[str, ...] | None  # None: every model
    key_limits: tuple[tuple[str, int], ...] = ()  # (rpm|tpm|concurrency, limit)
    tenant_limits: tuple[tuple[str, int], ...] = ()
    # (budget id, key id or None for the tenant's or team's, period, limit in USD, alert percent, hard,
    # team id or None for the key's or tenant's)
    budgets: tuple[tuple[int, int | None, str, str, int | None, bool, int | None], ...] = ()
    team_id: int | None = None  # the key's team (tenants.Team); None: a key of no team
    team_name: str = ""
    team_limits: tuple[tuple[str, int], ...] = ()
    team_allowed_models: tuple[str, ...] | None = None  # the team's own list (None: no list): for errors
    # What each end user or session of the key may use (tenants.EndUserLimit): (limit id, the key it is
    # set on, end_user | session, period, limit in USD or None, token cap or None)
    end_user_limits: tuple[tuple[int, int, str, str, str | None, int | None], ...] = ()
    fail_open: bool = True  # what admission does while Redis is unreachable
    cache_enabled: bool = True
    semantic_cache_enabled: bool = True
    semantic_threshold: float | None = None
    shadow_share: float = 0.0  # fraction of semantic hits also asked of the provider (gateway/cache/shadow.py)
    cache_ttl_seconds: int = 86_400
    cache_max_entries: int = 50_000
    auto_fast_model: str = "fast"  # where model "auto" sends simple prompts
    auto_smart_model: str = "smart"  # ... and demanding ones; refusals escalate to it
    escalate_refusals: bool = False
    on_saturation: str = "reject"  # a saturated self-hosted deployment: "reject" (go on) or "queue" (wait)
    saturation_wait_ms: int = 2000
    budget_fallback_model: str = ""  # a cheaper alias once a hard budget is nearly spent ("": off)
    budget_fallback_percent: int = 90
    content_policy_model: str = ""  # asked when the providers refuse under their content policy ("": off)
    log_prompts: bool = False  # the request log carries messages and answers
    screening: Policy | None = None  # None: the tenant is not screened

    def may_use(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models

    @classmethod
    def from_json(cls, data: dict) -> KeyInfo:
        """Rebuild from the Redis copy (JSON turned the tuples into lists)."""
        if data["allowed_models"] is not None:
            data["allowed_models"] = tuple(data["allowed_models"])
        if data.get("team_allowed_models") is not None:
            data["team_allowed_models"] = tuple(data["team_allowed_models"])
        for name in ("key_limits", "tenant_limits", "team_limits", "budgets", "end_user_limits"):
            data[name] = tuple(tuple(item) for item in data.get(name, ()))
        # A copy written before teams (a rolling deploy, the last-known copy) has no budget's team.
        data["budgets"] = tuple(budget if len(budget) == 7 else (*budget, None) for budget in data["budgets"])
        if data.get("screening") is not None:
            data["screening"] = Policy.from_json(data["screening"])
        return cls(**data)


def _redis_cache_key(digest: str) -> str:
    """Copies are kept per configuration generation: a change anywhere (a key's expiry, limits,
    budgets) retires every copy, as it does the in-process caches."""
    return redis_keys.key_info(current_generation().decode(), digest)


def effective_allowlist(
    tenant_models: list[str], key_models: list[str], *, team_models: list[str] = ()
) -> tuple[str, ...] | None:
    """A team can narrow its tenant's list, and a key its team's (or tenant's), never widen it.
    Empty lists mean no restriction."""
    allowed: tuple[str, ...] | None = None
    for models in (tenant_models, team_models, key_models):
        if models:
            allowed = tuple(models) if allowed is None else tuple(m for m in models if m in allowed)
    return allowed


def _load_from_db(digest: str) -> KeyInfo | None:
    from gateway.screening.models import ScreeningPolicy

    key = VirtualKey.objects.select_related("tenant__tier", "tier", "team__tier").filter(digest=digest).first()
    if key is None:
        return None
    # A rotated key is bound by its budgets, which moved to its successor(s), until it expires.
    key_ids = [key.pk]
    successor = key.successor_id
    while successor is not None and successor not in key_ids:
        key_ids.append(successor)
        successor = VirtualKey.objects.filter(pk=successor).values_list("successor_id", flat=True).first()
    team = key.team
    # The tenant's budgets, the key's team's (none of another team's), and the key's own.
    budgets = Budget.objects.filter(tenant_id=key.tenant_id).filter(
        Q(key__isnull=True, team__isnull=True) | Q(key__isnull=True, team_id=key.team_id) | Q(key_id__in=key_ids)
    )
    return KeyInfo(
        key_id=key.pk,
        digest=digest,
        key_name=key.name,
        tenant_id=key.tenant_id,
        tenant_slug=key.tenant.slug,
        key_active=key.status == VirtualKey.Status.ACTIVE,
        tenant_active=key.tenant.status == Tenant.Status.ACTIVE,
        expires_at=key.expires_at.timestamp() if key.expires_at else None,
        allowed_models=effective_allowlist(
            key.tenant.allowed_models, key.allowed_models, team_models=team.allowed_models if team else []
        ),
        key_limits=tuple(sorted(key.effective_limits().items())),
        tenant_limits=tuple(sorted(key.tenant.effective_limits().items())),
        team_id=key.team_id,
        team_name=team.name if team else "",
        team_limits=tuple(sorted(team.effective_limits().items())) if team else (),
        team_allowed_models=tuple(team.allowed_models) if team and team.allowed_models else None,
        budgets=tuple(
            (b.pk, b.key_id, b.period, str(b.limit_usd), b.alert_at_percent, b.hard, b.team_id)
            for b in budgets.order_by("pk")
        ),
        end_user_limits=tuple(
            (
                limit.pk,
                limit.key_id,
                limit.scope,
                limit.period,
                None if limit.limit_usd is None else str(limit.limit_usd),
                limit.token_cap,
            )
            for limit in EndUserLimit.objects.filter(key_id__in=key_ids).order_by("pk")
        ),
        fail_open=key.tenant.on_redis_outage == Tenant.RedisOutage.FAIL_OPEN,
        cache_enabled=key.tenant.cache_enabled,
        semantic_cache_enabled=key.tenant.semantic_cache_enabled,
        semantic_threshold=key.tenant.semantic_threshold,
        shadow_share=float(key.tenant.shadow_share) / 100,
        cache_ttl_seconds=key.tenant.cache_ttl_seconds,
        cache_max_entries=key.tenant.cache_max_entries,
        auto_fast_model=key.tenant.auto_fast_model,
        auto_smart_model=key.tenant.auto_smart_model,
        escalate_refusals=key.tenant.escalate_refusals,
        on_saturation=key.tenant.on_saturation,
        saturation_wait_ms=key.tenant.saturation_wait_ms,
        budget_fallback_model=key.tenant.budget_fallback_model,
        budget_fallback_percent=key.tenant.budget_fallback_percent,
        content_policy_model=key.tenant.content_policy_model,
        log_prompts=key.tenant.log_prompts,
        screening=policy_from_model(ScreeningPolicy.objects.filter(tenant_id=key.tenant_id).first()),
    )


async def _lookup(digest: str) -> KeyInfo | None:
    info = _local.get(digest)
    if info is not None:
        return info
    redis = async_redis()
    # Named once, before the database is read: a copy is filed under the generation it was read in.
    cache_key = _redis_cache_key(digest)
    try:
        raw = await redis.get(cache_key)
    except UNREACHABLE:
        raw, redis = None, None  # Redis is down: the database still knows the key
    if raw is not None:
        data = orjson.loads(raw)
        if data is None:
            return None  # remembered miss: a wrong key does not reach the database twice
        info = KeyInfo.from_json(data)
    else:
        try:
            info = await from_database(_load_from_db, digest)
        except DatabaseUnavailable:
            return await _last_known(digest, redis)
        if redis is not None:
            copy = orjson.dumps(asdict(info) if info else None)
            with contextlib.suppress(*UNREACHABLE):
                async with redis.pipeline(transaction=False) as pipe:
                    pipe.set(cache_key, copy, ex=REDIS_TTL_SECONDS if info else 5)
                    if info is not None:
                        pipe.set(redis_keys.key_info_last_known(digest), copy, ex=BLOCK_MARKER_SECONDS)
                    await pipe.execute()
    if info is not None:
        _local.set(digest, info)
    return info


async def _last_known(digest: str, redis) -> KeyInfo:
    """The key's settings as last read, with the database away; 503 when no process ever read them."""
    info = _local.stale(digest)
    if info is None and redis is not None:
        with contextlib.suppress(*UNREACHABLE):
            raw = await redis.get(redis_keys.key_info_last_known(digest))
            if raw is not None:
                info = KeyInfo.from_json(orjson.loads(raw))
    if info is None:
        raise DATABASE_UNAVAILABLE
    return info


def bearer_secret(authorization: str | None, x_api_key: str | None) -> str | None:
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    if x_api_key:
        return x_api_key.strip() or None
    return None


INVALID_KEY = "Invalid API key. Check the key you passed in the Authorization header."
# Sentinel's secrets are 50 characters (tenants.services.key_create). A longer one is not a key
# Sentinel issued: it is refused as it is, never hashed or looked up.
MAX_SECRET_CHARS = 128


async def authenticate(authorization: str | None, x_api_key: str | None) -> KeyInfo:
    secret = bearer_secret(authorization, x_api_key)
    if secret is None:
        raise GatewayError(
            401,
            "invalid_api_key",
            "Missing API key. Pass your Sentinel virtual key as 'Authorization: Bearer <key>'.",
        )
    if len(secret) > MAX_SECRET_CHARS:
        raise GatewayError(401, "invalid_api_key", INVALID_KEY)
    return await authenticate_digest(key_digest(secret))


async def authenticate_digest(digest: str) -> KeyInfo:
    """The key with this digest, checked like a presented secret: for work queued under a key whose
    secret Sentinel never kept (batches)."""
    info = await _lookup(digest)
    if info is None:
        raise GatewayError(401, "invalid_api_key", INVALID_KEY)
    if not info.key_active:
        raise GatewayError(401, "invalid_api_key", "This API key has been revoked.")
    if info.expires_at is not None and info.expires_at <= time.time():
        raise GatewayError(401, "invalid_api_key", "This API key has expired.")
    if not info.tenant_active:
        raise GatewayError(403, "tenant_suspended", "This key's tenant is suspended.")
    return info


def block_markers(info: KeyInfo) -> tuple[str, str]:
    return blocked_key_marker(info.digest, info.tenant_id), blocked_tenant_marker(info.tenant_id)


async def ensure_not_blocked(info: KeyInfo) -> None:
    """Check the key's and tenant's block markers (and the configuration generation) in Redis.
    Admission does this in its own step; this is for requests that never get there."""
    from sentinel.localstate import GENERATION_KEY, observe_generation

    client = async_redis()
    try:
        if is_cluster():  # the generation and the tenant's markers are in different slots
            generation, key_blocked, tenant_blocked = await client.mget_nonatomic(GENERATION_KEY, *block_markers(info))
        else:
            generation, key_blocked, tenant_blocked = await client.mget(GENERATION_KEY, *block_markers(info))
    except UNREACHABLE:
        return
    observe_generation(generation)
    if key_blocked:
        raise GatewayError(401, "invalid_api_key", "This API key has been revoked.")
    if tenant_blocked:
        raise GatewayError(403, "tenant_suspended", "This key's tenant is suspended.")
