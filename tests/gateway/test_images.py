"""POST /v1/images/generations end to end: the official OpenAI SDK against a real gateway process,
which reaches the mock provider directly (OpenAI's format) or through litellm.aimage_generation:
per-image prices in the ledger, failover, allowlists, budgets, screening of the prompt, bad input."""

from __future__ import annotations

import base64
from decimal import Decimal

import httpx
import openai
import pytest
from openai import OpenAI

from gateway.images import IMAGE_PARAMETERS, UNSUPPORTED_PARAMETERS
from gateway.limits.admission import to_units
from gateway.mock_dialects import image_of
from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
from gateway.screening.models import ScreeningPolicy
from tenants.models import Budget, VirtualKey
from tests.conftest import unique
from tests.gateway.limits.test_admission import holds
from tests.gateway.test_dialect_chains import ledger_rows

IMAGE_MODEL = "openai/gpt-image-1"
# litellm's bundled map: gpt-image-1 per image by quality and size.
LOW_1024X1536 = Decimal("0.016")
HIGH_1024X1024 = Decimal("0.167")  # the dearest quality at the default size: "auto" is billed at it


@pytest.fixture
def image_chain(live_db, mock_provider):
    """make(*transports) -> (alias, [provider names]): an image model served by one virtual provider
    of the mock per deployment, in chain order, each called by the given transport."""

    def make(*transports: str) -> tuple[str, list[str]]:
        alias = ModelAlias.objects.create(name=unique("image"))
        names = []
        for position, transport in enumerate(transports or ("auto",)):
            name = unique("img")
            provider = Provider(name=name, api_base=mock_provider.api_base(name), max_retries=0, transport=transport)
            provider.set_api_key("sk-test-" + name)
            provider.save()
            deployment = Deployment.objects.create(name=name, provider=provider, litellm_model=IMAGE_MODEL)
            ChainEntry.objects.create(alias=alias, deployment=deployment, position=position)
            names.append(name)
        return alias.name, names

    return make


def test_the_allowlist_is_openais_request_schema_less_streaming_and_video():
    """The official SDK's ImageGenerateParams: each parameter is served or refused by name (a new
    SDK with a new parameter fails this test: decide which it is). `stream` is its streamed variant's."""
    from openai.types.image_generate_params import ImageGenerateParamsBase

    sdk = set(ImageGenerateParamsBase.__annotations__) | {"stream"}
    assert sdk == IMAGE_PARAMETERS | UNSUPPORTED_PARAMETERS
    assert not IMAGE_PARAMETERS & UNSUPPORTED_PARAMETERS


def test_the_sdk_generates_images_billed_per_image_in_the_ledger(gateway, tenant, make_key, image_chain, mock_provider):
    model, (provider,) = image_chain()
    key = make_key(tenant)
    key_id = VirtualKey.objects.get(tenant=tenant).pk
    budget = Budget.objects.create(tenant=tenant, period="daily", limit_usd=Decimal("5"))
    client = OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)

    raw = client.images.with_raw_response.generate(
        model=model, prompt="a red fox", n=2, size="1024x1536", quality="low"
    )
    answer = raw.parse()
    assert [base64.b64decode(item.b64_json) for item in answer.data] == [image_of("a red fox", i) for i in (0, 1)]
    assert (answer.size, answer.quality) == ("1024x1536", "low")
    assert raw.headers["x-sentinel-provider"] == provider
    assert Decimal(raw.headers["x-sentinel-cost-usd"]) == 2 * LOW_1024X1536
    # Called directly, as embeddings are: with the request's id, and only what the client asked for.
    stats = mock_provider.stats(provider)
    assert stats["last_request_id"] == raw.headers["x-sentinel-request-id"]
    assert '"model":"gpt-image-1"' in stats["last_body"] and '"quality":"low"' in stats["last_body"]

    # A data URL when asked for one; the quality left to the provider is billed at the dearest.
    as_url = client.images.with_raw_response.generate(model=model, prompt="a blue owl", response_format="url")
    (image,) = as_url.parse().data
    assert image.url == "data:image/png;base64," + base64.b64encode(image_of("a blue owl")).decode()
    assert Decimal(as_url.headers["x-sentinel-cost-usd"]) == HIGH_1024X1024

    ids = [r.headers["x-sentinel-request-id"] for r in (raw, as_url)]
    rows = ledger_rows(ids)
    first, second = rows[ids[0]], rows[ids[1]]
    assert (first.status_code, first.tenant_id, first.model_requested, first.model_served, first.provider) == (
        200,
        tenant.pk,
        model,
        IMAGE_MODEL,
        provider,
    )
    assert (first.images, first.cost_usd, first.prompt_tokens, first.cache_tier) == (2, Decimal("0.032"), 0, "bypass")
    assert (second.images, second.cost_usd) == (1, HIGH_1024X1024)
    # The reservations (n images at the dearest price) settled to what was billed.
    spent = to_units(2 * LOW_1024X1536 + HIGH_1024X1024)
    assert holds(key_id, budget) == {"in_flight": 0, "tokens": 0, "reserved": 0, "spent": spent}


