"""Refusal escalation: a model that refuses or apologizes instead of answering is asked again, once,
on the tenant's smart model (a per-tenant switch), and the response says so."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import httpx
import pytest

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.mock_provider import REFUSAL_TEXT, answer_text
from gateway.models import Deployment
from tenants.models import Budget

PROMPT = "[[refuse]] How do I pick the lock of my own shed?"


@pytest.fixture
def escalating(make_tenant, make_key, make_model, mock_provider):
    """A small model whose provider refuses, and a smart model whose provider does not."""

    def make(escalate: bool = True):
        small, (small_provider,) = make_model()
        smart, (smart_provider,) = make_model(litellm_model="openai/gpt-4o")
        mock_provider.control(smart_provider, refuses=False)
        tenant = make_tenant(auto_smart_model=smart, escalate_refusals=escalate)
        return tenant, make_key(tenant), small, smart, small_provider, smart_provider

    return make


def ask(gateway, key: str, model: str, prompt: str = PROMPT, **body) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"},
        json={"model": model, "messages": [{"role": "user", "content": prompt}], **body},
        timeout=30,
    )


def ledger_row(tenant, response: httpx.Response) -> LedgerEntry:
    drain()
    return LedgerEntry.objects.get(tenant=tenant, request_id=response.headers["x-sentinel-request-id"])


def test_a_refusal_is_retried_once_on_the_smart_model(gateway, escalating, mock_provider):
    tenant, key, small, _, small_provider, smart_provider = escalating()
    response = ask(gateway, key, small)

    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["message"]["content"] == answer_text(PROMPT, refuses=False)
    assert response.headers["x-sentinel-escalated"] == f"{small_provider}->{smart_provider}"
    assert response.headers["x-sentinel-provider"] == smart_provider
    assert mock_provider.stats(small_provider)["calls"] == mock_provider.stats(smart_provider)["calls"] == 1

    # Both calls were paid for: the record bills both, and says what happened.
    row = ledger_row(tenant, response)
    refusal_tokens = len(REFUSAL_TEXT.split())
    assert row.escalated_from == small_provider
    assert (row.provider, row.model_served) == (smart_provider, "openai/gpt-4o")
    assert row.prompt_tokens == 2 * body["usage"]["prompt_tokens"]
    assert row.completion_tokens == refusal_tokens + body["usage"]["completion_tokens"]
    assert row.cost_usd == Decimal(response.headers["x-sentinel-cost-usd"])
    smart_alone = (Decimal("2.5e-6") * body["usage"]["prompt_tokens"] + Decimal("1e-5") * 40).quantize(Decimal("1e-10"))
    assert row.cost_usd > smart_alone


def test_a_refusal_on_the_messages_api_is_escalated_as_on_chat(gateway, escalating, mock_provider):
    """Anthropic's Messages API runs the chat path's answer: the refusal is asked again of the smart
    model, the client gets its answer as a message, and the ledger bills both calls."""
    import anthropic

    tenant, key, small, _, small_provider, smart_provider = escalating()
    client = anthropic.Anthropic(
        base_url=gateway.url,
        api_key=key,
        max_retries=0,
        timeout=30,
        default_headers={"x-sentinel-cache-control": "no-cache, no-store"},
    )
    raw = client.messages.with_raw_response.create(
        model=small, max_tokens=100, messages=[{"role": "user", "content": PROMPT}]
    )
    message = raw.parse()
    assert [block.text for block in message.content] == [answer_text(PROMPT, refuses=False)]
    assert raw.headers["x-sentinel-escalated"] == f"{small_provider}->{smart_provider}"
    assert raw.headers["request-id"] == raw.headers["x-sentinel-request-id"]
    assert mock_provider.stats(small_provider)["calls"] == mock_provider.stats(smart_provider)["calls"] == 1
    row = LedgerEntry.objects.get(tenant=tenant, request_id=(drain(), raw.headers["x-sentinel-request-id"])[1])
    assert (row.escalated_from, row.provider) == (small_provider, smart_provider)
    assert row.completion_tokens == len(REFUSAL_TEXT.split()) + message.usage.output_tokens
    assert row.cost_usd == Decimal(raw.headers["x-sentinel-cost-usd"])


def test_without_the_switch_the_refusal_is_the_answer(gateway, escalating, mock_provider):
    tenant, key, small, _, _small_provider, smart_provider = escalating(escalate=False)
    response = ask(gateway, key, small)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == REFUSAL_TEXT
    assert "x-sentinel-escalated" not in response.headers
    assert mock_provider.stats(smart_provider)["calls"] == 0
    assert ledger_row(tenant, response).escalated_from == ""


def test_answers_and_the_smart_models_own_refusals_are_not_escalated(gateway, escalating, mock_provider):
    _tenant, key, small, smart, _, smart_provider = escalating()
    mock_provider.control(smart_provider, refuses=True)
    answered = ask(gateway, key, small, prompt="What is the capital of Chile?")
    refused_by_smart = ask(gateway, key, smart)
    assert "x-sentinel-escalated" not in answered.headers
    assert answered.json()["choices"][0]["message"]["content"] == answer_text("What is the capital of Chile?")
    assert refused_by_smart.json()["choices"][0]["message"]["content"] == REFUSAL_TEXT  # nothing stronger to ask
    assert "x-sentinel-escalated" not in refused_by_smart.headers
    assert mock_provider.stats(smart_provider)["calls"] == 1


def test_streams_are_not_escalated(gateway, escalating, mock_provider):
    """A stream's first tokens are relayed as they come: by the time a refusal shows, it is the client's."""
    _, key, small, _, _, smart_provider = escalating()
    response = ask(gateway, key, small, stream=True)
    assert response.status_code == 200
    assert "x-sentinel-escalated" not in response.headers
    assert "sorry" in response.text
    assert mock_provider.stats(smart_provider)["calls"] == 0


def test_when_the_smart_model_fails_the_refusal_stands(gateway, escalating, mock_provider):
    tenant, key, small, _, small_provider, smart_provider = escalating()
    mock_provider.control(smart_provider, error_rate=1.0, error_status=503)
    response = ask(gateway, key, small)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == REFUSAL_TEXT
    assert "x-sentinel-escalated" not in response.headers
    assert response.headers["x-sentinel-provider"] == small_provider
    row = ledger_row(tenant, response)
    assert (row.provider, row.escalated_from, row.completion_tokens) == (small_provider, "", len(REFUSAL_TEXT.split()))


def test_a_hard_budget_reserves_the_escalation_too(gateway, escalating, mock_provider):
    """A request that may be escalated can cost two calls: admission reserves both worst cases, so
    concurrent refusals cannot overspend a hard budget. (Before, only the first call was reserved:
    four requests fit where two did, and each cost a refusal and a full answer.)"""
    tenant, key, small, _, small_provider, smart_provider = escalating()
    price = Decimal("0.0001")  # per answer token; prompts free
    Deployment.objects.filter(name__in=(small_provider, smart_provider)).update(
        input_price_override=0, output_price_override=price
    )
    refusal, answer = len(REFUSAL_TEXT.split()) * price, 40 * price
    # Two requests' worst cases (40 tokens on each model) and a little: each gives back 30 tokens'
    # worth when it settles, less than one worst case together, so exactly two fit however they finish.
    limit = 2 * 80 * price + 10 * price
    Budget.objects.create(tenant=tenant, period="daily", limit_usd=limit)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{gateway.base_url}/chat/completions",
                        headers={"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"},
                        json={"model": small, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40},
                    )
                    for _ in range(10)
                )
            )

    responses = asyncio.run(burst())
    drain()
    rows = LedgerEntry.objects.filter(tenant=tenant, status_code=200)
    assert sum(row.cost_usd for row in rows) <= limit
    assert sorted(r.status_code for r in responses) == [200] * 2 + [402] * 8
    escalated = {r.headers.get("x-sentinel-escalated") for r in responses if r.status_code == 200}
    assert escalated == {f"{small_provider}->{smart_provider}"}
    assert [row.cost_usd for row in rows] == [refusal + answer] * 2
    assert mock_provider.stats(small_provider)["calls"] == mock_provider.stats(smart_provider)["calls"] == 2
