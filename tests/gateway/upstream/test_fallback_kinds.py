"""Fallbacks by kind of failure: each chain says which failures go on to the next deployment and
which go back to the client, driven through the mock's fault switches over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from gateway.models import BreakerPolicy, Deployment, ModelAlias
from gateway.upstream.breakers import breaker_snapshot
from sentinel.localstate import announce_change
from tests.conftest import unique
from tests.gateway.test_dialect_chains import ledger_rows

CONTEXT = "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens."
# kind: (the alias's switch, the primary's faults, the code the client gets when the kind is returned)
KINDS = {
    "timeout": ("fallback_on_timeout", {"stall_ms": 3000}, 504, "upstream_timeout"),
    "server_error": ("fallback_on_server_error", {"error_rate": 1.0, "error_status": 503}, 502, "provider_error_503"),
    "rate_limited": (
        "fallback_on_rate_limit",
        {"error_rate": 1.0, "error_status": 429, "retry_after": 30},
        429,
        "provider_rate_limited",
    ),
    "context_window": (
        "fallback_on_context_window",
        {"error_rate": 1.0, "error_status": 400, "error_code": "context_length_exceeded", "error_message": CONTEXT},
        400,
        "context_length_exceeded",
    ),
    "content_policy": (
        "fallback_on_content_policy",
        {"error_rate": 1.0, "error_status": 400, "error_code": "content_policy_violation", "error_message": "no"},
        400,
        "content_policy_violation",
    ),
}


def post(gateway, key: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"},
        json={"model": model, "messages": [{"role": "user", "content": "hello"}]},
        timeout=30,
    )


@pytest.mark.parametrize("falls_over", [True, False], ids=["falls-over", "returned"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_of_failure_falls_over_or_is_returned_as_the_chain_says(
    gateway, api_key, make_model, mock_provider, kind, falls_over
):
    switch, faults, status, code = KINDS[kind]
    model, (primary, secondary) = make_model(chain_length=2, timeout_seconds=0.5, max_retries=0)
    # One failure would open a breaker that counts it.
    policy = BreakerPolicy.objects.create(name=unique("policy"), minimum_calls=1, failure_rate_percent=50)
    Deployment.objects.filter(name__in=[primary, secondary]).update(breaker_policy=policy)
    if kind == "context_window":  # only a larger window is worth trying (1M tokens in litellm's map)
        Deployment.objects.filter(name=secondary).update(litellm_model="openai/gpt-4.1-mini")
    ModelAlias.objects.filter(name=model).update(**{switch: falls_over})
    announce_change()
    mock_provider.control(primary, **faults)

    response = post(gateway, api_key, model)
    if falls_over:
        assert response.status_code == 200
        assert (response.headers["x-sentinel-provider"], response.headers["x-sentinel-fallbacks"]) == (secondary, "1")
        assert response.headers["x-sentinel-fallback-reasons"] == f"{primary}={kind}"
        assert mock_provider.stats(secondary)["calls"] == 1
    else:
        assert response.status_code == status
        assert response.json()["error"]["code"] == code
        assert mock_provider.stats(secondary)["calls"] == 0
    assert mock_provider.stats(primary)["calls"] == 1
    if kind == "rate_limited" and not falls_over:
        assert response.headers["retry-after"] == "30"
    # Only a provider's own failures count against its breaker: not its 429, not the request's fault.
    opened = kind in ("timeout", "server_error")
    assert breaker_snapshot(Deployment.objects.get(name=primary).pk)["state"] == ("open" if opened else "closed")


def test_a_prompt_over_the_context_window_goes_to_a_larger_one(gateway, api_key, make_model, mock_provider):
    """gpt-4o-mini (128k) fails; gpt-4 (8k) is passed over; gpt-4.1-mini (1M, litellm's map) answers."""
    model, (small, smaller, larger) = make_model(chain_length=3)
    Deployment.objects.filter(name=smaller).update(litellm_model="openai/gpt-4")
    Deployment.objects.filter(name=larger).update(litellm_model="openai/gpt-4.1-mini")
    ModelAlias.objects.filter(name=model).update(fallback_on_context_window=True)
    announce_change()
    mock_provider.control(small, **KINDS["context_window"][1])
    response = post(gateway, api_key, model)
    assert response.status_code == 200
    assert (response.headers["x-sentinel-provider"], response.headers["x-sentinel-fallbacks"]) == (larger, "2")
    assert response.headers["x-sentinel-fallback-reasons"] == f"{small}=context_window, {smaller}=context_window"
    assert [mock_provider.stats(name)["calls"] for name in (small, smaller, larger)] == [1, 0, 1]
    row = ledger_rows([response.headers["x-sentinel-request-id"]])[response.headers["x-sentinel-request-id"]]
    assert (row.deployment, row.fallbacks) == (larger, 2)
    assert row.fallback_reasons == f"{small}=context_window, {smaller}=context_window"


REFUSE = KINDS["content_policy"][1]


@pytest.mark.parametrize("chain_falls_over", [False, True], ids=["chain-returns-it", "every-deployment-refuses"])
def test_a_content_policy_refusal_is_asked_of_the_tenants_alternative_model(
    gateway, tenant, make_key, make_model, mock_provider, chain_falls_over
):
    """The tenant names a model for what its providers refuse under their content policy: whether the
    chain returns the first refusal or every deployment refuses, the alternative answers, reserved for
    at admission and billed as what answered; the reason is on the headers and the ledger row."""
    model, refusing = make_model(chain_length=2 if chain_falls_over else 1)
    alternative, (other,) = make_model()
    ModelAlias.objects.filter(name=model).update(fallback_on_content_policy=chain_falls_over)
    tenant.content_policy_model = alternative
    tenant.save()
    announce_change()
    for name in refusing:
        mock_provider.control(name, **REFUSE)

    response = post(gateway, make_key(tenant), model)
    assert response.status_code == 200, response.text
    assert response.headers["x-sentinel-provider"] == other
    # Passed over in the chain when it fails over on refusals (each one); then the model itself.
    reasons = [f"{name}=content_policy" for name in refusing if chain_falls_over] + [f"{model}=content_policy"]
    assert response.headers["x-sentinel-fallback-reasons"] == ", ".join(reasons)
    assert [mock_provider.stats(name)["calls"] for name in [*refusing, other]] == [1] * len(refusing) + [1]
    request_id = response.headers["x-sentinel-request-id"]
    row = ledger_rows([request_id])[request_id]
    assert (row.model_requested, row.deployment, row.status_code) == (model, other, 200)
    assert row.fallback_reasons == ", ".join(reasons)


def test_the_refusal_stands_when_the_key_may_not_use_the_alternative(
    gateway, tenant, make_key, make_model, mock_provider
):
    model, (refusing,) = make_model()
    alternative, (other,) = make_model()
    tenant.content_policy_model = alternative
    tenant.save()
    announce_change()
    mock_provider.control(refusing, **REFUSE)

    response = post(gateway, make_key(tenant, allowed_models=[model]), model)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "content_policy_violation"
    assert "x-sentinel-fallback-reasons" not in response.headers
    assert (mock_provider.stats(refusing)["calls"], mock_provider.stats(other)["calls"]) == (1, 0)
