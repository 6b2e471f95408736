"""Chains across upstream formats, end to end: the official OpenAI SDK against a real gateway whose
deployments are OpenAI-format (the fast path), Anthropic-format and Gemini-format (litellm's
translation, gateway.upstream.providers) on the mock provider. Whichever deployment serves, the client gets
one OpenAI answer: the same text, tool calls and usage; the ledger bills it at that deployment's
prices; failover, breakers and the cache work the same on every format."""

from __future__ import annotations

from decimal import Decimal

import pytest
from openai import OpenAI

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.mock_provider import answer_text, prompt_usage
from gateway.models import BreakerPolicy, ChainEntry, Deployment, ModelAlias, Provider
from gateway.upstream.breakers import breaker_snapshot
from tests.conftest import TEST_BREAKER, unique, wait_for
from tests.gateway.test_cache import wait_stored

MODELS = {
    "openai": "openai/gpt-4o",
    "anthropic": "anthropic/claude-3-5-haiku-20241022",
    "gemini": "gemini/gemini-2.5-flash",
}
# Per-token prices (USD) set on each deployment, so a cost is computed by hand here.
PRICES = {
    "openai": (Decimal("0.0000025"), Decimal("0.00001")),
    "anthropic": (Decimal("0.0000008"), Decimal("0.000004")),
    "gemini": (Decimal("0.0000003"), Decimal("0.0000025")),
}
IMAGE = "data:image/png;base64," + (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
        },
    }
]
NO_CACHE = {"x-sentinel-cache-control": "no-cache, no-store"}


def conversation(text: str) -> list[dict]:
    """A system prompt and a user turn with a text part and an image part (a data: URL)."""
    return [
        {"role": "system", "content": "Answer briefly."},
        {
            "role": "user",
            "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": IMAGE}}],
        },
    ]


def expected_prompt_tokens(messages: list[dict], tools: list | None = None) -> int:
    """What every format's mock reports for this conversation: OpenAI's count (gpt-4o's rules)."""
    return prompt_usage({"model": "gpt-4o", "messages": messages, **({"tools": tools} if tools else {})})


def cost(kind: str, prompt: int, completion: int) -> Decimal:
    input_price, output_price = PRICES[kind]
    return prompt * input_price + completion * output_price


@pytest.fixture
def dialect_chain(live_db, mock_provider):
    """A model served by deployments of the given formats in chain order, each on its own virtual
    provider of the mock, priced by PRICES. Returns (alias, [provider names])."""

    def make(*kinds: str, **policy) -> tuple[str, list[str]]:
        alias = ModelAlias.objects.create(name=unique("dialects"))
        breaker = BreakerPolicy.objects.create(name=unique("policy"), **policy) if policy else None
        names = []
        for position, kind in enumerate(kinds):
            name = unique(kind)
            provider = Provider(name=name, kind=kind, api_base=mock_provider.api_base(name, kind), max_retries=0)
            provider.set_api_key("sk-test-" + name)
            provider.save()
            deployment = Deployment.objects.create(
                name=name,
                provider=provider,
                litellm_model=MODELS[kind],
                input_price_override=PRICES[kind][0],
                output_price_override=PRICES[kind][1],
                **({"breaker_policy": breaker} if breaker else {}),
            )
            ChainEntry.objects.create(alias=alias, deployment=deployment, position=position)
            names.append(name)
        return alias.name, names

    return make


def ledger_rows(request_ids: list[str]) -> dict[str, LedgerEntry]:
    """The rows of these requests, once all are written (a stream's is handed off as it ends)."""

    def written() -> dict[str, LedgerEntry] | None:
        drain()
        rows = {row.request_id: row for row in LedgerEntry.objects.filter(request_id__in=request_ids)}
        return rows if len(rows) == len(request_ids) else None

    return wait_for(written, timeout=15, what=f"the ledger rows of {request_ids}")