def test_a_failing_deployment_fails_over_to_one_called_through_litellm(gateway, api_key, image_chain, mock_provider):
    model, (first, second) = image_chain("auto", "litellm")
    mock_provider.control(first, error_rate=1.0, error_status=503)
    Deployment.objects.filter(name=second).update(image_price_override=Decimal("0.05"))
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30)
    raw = client.images.with_raw_response.generate(model=model, prompt="a green frog", n=3, quality="high")
    assert (raw.headers["x-sentinel-provider"], raw.headers["x-sentinel-fallbacks"]) == (second, "1")
    images = [base64.b64decode(item.b64_json) for item in raw.parse().data]
    assert images == [image_of("a green frog", i) for i in range(3)]
    assert [mock_provider.stats(p)["calls"] for p in (first, second)] == [1, 1]
    row = ledger_rows([raw.headers["x-sentinel-request-id"]])[raw.headers["x-sentinel-request-id"]]
    # The deployment's own price per image, not the map's 0.167.
    assert (row.deployment, row.images, row.cost_usd, row.fallback_reasons) == (
        second,
        3,
        Decimal("0.15"),
        f"{first}=server_error",
    )


def test_allowlists_budgets_and_another_tenant(gateway, make_tenant, make_key, image_chain, mock_provider):
    model, (provider,) = image_chain()
    other, _ = image_chain()
    tenant = make_tenant()
    limited = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant, allowed_models=[other]), max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        limited.images.generate(model=model, prompt="x")
    assert (refused.value.body["code"], refused.value.body["param"]) == ("model_not_allowed", "model")
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=gateway.base_url, api_key="sk-sen-wrong", max_retries=0).images.generate(
            model=model, prompt="x"
        )

    # Four high-quality images could cost 0.668: more than the tenant's daily budget of 0.5 covers.
    Budget.objects.create(tenant=tenant, period="daily", limit_usd=Decimal("0.5"))
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        client.images.generate(model=model, prompt="x", n=4)
    assert (refused.value.status_code, refused.value.body["code"]) == (402, "budget_exceeded")
    assert mock_provider.stats(provider)["calls"] == 0
    # Another tenant, without that budget, is served the same request.
    neighbour = OpenAI(base_url=gateway.base_url, api_key=make_key(make_tenant()), max_retries=0)
    assert len(neighbour.images.generate(model=model, prompt="x", n=4).data) == 4
    assert mock_provider.stats(provider)["calls"] == 1


def test_the_tenants_screening_sees_the_prompt(gateway, make_tenant, make_key, image_chain, mock_provider):
    model, (provider,) = image_chain()
    tenant = make_tenant()
    ScreeningPolicy.objects.create(tenant=tenant, email="block")
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.generate(model=model, prompt="a portrait of ann.meyer@example.com")
    error = refused.value.response.json()["error"]
    assert (error["code"], error["param"]) == ("content_policy_violation", "prompt")
    assert "ann.meyer" not in error["message"]
    assert mock_provider.stats(provider)["calls"] == 0


BAD_INPUT = [
    ({"prompt": ""}, "invalid_value", "prompt"),
    ({"prompt": "a\u0000b"}, "invalid_value", "prompt"),
    ({"prompt": 5}, "invalid_type", "prompt"),
    ({}, "missing_required_parameter", "prompt"),
    ({"prompt": "a", "n": 0}, "invalid_value", "n"),
    ({"prompt": "a", "n": 11}, "invalid_value", "n"),
    ({"prompt": "a", "size": "huge"}, "invalid_value", "size"),
    ({"prompt": "a", "size": "10x10"}, "invalid_value", "size"),
    ({"prompt": "a", "size": "1024x99999"}, "invalid_value", "size"),
    ({"prompt": "a", "quality": "ultra"}, "invalid_value", "quality"),
    ({"prompt": "a", "response_format": "gif"}, "invalid_value", "response_format"),
    ({"prompt": "a", "user": "me\u0007"}, "invalid_value", "user"),
    ({"prompt": "a", "api_base": "http://127.0.0.1:9"}, "unknown_parameter", "api_base"),
    ({"prompt": "a", "api_key": "sk-mine"}, "unknown_parameter", "api_key"),
    ({"prompt": "a", "stream": True}, "unsupported_parameter", "stream"),
]


def test_bad_input_is_a_400_in_openais_shape(gateway, api_key, image_chain, mock_provider):
    model, (provider,) = image_chain()
    for body, code, param in BAD_INPUT:
        response = httpx.post(
            f"{gateway.base_url}/images/generations",
            headers={"authorization": f"Bearer {api_key}"},
            json={"model": model, **body},
            timeout=30,
        )
        assert response.status_code == 400, body
        error = response.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param), body
        assert set(error) == {"message", "type", "param", "code"}
    assert mock_provider.stats(provider)["calls"] == 0
