"""POST /v1/embeddings end to end: the official OpenAI SDK against a real gateway process, which
reaches the mock provider through litellm.aembedding (OpenAI's format, and Gemini's behind a
failover): keys, allowlists, limits and budgets, the ledger, the exact cache, and bad input."""

from __future__ import annotations

import base64
import struct
from decimal import Decimal

import httpx
import openai
import pytest
from openai import OpenAI

from gateway.embeddings import EMBEDDING_PARAMETERS
from gateway.mock_dialects import embedding_of, embedding_usage
from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
from tenants.models import Budget, VirtualKey
from tests.conftest import unique
from tests.gateway.limits.test_admission import holds
from tests.gateway.test_cache import wait_stored
from tests.gateway.test_dialect_chains import ledger_rows

OPENAI_MODEL = "openai/text-embedding-3-small"
GEMINI_MODEL = "gemini/text-embedding-004"
PRICE = Decimal("0.00000002")  # text-embedding-3-small in litellm's bundled price map: $0.02 / 1M tokens
NO_CACHE = {"x-sentinel-cache-control": "no-cache, no-store"}


@pytest.fixture
def embedding_chain(live_db, mock_provider):
    """An embedding model served by deployments of the given formats in chain order, each on its
    own virtual provider of the mock. Returns (alias, [provider names])."""

    def make(*kinds: str) -> tuple[str, list[str]]:
        alias = ModelAlias.objects.create(name=unique("embed"))
        names = []
        for position, kind in enumerate(kinds or ("openai",)):
            name = unique(kind)
            provider = Provider(name=name, kind=kind, api_base=mock_provider.api_base(name, kind), max_retries=0)
            provider.set_api_key("sk-test-" + name)
            provider.save()
            model = OPENAI_MODEL if kind == "openai" else GEMINI_MODEL
            deployment = Deployment.objects.create(name=name, provider=provider, litellm_model=model)
            ChainEntry.objects.create(alias=alias, deployment=deployment, position=position)
            names.append(name)
        return alias.name, names

    return make


def float32(vector: list[float]) -> list[float]:
    """A vector as base64 carries it (float32), which the SDK decodes."""
    return list(struct.unpack(f"<{len(vector)}f", struct.pack(f"<{len(vector)}f", *vector)))


def test_the_allowlist_is_openais_request_schema_and_sentinels_cache():
    """The official SDK's EmbeddingCreateParams (a new SDK with a new parameter fails this test: add
    it to EmbeddingRequest after checking litellm does not read it as a setting)."""
    from openai.types.embedding_create_params import EmbeddingCreateParams

    assert set(EmbeddingCreateParams.__annotations__) | {"cache"} == EMBEDDING_PARAMETERS


def test_the_sdk_embeds_every_input_shape_in_both_encodings(gateway, api_key, embedding_chain, mock_provider):
    model, (provider,) = embedding_chain()
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30, default_headers=NO_CACHE)

    # The SDK's default: it asks for base64 and decodes it.
    raw = client.embeddings.with_raw_response.create(model=model, input="hello world")
    answer = raw.parse()
    assert raw.headers["x-sentinel-provider"] == provider
    assert '"embedding":"' in raw.text  # base64 on the wire
    assert [item.embedding for item in answer.data] == [float32(embedding_of("hello world"))]
    assert (answer.usage.prompt_tokens, answer.usage.total_tokens) == (2, 2)
    assert Decimal(raw.headers["x-sentinel-cost-usd"]) == 2 * PRICE
    # An OpenAI-format provider is called directly, as chat's fast path calls it: with the request's
    # id for its logs (litellm's embedding call sends none).
    assert mock_provider.stats(provider)["last_request_id"] == raw.headers["x-sentinel-request-id"]

    texts = ["one", "two words", "three little words"]
    floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
    assert [(item.index, item.embedding) for item in floats.data] == [(i, embedding_of(t)) for i, t in enumerate(texts)]
    assert floats.usage.prompt_tokens == embedding_usage(texts)

    tokens = client.embeddings.create(model=model, input=[[1, 2, 3], [4]], encoding_format="float", dimensions=4)
    assert [item.embedding for item in tokens.data] == [embedding_of("1 2 3", 4), embedding_of("4", 4)]
    assert tokens.usage.prompt_tokens == 4
    single = client.embeddings.create(model=model, input=[7, 8], encoding_format="float")
    assert [item.embedding for item in single.data] == [embedding_of("7 8")]
    # Sentinel asked the provider for floats each time, and passed `dimensions` on.
    assert mock_provider.stats(provider)["calls"] == 4
    assert '"encoding_format"' not in mock_provider.stats(provider)["last_body"]