def read_stream(raw) -> tuple[str, list[tuple], str | None, object]:
    text, calls, finish, usage = "", [], None, None
    for chunk in raw.parse():
        if chunk.choices:
            delta = chunk.choices[0].delta
            text += delta.content or ""
            for call in delta.tool_calls or ():
                calls.append((call.index, call.id, call.function.name, call.function.arguments))
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    return text, calls, finish, usage


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_every_format_gives_the_same_openai_answer_usage_and_cost(gateway, api_key, dialect_chain, kind, mock_provider):
    """The contract: the same answer text, tool call and usage over each format, streamed and not,
    and each billed at its deployment's prices (hand-computed)."""
    model, (provider,) = dialect_chain(kind)
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30, default_headers=NO_CACHE)
    messages = conversation(f"contract {kind}")
    prompt = expected_prompt_tokens(messages)
    text = answer_text(f"contract {kind} ")  # the parts' texts joined: the image part has none

    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages)
    answer = raw.parse()
    assert raw.headers["x-sentinel-provider"] == provider
    assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == (text, "stop")
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (
        prompt,
        40,
        prompt + 40,
    )
    assert Decimal(raw.headers["x-sentinel-cost-usd"]) == cost(kind, prompt, 40)

    streamed = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    streamed_text, calls, finish, usage = read_stream(streamed)
    assert (streamed_text, calls, finish) == (text, [], "stop")
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, 40)

    tool_messages = [{"role": "user", "content": "define it [[tool]]"}]
    tool_prompt = expected_prompt_tokens(tool_messages, TOOLS)
    tooled = client.chat.completions.with_raw_response.create(model=model, messages=tool_messages, tools=TOOLS)
    message = tooled.parse().choices[0].message
    (call,) = message.tool_calls
    assert (call.type, call.function.name, call.function.arguments) == ("function", "lookup", "{}")
    assert call.id  # each format names its call its own way; the client only needs one to answer
    assert (tooled.parse().choices[0].finish_reason, tooled.parse().usage.completion_tokens) == ("tool_calls", 5)
    assert tooled.parse().usage.prompt_tokens == tool_prompt

    tool_stream = client.chat.completions.with_raw_response.create(
        model=model, messages=tool_messages, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    _, calls, finish, usage = read_stream(tool_stream)
    assert [c[0] for c in calls] == [0] * len(calls) and calls[0][1]  # one call, its id first
    assert ("".join(c[2] or "" for c in calls), "".join(c[3] or "" for c in calls), finish) == (
        "lookup",
        "{}",
        "tool_calls",
    )
    assert (usage.prompt_tokens, usage.completion_tokens) == (tool_prompt, 5)

    raws = [raw, streamed, tooled, tool_stream]
    rows = ledger_rows([r.headers["x-sentinel-request-id"] for r in raws])
    billed = [rows[r.headers["x-sentinel-request-id"]] for r in raws]
    assert [(r.status_code, r.provider, r.model_served, r.stream) for r in billed] == [
        (200, provider, MODELS[kind], False),
        (200, provider, MODELS[kind], True),
        (200, provider, MODELS[kind], False),
        (200, provider, MODELS[kind], True),
    ]
    assert [(r.prompt_tokens, r.completion_tokens, r.cost_usd) for r in billed] == [
        (prompt, 40, cost(kind, prompt, 40)),
        (prompt, 40, cost(kind, prompt, 40)),
        (tool_prompt, 5, cost(kind, tool_prompt, 5)),
        (tool_prompt, 5, cost(kind, tool_prompt, 5)),
    ]
    assert mock_provider.stats(provider)["completed"] == 4


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_chain_fails_over_from_openai_to_anthropic_to_gemini(gateway, api_key, dialect_chain, mock_provider, stream):
    """Before the first token a failing deployment hands the request to the next one, whatever its
    format; the client cannot tell which served but by the headers."""
    model, (first, second, third) = dialect_chain("openai", "anthropic", "gemini")
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30, default_headers=NO_CACHE)
    messages = conversation("fail over")

    def ask():
        raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, stream=stream)
        text = read_stream(raw)[0] if stream else raw.parse().choices[0].message.content
        return raw.headers["x-sentinel-provider"], raw.headers["x-sentinel-fallbacks"], text

    mock_provider.control(first, error_rate=1.0, error_status=503)
    assert ask() == (second, "1", answer_text("fail over "))
    mock_provider.control(second, error_rate=1.0, error_status=529)  # Anthropic's "overloaded"
    assert ask() == (third, "2", answer_text("fail over "))
    assert [mock_provider.stats(p)["calls"] for p in (first, second, third)] == [2, 2, 1]
    assert [mock_provider.stats(p)["completed"] for p in (first, second, third)] == [0, 1, 1]


def test_a_translated_answer_is_billed_then_served_from_the_cache(
    gateway, api_key, dialect_chain, mock_provider, tenant
):
    model, (provider,) = dialect_chain("anthropic")
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30)
    messages = conversation("cache me")
    prompt = expected_prompt_tokens(messages)
    first = client.chat.completions.with_raw_response.create(model=model, messages=messages)
    wait_stored(tenant, 1)
    again = client.chat.completions.with_raw_response.create(model=model, messages=messages)
    assert (first.headers["x-sentinel-cache"], again.headers["x-sentinel-cache"]) == ("miss", "hit-exact")
    assert again.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert mock_provider.stats(provider)["calls"] == 1
    rows = ledger_rows([first.headers["x-sentinel-request-id"], again.headers["x-sentinel-request-id"]])
    paid, saved = rows[first.headers["x-sentinel-request-id"]], rows[again.headers["x-sentinel-request-id"]]
    assert (paid.provider, paid.cache_tier, paid.prompt_tokens, paid.completion_tokens, paid.cost_usd) == (
        provider,
        "miss",
        prompt,
        40,
        cost("anthropic", prompt, 40),
    )
    assert (saved.provider, saved.cache_tier, saved.cost_usd, saved.saved_cost_usd) == (
        "cache",
        "hit-exact",
        Decimal(0),
        cost("anthropic", prompt, 40),
    )


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
def test_a_translated_deployments_failures_open_its_breaker(gateway, api_key, dialect_chain, mock_provider, kind):
    model, (failing, healthy) = dialect_chain(kind, "openai", **TEST_BREAKER, minimum_calls=3, half_open_probes=1)
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30, default_headers=NO_CACHE)
    mock_provider.control(failing, error_rate=1.0, error_status=503)
    served = [
        client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": f"b{i}"}]
        ).headers["x-sentinel-provider"]
        for i in range(5)
    ]
    assert served == [healthy] * 5
    assert mock_provider.stats(failing)["calls"] == 3  # then the breaker kept requests off it
    assert breaker_snapshot(Deployment.objects.get(name=failing).pk)["state"] == "open"
