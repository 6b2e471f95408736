"""Resolve the model a client asked for to an ordered chain of deployments."""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal
from itertools import groupby

from billing.prices import MAP_KEYS, NO_OVERRIDES, UNPRICED, PriceOverrides, price_at, price_key
from gateway.errors import GatewayError, database_required
from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
from gateway.upstream import transport
from gateway.upstream.balancing import balancer
from gateway.upstream.breakers import Policy
from sentinel.localstate import TTLCache, from_database_sync

_routes = TTLCache(ttl=30.0, maxsize=10_000)
# What a chain fails over on unless its alias says otherwise (gateway.upstream.failures.failure_kind).
DEFAULT_FALLBACK_ON = frozenset({"timeout", "server_error", "rate_limited"})
DEFAULT_MAX_OUTPUT_TOKENS = 4096


@dataclass(frozen=True)
class Target:
    """Everything needed to call one deployment, resolved once and cached."""

    deployment_id: int
    deployment: str
    provider: str
    provider_kind: str
    litellm_model: str
    api_base: str | None
    api_key: str | None
    timeout: float
    first_token_timeout: float
    weight: int
    position: int
    litellm_params: tuple[tuple[str, object], ...]
    fast: transport.FastRoute | None  # set when the fast path serves this deployment
    policy: Policy  # its circuit breaker's
    forced_state: str  # "" | "open" | "closed": an operator's override of its breaker
    max_retries: int  # on this deployment before failing over
    provider_id: int = 0
    spend_cap: Decimal | None = None  # its provider's daily spend cap (USD)
    max_concurrent: int | None = None  # calls in flight at once, across all processes
    self_hosted: bool = False  # its load is sampled and it may be saturated (gateway.upstream.load)
    saturation_queue_limit: int = 0  # requests that may wait for it at once while it is saturated
    fallback_on: frozenset[str] = DEFAULT_FALLBACK_ON  # failure kinds of its chain that fail over
    context_window: int | None = None  # prompt tokens it takes, from litellm's model map
    price_overrides: PriceOverrides = NO_OVERRIDES  # its own prices, over the price table's
    image_price_override: Decimal | None = None  # its own price per image (gateway.images)


@dataclass(frozen=True)
class ModelRoute:
    """A model name as clients ask for it: its chain, its global limits, and what admission needs
    to bound a request's cost before knowing which deployment will serve it."""

    name: str
    targets: tuple[Target, ...]
    limits: tuple[tuple[str, int], ...]  # (rpm|tpm|concurrency, limit), across all tenants
    input_price: Decimal  # the highest in the chain: a fallback may cost more than the first choice
    output_price: Decimal
    max_output_tokens: int

    @property
    def identity(self) -> tuple:
        """What "the same model" means for the cache: the alias and the deployments behind it."""
        return (self.name, tuple(t.litellm_model for t in self.targets))

    def worst_case(self, prompt_tokens: int, max_tokens: int | None, choices: int) -> tuple[int, Decimal]:
        """(tokens, USD) the request can at most consume."""
        completion = (max_tokens or self.max_output_tokens) * choices
        return prompt_tokens + completion, prompt_tokens * self.input_price + completion * self.output_price


def _max_output_tokens(litellm_model: str) -> int:
    import litellm

    for name in price_key(litellm_model):
        info = litellm.model_cost.get(name)
        if info:
            return int(info.get("max_output_tokens") or info.get("max_tokens") or DEFAULT_MAX_OUTPUT_TOKENS)
    return DEFAULT_MAX_OUTPUT_TOKENS


def _load_route(alias: str) -> ModelRoute | None:
    model = ModelAlias.objects.filter(name=alias).first()
    if model is None:
        return None
    targets = _load_chain(model)
    prices = [
        t.price_overrides.over(UNPRICED if t.price_overrides.complete else price_at(t.litellm_model)).highest()
        for t in targets
    ]
    limits = {
        "rpm": model.requests_per_minute,
        "tpm": model.tokens_per_minute,
        "concurrency": model.max_concurrent,
    }
    return ModelRoute(
        name=alias,
        targets=targets,
        limits=tuple((kind, value) for kind, value in limits.items() if value is not None),
        input_price=max((p[0] for p in prices), default=Decimal(0)),
        output_price=max((p[1] for p in prices), default=Decimal(0)),
        max_output_tokens=max(
            (_max_output_tokens(t.litellm_model) for t in targets), default=DEFAULT_MAX_OUTPUT_TOKENS
        ),
    )


def _context_window(litellm_model: str) -> int | None:
    import litellm

    for name in price_key(litellm_model):
        info = litellm.model_cost.get(name)
        if info and (info.get("max_input_tokens") or info.get("max_tokens")):
            return int(info.get("max_input_tokens") or info["max_tokens"])
    return None


def price_overrides(deployment: Deployment) -> PriceOverrides:
    """A deployment's own prices: each `<kind>_price_override` field as the price column it overrides."""
    return PriceOverrides(
        **{column: getattr(deployment, column.replace("per_token", "price_override")) for column in MAP_KEYS}
    )


