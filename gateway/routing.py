"""Resolve the model a client asked for to an ordered chain of deployments."""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal
from itertools import groupby

from asgiref.sync import sync_to_async

from gateway import transport
from gateway.errors import GatewayError
from gateway.localstate import TTLCache
from gateway.models import ChainEntry, ModelAlias, Provider

_chains = TTLCache(ttl=30.0, maxsize=10_000)


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
    input_price_override: Decimal | None
    output_price_override: Decimal | None
    fast: transport.FastRoute | None  # set when the fast path serves this deployment


def _load_chain(alias: str) -> tuple[Target, ...] | None:
    if not ModelAlias.objects.filter(name=alias).exists():
        return None
    entries = (
        ChainEntry.objects.filter(alias__name=alias, deployment__enabled=True)
        .select_related("deployment__provider")
        .order_by("position", "id")
    )
    targets = []
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
                input_price_override=deployment.input_price_override,
                output_price_override=deployment.output_price_override,
                fast=fast,
            )
        )
    return tuple(targets)


async def chain_for(alias: str) -> tuple[Target, ...]:
    """The alias's deployments in chain order. 404 when no such model exists."""
    chain = _chains.get(alias)
    if chain is None:
        chain = await sync_to_async(_load_chain)(alias)
        _chains.set(alias, chain if chain is not None else ())
    if not chain:
        raise GatewayError(
            404,
            "model_not_found",
            f"The model '{alias}' does not exist or has no enabled deployment.",
            param="model",
        )
    return chain


def order_for_request(chain: tuple[Target, ...], rng: random.Random = random) -> list[Target]:
    """Chain order, with deployments that share a position shuffled by weight for this request."""
    ordered: list[Target] = []
    for _, group in groupby(chain, key=lambda t: t.position):
        peers = list(group)
        while peers:
            pick = rng.choices(peers, weights=[max(t.weight, 0) or 1e-9 for t in peers])[0]
            ordered.append(pick)
            peers.remove(pick)
    return ordered


def model_names() -> list[str]:
    return list(ModelAlias.objects.filter(chain__deployment__enabled=True).distinct().values_list("name", flat=True))
