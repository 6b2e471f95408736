"""The fast path and litellm.acompletion honor one contract: the OpenAI SDK cannot tell them apart,
usage and cost are exact on both, and every provider failure gets the same verdict."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import OpenAI

from gateway.mock_provider import answer_text

TRANSPORTS = ["auto", "litellm"]


@pytest.fixture(params=TRANSPORTS)
def served(request, gateway, tenant, make_key, make_model):
    alias, (provider,) = make_model(transport=request.param)
    return alias, provider, OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)


def test_non_streamed(served):
    alias, _provider, client = served
    raw = client.chat.completions.with_raw_response.create(
        model=alias, messages=[{"role": "user", "content": "contract"}], temperature=0.5, seed=7
    )
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == answer_text("contract")
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (8, 40)
    assert completion.usage.total_tokens == 48
    assert not hasattr(completion.usage, "cost") or completion.usage.model_extra.get("cost") is None
    # gpt-4o-mini: 8 × $0.15/M + 40 × $0.60/M
    assert raw.headers["x-sentinel-cost-usd"] == "0.0000252000"


def test_streamed(served):
    alias, _, client = served
    chunks = list(
        client.chat.completions.create(
            model=alias,
            messages=[{"role": "user", "content": "contract"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer_text("contract")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (8, 40)


def test_parameters_reach_the_provider(served, mock_provider):
    alias, provider, client = served
    completion = client.chat.completions.create(
        model=alias, messages=[{"role": "user", "content": "cut"}], max_tokens=3
    )
    assert completion.choices[0].message.content == answer_text("cut", 3)
    assert completion.choices[0].finish_reason == "length"
    assert mock_provider.stats(provider)["last_model"] == "gpt-4o-mini"


@pytest.mark.parametrize(
    ("faults", "status", "code"),
    [
        ({"error_status": 400, "error_message": "bad parameter"}, 400, "invalid_request"),
        (
            {
                "error_status": 400,
                "error_code": "context_length_exceeded",
                "error_message": "This model's maximum context length is 128000 tokens.",
            },
            400,
            "context_length_exceeded",
        ),
        ({"error_status": 401, "error_message": "invalid api key"}, 502, "provider_authentication_failed"),
        ({"error_status": 404, "error_message": "no such model"}, 502, "provider_model_not_found"),
        ({"error_status": 503}, 503, "all_providers_unavailable"),
        ({"error_status": 500}, 503, "all_providers_unavailable"),
        ({"error_status": 429, "retry_after": 0}, 503, "all_providers_unavailable"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_failures_get_the_same_verdict(served, gateway, mock_provider, faults, status, code, stream):
    alias, provider, client = served
    mock_provider.control(provider, error_rate=1.0, **faults)
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {client.api_key}"},
        json={"model": alias, "messages": [{"role": "user", "content": "fail"}], "stream": stream},
        timeout=30,
    )
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def test_connection_refused(gateway, tenant, make_key, live_db):
    from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
    from tests.conftest import unique
    from tests.servers import free_port

    for transport in TRANSPORTS:
        provider = Provider.objects.create(
            name=unique("down"), api_base=f"http://127.0.0.1:{free_port()}/v1", transport=transport
        )
        provider.set_api_key("sk-x")
        provider.save()
        alias = ModelAlias.objects.create(name=unique("down"))
        deployment = Deployment.objects.create(
            name=provider.name, provider=provider, litellm_model="openai/gpt-4o-mini"
        )
        ChainEntry.objects.create(alias=alias, deployment=deployment)
        client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model=alias.name, messages=[{"role": "user", "content": "x"}])
        assert caught.value.status_code == 503
        assert "provider_unreachable" in caught.value.message


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("stream", [False, True])
def test_stalled_provider_times_out(gateway, tenant, make_key, make_model, mock_provider, transport, stream):
    alias, (provider,) = make_model(transport=transport, timeout_seconds=0.5, first_token_timeout_seconds=0.5)
    mock_provider.control(provider, stall_ms=3000)
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {make_key(tenant)}"},
        json={"model": alias, "messages": [{"role": "user", "content": "slow"}], "stream": stream},
        timeout=30,
    )
    assert response.status_code == 503
    assert "upstream_timeout" in response.json()["error"]["message"]
    assert mock_provider.stats(provider)["completed"] == 0  # given up on before the provider answered


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_drop_after_the_first_token_ends_with_an_error_event(
    gateway, tenant, make_key, make_model, mock_provider, transport
):
    alias, (provider,) = make_model(transport=transport)
    mock_provider.control(provider, drop_after=5, tpt_ms=10)
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in client.chat.completions.create(
            model=alias, messages=[{"role": "user", "content": "drop"}], stream=True
        ):
            received.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert "".join(received) == answer_text("drop", 5)
    assert "broke off" in str(caught.value)
