"""What screening needs that must not travel in the cached key settings: the moderation provider's
credentials and the guardrail's signing secret, read from Postgres once per process and kept like
every other configuration cache (dropped when the configuration generation moves)."""

from __future__ import annotations

from gateway.errors import database_required
from gateway.screening.moderation import ModerationProvider
from gateway.screening.policy import Policy
from sentinel.localstate import TTLCache

_moderation = TTLCache(ttl=60.0, maxsize=1_000)
_guardrail_secrets = TTLCache(ttl=60.0, maxsize=10_000)


def _load_moderation_provider(provider_id: int, model: str, timeout: float) -> ModerationProvider | None:
    from gateway.models import Provider

    provider = Provider.objects.filter(pk=provider_id).first()
    if provider is None:
        return None
    kind = provider.kind or "openai"
    return ModerationProvider(
        model=model if "/" in model else f"{kind}/{model}",
        api_base=provider.api_base or None,
        api_key=provider.api_key(),
        timeout=timeout,
    )


async def moderation_provider(policy: Policy) -> ModerationProvider | None:
    if policy.moderation_provider_id is None:
        return None
    key = (policy.moderation_provider_id, policy.moderation_model, policy.moderation_timeout)
    with database_required():
        return await _moderation.read_through(key, _load_moderation_provider, *key)


def _load_guardrail_secret(tenant_id: int) -> str:
    from gateway.screening.models import ScreeningPolicy

    row = ScreeningPolicy.objects.filter(tenant_id=tenant_id).first()
    return row.guardrail_secret() if row else ""


async def guardrail_secret(tenant_id: int) -> str:
    with database_required():
        return await _guardrail_secrets.read_through(tenant_id, _load_guardrail_secret, tenant_id)