def fallback_kinds(model: ModelAlias) -> frozenset[str]:
    flags = {
        "timeout": model.fallback_on_timeout,
        "server_error": model.fallback_on_server_error,
        "rate_limited": model.fallback_on_rate_limit,
        "context_window": model.fallback_on_context_window,
        "content_policy": model.fallback_on_content_policy,
    }
    return frozenset(kind for kind, on in flags.items() if on)


def _load_chain(model: ModelAlias) -> tuple[Target, ...]:
    entries = (
        ChainEntry.objects.filter(alias=model, deployment__enabled=True)
        .select_related("deployment__provider", "deployment__breaker_policy")
        .order_by("position", "id")
    )
    targets = []
    fallback_on = fallback_kinds(model)
    for entry in entries:
        deployment = entry.deployment
        provider = deployment.provider
        api_key = provider.api_key()
        fast = None
        if provider.transport == Provider.Transport.AUTO and not provider.litellm_params:
            fast = transport.prepare(deployment.litellm_model, provider.api_base or None, api_key)
        targets.append(
            Target(
                deployment_id=deployment.pk,
                deployment=deployment.name,
                provider=provider.name,
                provider_kind=provider.kind,
                litellm_model=deployment.litellm_model,
                api_base=provider.api_base or None,
                api_key=api_key,
                timeout=provider.timeout_seconds,
                first_token_timeout=provider.first_token_timeout_seconds,
                weight=deployment.weight,
                position=entry.position,
                litellm_params=tuple(sorted(provider.litellm_params.items())),
                fast=fast,
                policy=Policy.from_model(deployment.breaker_policy),
                forced_state=deployment.forced_state,
                max_retries=provider.max_retries,
                provider_id=provider.pk,
                spend_cap=provider.daily_spend_cap_usd,
                max_concurrent=deployment.max_concurrent,
                self_hosted=deployment.self_hosted,
                saturation_queue_limit=deployment.saturation_queue_limit,
                fallback_on=fallback_on,
                context_window=_context_window(deployment.litellm_model),
                price_overrides=price_overrides(deployment),
                image_price_override=deployment.image_price_override,
            )
        )
    return tuple(targets)


async def route_for(alias: str, tenant_id: int | None = None) -> ModelRoute:
    """The model's route, or the kill switch's fallback when one is on for this tenant (or for
    everyone). 404 when no such model exists or none of its deployments is enabled."""
    fallback = await kill_switch_fallback(tenant_id)
    name = fallback or alias
    with database_required():
        route = await _routes.read_through(name, _load_route, name)
    if not route or not route.targets:
        raise GatewayError(
            404,
            "model_not_found",
            f"The model '{alias}' does not exist or has no enabled deployment.",
            param="model",
        )
    return route


_switches = TTLCache(ttl=30.0, maxsize=1)


def _load_switches() -> dict[int | None, str]:
    from gateway.models import KillSwitch

    return dict(KillSwitch.objects.filter(active=True).values_list("tenant_id", "fallback__name"))


async def kill_switch_fallback(tenant_id: int | None) -> str | None:
    """The fallback model name when a kill switch covers this tenant: its own first, else global."""
    with database_required():
        switches = await _switches.read_through("active", _load_switches)
    if not switches:
        return None
    return switches.get(tenant_id) or switches.get(None)


def order_for_request(chain: tuple[Target, ...], rng: random.Random = random) -> list[Target]:
    """Chain order; deployments that share a position are ordered for this request by the balancer
    (power of two choices on latency and calls in flight, weights as priors)."""
    ordered: list[Target] = []
    for _, group in groupby(chain, key=lambda t: t.position):
        ordered.extend(balancer.order(list(group), rng))
    return ordered


_names = TTLCache(ttl=30.0, maxsize=1)


def _model_names() -> list[str]:
    return list(ModelAlias.objects.filter(chain__deployment__enabled=True).distinct().values_list("name", flat=True))


# A web process reads this many models' routes when it starts (sentinel.asgi); others on first use.
PRELOAD_MAX_MODELS = 2_000


def preload() -> int:
    """Read the model list, the kill switches and every model's route (with its prices) into this
    process as last-known copies: what it serves by if the database goes away before any request
    asked for them. They are never served instead of reading the database (the first request still
    reads it). Returns how many routes were read."""

    def read() -> int:
        names = _model_names()
        _names.set_last_known("all", names)
        _switches.set_last_known("active", _load_switches())
        for name in names[:PRELOAD_MAX_MODELS]:
            _routes.set_last_known(name, _load_route(name))
        from billing.prices import clear_cache

        clear_cache()  # the prices the routes read: last-known copies too
        return len(names[:PRELOAD_MAX_MODELS])

    return from_database_sync(read)


async def available_models() -> list[str]:
    """Every model name with an enabled deployment (cached like the routes)."""
    with database_required():
        return await _names.read_through("all", _model_names)
