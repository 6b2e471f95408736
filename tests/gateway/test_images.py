"""POST /v1/images/generations end to end: the official OpenAI SDK against a real gateway process,
which reaches the mock provider directly (OpenAI's format) or through litellm.aimage_generation:
per-image prices in the ledger, failover, allowlists, budgets, screening of the prompt, bad input."""

from __future__ import annotations

import base64
import hashlib
import json
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
from tests.servers import Listener

IMAGE_MODEL = "openai/gpt-image-1"
# litellm's bundled map: gpt-image-1 per image by quality and size.
LOW_1024X1536 = Decimal("0.016")
HIGH_1024X1024 = Decimal("0.167")
LOW_1024X1024 = Decimal("0.011")  # the dearest quality at the default size: "auto" is billed at it


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


# --- screening the images once made ----------------------------------------------------------------


@pytest.fixture
def image_guardrail(live_db):
    """A guardrail on 127.0.0.1 that allows every prompt and, once the images are made, blocks those
    of a prompt holding "withhold", answers 500 to one holding "outage" and redacts "Lisbon" from a
    revised prompt, or "Porto" from the prompt itself; its requests are kept."""

    def respond(path: str, headers: dict, body: bytes) -> tuple[int, bytes]:
        sent = json.loads(body)
        if sent["stage"] == "input":
            return 200, b'{"action": "allow"}'
        prompt = sent["texts"][0]["text"]
        if "outage" in prompt:
            return 500, b""
        if "withhold" in prompt:
            return 200, b'{"action": "block"}'
        if "Porto" in prompt:  # a span of the prompt itself
            start = prompt.index("Porto")
            return 200, json.dumps(
                {"action": "redact", "redactions": [{"id": 0, "start": start, "end": start + 5}]}
            ).encode()
        redactions = [
            {"id": t["id"], "start": t["text"].index("Lisbon"), "end": t["text"].index("Lisbon") + 6}
            for t in sent["texts"][1:]
            if "Lisbon" in t["text"]
        ]
        return 200, json.dumps(
            {"action": "redact", "redactions": redactions} if redactions else {"action": "allow"}
        ).encode()

    listener = Listener(respond=respond)
    yield listener
    listener.close()


@pytest.fixture
def guarded_images(gateway, make_tenant, make_key, image_chain, image_guardrail):
    """make(**policy) -> (client, model, provider, tenant): images for a tenant whose guardrail is
    image_guardrail, with the policy's other settings."""

    def make(**policy):
        tenant = make_tenant()
        row = ScreeningPolicy(tenant=tenant, guardrail_url=image_guardrail.url("/check"), guardrail_timeout_ms=3000)
        for name, value in policy.items():
            setattr(row, name, value)
        row.set_guardrail_secret("image-guardrail")
        row.save()
        model, (provider,) = image_chain()
        client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0, timeout=30)
        return client, model, provider, tenant

    return make


def output_requests(guardrail: Listener) -> list[dict]:
    return [body for body in (json.loads(call[3]) for call in guardrail.calls) if body["stage"] == "output"]


def test_the_guardrail_sees_the_images_made_and_their_prompt(guarded_images, image_guardrail, mock_provider):
    client, model, provider, _ = guarded_images()
    answer = client.images.generate(model=model, prompt="a red fox", n=2)
    assert [base64.b64decode(item.b64_json) for item in answer.data] == [image_of("a red fox", i) for i in (0, 1)]

    (seen,) = output_requests(image_guardrail)
    assert seen["texts"] == [{"id": 0, "role": "user", "text": "a red fox"}]
    assert seen["images"] == [
        {
            "index": i,
            "format": "png",
            "bytes": len(image_of("a red fox", i)),
            "sha256": hashlib.sha256(image_of("a red fox", i)).hexdigest(),
        }
        for i in (0, 1)
    ]
    # As a data URL, the same facts; the input stage saw the prompt first.
    client.images.generate(model=model, prompt="a blue owl", response_format="url")
    assert output_requests(image_guardrail)[-1]["images"] == [
        {
            "index": 0,
            "format": "png",
            "bytes": len(image_of("a blue owl")),
            "sha256": hashlib.sha256(image_of("a blue owl")).hexdigest(),
        }
    ]
    assert [json.loads(call[3])["stage"] for call in image_guardrail.calls] == ["input", "output"] * 2
    assert mock_provider.stats(provider)["calls"] == 2