def test_an_embedding_is_billed_in_the_ledger_and_settles_its_reservation(
    gateway, tenant, make_key, embedding_chain, live_db
):
    model, (provider,) = embedding_chain()
    key = make_key(tenant, tokens_per_minute=100_000)
    key_id = VirtualKey.objects.get(tenant=tenant).pk
    budget = Budget.objects.create(tenant=tenant, period="monthly", limit_usd=Decimal("5"))
    client = OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30, default_headers=NO_CACHE)
    texts = ["bill", "these words please"]
    raw = client.embeddings.with_raw_response.create(model=model, input=texts)
    used = embedding_usage(texts)
    row = ledger_rows([raw.headers["x-sentinel-request-id"]])[raw.headers["x-sentinel-request-id"]]
    assert (row.status_code, row.model_requested, row.model_served, row.provider) == (
        200,
        model,
        OPENAI_MODEL,
        provider,
    )
    assert (row.prompt_tokens, row.completion_tokens, row.cost_usd, row.stream) == (used, 0, used * PRICE, False)
    assert row.price_id is not None
    # The reservation (the input's bound) settled to what the provider billed.
    from gateway.limits.admission import to_units

    assert holds(key_id, budget) == {"in_flight": 0, "tokens": used, "reserved": 0, "spent": to_units(used * PRICE)}


def test_tokens_per_minute_count_the_input(gateway, tenant, make_key, embedding_chain, mock_provider):
    model, (provider,) = embedding_chain()
    key = make_key(tenant, tokens_per_minute=50)
    client = OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30, default_headers=NO_CACHE)
    with pytest.raises(openai.RateLimitError) as refused:
        client.embeddings.create(model=model, input=" ".join(["word"] * 60))
    assert "key-tpm" in refused.value.body["message"]
    assert mock_provider.stats(provider)["calls"] == 0
    assert client.embeddings.create(model=model, input="a few words").usage.prompt_tokens == 3


def test_a_hard_budget_refuses_what_it_cannot_cover(gateway, tenant, make_key, embedding_chain, mock_provider):
    model, (provider,) = embedding_chain()
    Deployment.objects.filter(name=provider).update(input_price_override=Decimal("0.01"), output_price_override=0)
    Budget.objects.create(tenant=tenant, period="daily", limit_usd=Decimal("0.05"))
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as refused:
        client.embeddings.create(model=model, input=" ".join(["word"] * 20))
    assert (refused.value.status_code, refused.value.body["code"]) == (402, "budget_exceeded")
    assert mock_provider.stats(provider)["calls"] == 0


def test_the_keys_model_allowlist_applies(gateway, tenant, make_key, embedding_chain, mock_provider):
    model, (provider,) = embedding_chain()
    other, _ = embedding_chain()
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant, allowed_models=[other]), max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        client.embeddings.create(model=model, input="x")
    assert (refused.value.body["code"], refused.value.body["param"]) == ("model_not_allowed", "model")
    assert mock_provider.stats(provider)["calls"] == 0
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=gateway.base_url, api_key="sk-sen-wrong", max_retries=0).embeddings.create(
            model=model, input="x"
        )


def test_the_same_input_is_served_from_the_exact_cache(gateway, tenant, api_key, embedding_chain, mock_provider):
    model, (provider,) = embedding_chain()
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30)
    first = client.embeddings.with_raw_response.create(model=model, input=["cache", "me"], encoding_format="float")
    wait_stored(tenant, 1)
    again = client.embeddings.with_raw_response.create(model=model, input=["cache", "me"])  # base64 this time
    other = client.embeddings.with_raw_response.create(model=model, input=["cache", "me", "too"])
    assert [r.headers["x-sentinel-cache"] for r in (first, again, other)] == ["miss", "hit-exact", "miss"]
    assert again.headers["x-sentinel-provider"] == "cache"
    assert [d.embedding for d in again.parse().data] == [float32(d.embedding) for d in first.parse().data]
    assert mock_provider.stats(provider)["calls"] == 2
    ids = [r.headers["x-sentinel-request-id"] for r in (first, again)]
    rows = ledger_rows(ids)
    paid, hit = rows[ids[0]], rows[ids[1]]
    assert (hit.provider, hit.cache_tier, hit.cost_usd, hit.saved_cost_usd) == ("cache", "hit-exact", 0, paid.cost_usd)
    assert paid.cost_usd == embedding_usage(["cache", "me"]) * PRICE


