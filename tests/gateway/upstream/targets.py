"""A routing Target made in a test, without a database (the balancer's and the provider layer's tests)."""

from __future__ import annotations

from gateway.upstream.routing import Target


def target(**fields) -> Target:
    """A Target of plain values, with `fields` changed."""
    from gateway.upstream.breakers import DEFAULT_POLICY

    plain = dict(
        deployment_id=0,
        deployment="d",
        provider="p",
        provider_kind="openai",
        litellm_model="openai/gpt-4o-mini",
        api_base=None,
        api_key=None,
        timeout=60.0,
        first_token_timeout=20.0,
        weight=1,
        position=0,
        litellm_params=(),
        fast=None,
        policy=DEFAULT_POLICY,
        forced_state="",
        max_retries=1,
    )
    return Target(**{**plain, **fields})