def test_images_the_guardrail_blocks_are_withheld_and_billed(guarded_images, image_guardrail, mock_provider):
    client, model, provider, _ = guarded_images()
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.with_raw_response.generate(model=model, prompt="withhold this one", n=2, quality="low")
    error = refused.value.response.json()["error"]
    assert (error["code"], error["param"]) == ("content_policy_violation", None)
    assert error["message"] == "The generated images were withheld by the tenant's content policy (check: guardrail)."
    assert "b64_json" not in refused.value.response.text
    # Made, so billed: the provider charged for them.
    assert Decimal(refused.value.response.headers["x-sentinel-cost-usd"]) == 2 * LOW_1024X1024
    request_id = refused.value.response.headers["x-sentinel-request-id"]
    row = ledger_rows([request_id])[request_id]
    assert (row.status_code, row.error_code, row.images, row.cost_usd) == (
        400,
        "content_policy_violation",
        2,
        2 * LOW_1024X1024,
    )
    assert row.screening["fired"] == [["guardrail", "out", "block"]]
    assert mock_provider.stats(provider)["calls"] == 1


def test_a_guardrail_outage_after_the_images_follows_the_tenants_setting(guarded_images, mock_provider):
    client, model, provider, _ = guarded_images()  # fails closed, the default
    with pytest.raises(openai.InternalServerError) as refused:
        client.images.generate(model=model, prompt="an outage at the guardrail")
    assert mock_provider.stats(provider)["calls"] == 1  # made, then held back
    assert refused.value.status_code == 503
    assert refused.value.response.json()["error"]["code"] == "screening_unavailable"
    request_id = refused.value.response.headers["x-sentinel-request-id"]
    row = ledger_rows([request_id])[request_id]
    assert (row.status_code, row.images, row.screening["outages"]) == (503, 1, [["guardrail", "out", "closed"]])

    client, model, _, _ = guarded_images(guardrail_outage="open")
    answer = client.images.with_raw_response.generate(model=model, prompt="an outage at the guardrail")
    assert base64.b64decode(answer.parse().data[0].b64_json) == image_of("an outage at the guardrail")
    row = ledger_rows([answer.headers["x-sentinel-request-id"]])[answer.headers["x-sentinel-request-id"]]
    assert (row.status_code, row.screening["outages"]) == (200, [["guardrail", "out", "open"]])


def test_revised_prompts_are_screened_as_output(guarded_images, image_guardrail, mock_provider):
    """A revised prompt is text the provider wrote: the output checks redact it, and the guardrail
    may too (a span of the client's own prompt cannot be taken out of the image: that blocks)."""
    client, model, _, _ = guarded_images(email="off", output_personal_data="redact")  # the provider gets it
    raw = client.images.with_raw_response.generate(
        model=model, prompt="a postcard from Lisbon to ann.meyer@example.com", style="vivid", n=2
    )
    answer = raw.parse()
    assert [item.revised_prompt for item in answer.data] == [
        "a postcard from [REDACTED] to [EMAIL], in a vivid style"
    ] * 2
    (seen,) = output_requests(image_guardrail)
    # The guardrail saw the revised prompts after the local redaction, never the address.
    assert [t["role"] for t in seen["texts"]] == ["user", "revised_prompt", "revised_prompt"]
    assert "ann.meyer" not in json.dumps(seen["texts"][1:])
    request_id = raw.headers["x-sentinel-request-id"]
    row = ledger_rows([request_id])[request_id]
    assert sorted(row.screening["fired"]) == [["email", "out", "redact"], ["guardrail", "out", "redact"]]

    with pytest.raises(openai.BadRequestError) as refused:
        client.images.generate(model=model, prompt="a postcard from Porto", style="vivid")
    assert refused.value.response.json()["error"]["code"] == "content_policy_violation"