def test_identical_inputs_in_flight_are_embedded_once(gateway, tenant, api_key, embedding_chain, mock_provider):
    """Four identical embedding requests while the first is at a slow provider: one provider call,
    the three others served its vectors from the exact tier (docs/cache.md, coalescing)."""
    from tests.gateway.test_cache_coalescing import asked_while_the_first_is_at_the_provider

    model, (provider,) = embedding_chain()
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30)
    text = unique("embedded once")

    def embed():
        reply = client.embeddings.with_raw_response.create(model=model, input=[text], encoding_format="float")
        return reply.headers["x-sentinel-cache"], reply.parse().data[0].embedding

    results = asked_while_the_first_is_at_the_provider(mock_provider, provider, embed, [embed] * 3, slow_ms=1000)
    assert mock_provider.stats(provider)["calls"] == 1
    assert [tier for tier, _ in results] == ["miss", "hit-exact", "hit-exact", "hit-exact"]
    assert all(vector == results[0][1] for _, vector in results)


def test_a_chain_fails_over_to_gemini(gateway, api_key, embedding_chain, mock_provider):
    model, (first, second) = embedding_chain("openai", "gemini")
    mock_provider.control(first, error_rate=1.0, error_status=503)
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30, default_headers=NO_CACHE)
    raw = client.embeddings.with_raw_response.create(model=model, input=["fail", "over"], encoding_format="float")
    assert (raw.headers["x-sentinel-provider"], raw.headers["x-sentinel-fallbacks"]) == (second, "1")
    assert [d.embedding for d in raw.parse().data] == [embedding_of("fail"), embedding_of("over")]
    assert raw.parse().usage.prompt_tokens > 0  # Gemini reports none: litellm counts the input
    assert [mock_provider.stats(p)["calls"] for p in (first, second)] == [1, 1]


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": []}, "invalid_value", "input"),
        ({"input": ""}, "invalid_value", "input"),
        ({"input": ["a", ""]}, "invalid_value", "input[1]"),
        ({"input": 5}, "invalid_type", "input"),
        ({"input": ["a", 1]}, "invalid_type", "input[1]"),
        ({"input": [1, -1]}, "invalid_value", "input[1]"),
        ({"input": [[1], []]}, "invalid_type", "input[1]"),
        ({"input": ["x"] * 2049}, "invalid_value", "input"),
        ({"input": "a\u0000b"}, "invalid_value", "input"),
        ({"input": "a", "user": "me\u0007"}, "invalid_value", "user"),
        ({"input": "a", "api_base": "http://127.0.0.1:9"}, "unknown_parameter", "api_base"),
        ({"input": "a", "encoding_format": "hex"}, "invalid_value", "encoding_format"),
        ({"input": "a", "dimensions": 0}, "invalid_value", "dimensions"),
        ({}, "missing_required_parameter", "input"),
    ],
)
def test_bad_input_is_a_400_in_openais_shape(gateway, api_key, embedding_chain, mock_provider, body, code, param):
    model, (provider,) = embedding_chain()
    response = httpx.post(
        f"{gateway.base_url}/embeddings",
        headers={"authorization": f"Bearer {api_key}"},
        json={"model": model, **body},
        timeout=30,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    assert set(error) == {"message", "type", "param", "code"}
    assert mock_provider.stats(provider)["calls"] == 0


def test_base64_is_openais_float32_encoding():
    from gateway.embeddings import encoded

    answer = {"data": [{"object": "embedding", "index": 0, "embedding": [0.5, -1.25]}]}
    assert (
        encoded(answer, "base64")["data"][0]["embedding"] == base64.b64encode(struct.pack("<2f", 0.5, -1.25)).decode()
    )
    assert encoded(answer, "float") is answer


def test_token_ids_sent_as_integral_floats_are_integers():
    """JSON has one number type (the fuzzer sends 205.0 for a token id): it goes on as 205."""
    from gateway.embeddings import parse_embedding_request

    request, body = parse_embedding_request(b'{"model": "m", "input": [[1635, 205.0], [3]]}')
    assert request.input == body["input"] == [[1635, 205], [3]]
    assert all(type(token) is int for tokens in body["input"] for token in tokens)
