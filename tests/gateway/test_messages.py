"""POST /v1/messages end to end: the official anthropic SDK, base_url at a real gateway, over
OpenAI-format (the fast path) and Anthropic-format (litellm's translation) deployments on the mock
provider, and a chain failing over from one format to the other. The answer, its usage and the
ledger's cost are the chat path's (tests/gateway/test_dialect_chains.py holds chat to them)."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import anthropic
import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.messages import MessagesRequest
from gateway.mock_provider import answer_text
from tests.gateway import test_dialect_chains
from tests.gateway.test_dialect_chains import MODELS, cost, expected_prompt_tokens, ledger_rows
from tests.gateway.test_fuzz import DEEP, HYPOTHESIS_SETTINGS, VALUES

dialect_chain = test_dialect_chains.dialect_chain
NO_CACHE = {"x-sentinel-cache-control": "no-cache, no-store"}
TOOLS = [
    {
        "name": "lookup",
        "description": "Look a word up.",
        "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    }
]
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "description": "Look a word up.", "parameters": TOOLS[0]["input_schema"]},
    }
]


def sdk(gateway, key: str, **headers) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=gateway.url, api_key=key, max_retries=0, timeout=30, default_headers={**NO_CACHE, **headers}
    )


def request_id(raw) -> str:
    return raw.headers["x-sentinel-request-id"]


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_the_sdk_gets_the_same_answer_usage_and_cost_over_each_format(
    gateway, api_key, dialect_chain, kind, mock_provider
):
    model, (provider,) = dialect_chain(kind)
    client = sdk(gateway, api_key)
    text = f"messages {kind}"
    system = [{"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}]
    prompt = expected_prompt_tokens(
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ]
    )

    raw = client.messages.with_raw_response.create(
        model=model,
        max_tokens=100,
        system=system,
        messages=[{"role": "user", "content": [{"type": "text", "text": text}]}],
    )
    message = raw.parse()
    assert raw.headers["x-sentinel-provider"] == provider
    assert raw.headers["request-id"] == request_id(raw)
    assert (message.type, message.role, message.stop_reason) == ("message", "assistant", "end_turn")
    assert [(block.type, block.text) for block in message.content] == [("text", answer_text(text))]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (prompt, 40)
    assert Decimal(raw.headers["x-sentinel-cost-usd"]) == cost(kind, prompt, 40)
    if kind == "anthropic":  # the provider got the system prompt's cache breakpoint as sent
        sent = json.loads(mock_provider.stats(provider)["last_body"])
        assert sent["system"] == system

    with client.messages.stream(
        model=model, max_tokens=100, system="Answer briefly.", messages=[{"role": "user", "content": text}]
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == answer_text(text)
    assert (final.stop_reason, final.usage.output_tokens, final.usage.input_tokens) == ("end_turn", 40, prompt)
    streamed_id = stream.response.headers["x-sentinel-request-id"]

    # Tool use, then the tool's result sent back (the mock calls its tool again while asked with [[tool]]).
    question = {"role": "user", "content": "define it [[tool]]"}
    tool_prompt = expected_prompt_tokens([question], OPENAI_TOOLS)
    called = client.messages.with_raw_response.create(model=model, max_tokens=100, tools=TOOLS, messages=[question])
    (use,) = called.parse().content
    assert (called.parse().stop_reason, use.type, use.name, use.input) == ("tool_use", "tool_use", "lookup", {})
    assert (called.parse().usage.input_tokens, called.parse().usage.output_tokens) == (tool_prompt, 5)
    with client.messages.stream(model=model, max_tokens=100, tools=TOOLS, messages=[question]) as stream:
        streamed_use = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in streamed_use.content] == [("tool_use", "lookup", {})]
    assert (streamed_use.stop_reason, streamed_use.usage.output_tokens) == ("tool_use", 5)
    answered = client.messages.with_raw_response.create(
        model=model,
        max_tokens=100,
        tools=TOOLS,
        messages=[
            question,
            {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a word"}]},
        ],
    )
    assert answered.parse().stop_reason == "tool_use"
    sent = json.loads(mock_provider.stats(provider)["last_body"])
    if kind == "anthropic":
        assert sent["messages"][-1]["content"][0]["tool_use_id"] == use.id
    elif kind == "gemini":  # Gemini pairs a call and its response by name (it has no call ids)
        assert sent["contents"][-2:] == [
            {"role": "model", "parts": [{"function_call": {"name": "lookup", "args": {}}}]},
            {"role": "user", "parts": [{"function_response": {"name": "lookup", "response": {"content": "a word"}}}]},
        ]
    else:
        assert (sent["messages"][-1]["role"], sent["messages"][-1]["tool_call_id"]) == ("tool", use.id)

    rows = ledger_rows([request_id(raw), streamed_id, request_id(called)])
    billed = [rows[request_id(raw)], rows[streamed_id], rows[request_id(called)]]
    assert [(r.status_code, r.provider, r.model_served, r.stream) for r in billed] == [
        (200, provider, MODELS[kind], False),
        (200, provider, MODELS[kind], True),
        (200, provider, MODELS[kind], False),
    ]
    assert [(r.prompt_tokens, r.completion_tokens, r.cost_usd) for r in billed] == [
        (prompt, 40, cost(kind, prompt, 40)),
        (prompt, 40, cost(kind, prompt, 40)),
        (tool_prompt, 5, cost(kind, tool_prompt, 5)),
    ]


def test_the_event_sequence_is_anthropics(gateway, api_key, dialect_chain):
    model, _ = dialect_chain("openai")
    raw = httpx.post(
        f"{gateway.url}/v1/messages",
        headers={"x-api-key": api_key, "anthropic-version": "2023-06-01", **NO_CACHE},
        json={"model": model, "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "events"}]},
        timeout=30,
    )
    assert raw.headers["content-type"] == "text/event-stream"
    events = [line.removeprefix("event: ") for line in raw.text.splitlines() if line.startswith("event: ")]
    assert events[:2] == ["message_start", "content_block_start"]
    assert set(events[2:-3]) == {"content_block_delta"}
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_chain_fails_over_from_openai_to_anthropic(gateway, api_key, dialect_chain, mock_provider, stream):
    model, (first, second) = dialect_chain("openai", "anthropic")
    mock_provider.control(first, error_rate=1.0, error_status=503)
    client = sdk(gateway, api_key)
    messages = [{"role": "user", "content": "fail over"}]
    if stream:
        with client.messages.stream(model=model, max_tokens=100, messages=messages) as answer:
            text = "".join(answer.text_stream)
            headers = answer.response.headers
    else:
        raw = client.messages.with_raw_response.create(model=model, max_tokens=100, messages=messages)
        text, headers = raw.parse().content[0].text, raw.headers
    assert (headers["x-sentinel-provider"], headers["x-sentinel-fallbacks"], text) == (
        second,
        "1",
        answer_text("fail over"),
    )
    prompt = expected_prompt_tokens(messages)
    row = ledger_rows([headers["x-sentinel-request-id"]])[headers["x-sentinel-request-id"]]
    assert (row.provider, row.fallbacks, row.prompt_tokens, row.cost_usd) == (
        second,
        1,
        prompt,
        cost("anthropic", prompt, 40),
    )
    assert [mock_provider.stats(p)["completed"] for p in (first, second)] == [0, 1]


def test_count_tokens_uses_the_models_tokenizer(gateway, api_key, dialect_chain):
    model, _ = dialect_chain("openai")
    counted = sdk(gateway, api_key).messages.count_tokens(
        model=model, system="Answer briefly.", messages=[{"role": "user", "content": "count me"}]
    )
    import litellm

    expected = litellm.token_counter(
        model=MODELS["openai"],
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "count me"}],
    )
    assert counted.input_tokens == expected


@pytest.mark.parametrize(
    ("headers", "body", "status", "error_type"),
    [
        ({"x-api-key": "sk-wrong"}, None, 401, "authentication_error"),
        ({}, {"model": "no-such-model"}, 404, "not_found_error"),
        ({}, {"max_tokens": 0}, 400, "invalid_request_error"),
        ({}, {"api_base": "http://attacker.invalid"}, 400, "invalid_request_error"),
        (
            {},
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "api_key": "k"}]}]},
            400,
            "invalid_request_error",
        ),
        ({}, {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "invalid_request_error"),
        ({}, {"messages": [{"role": "user", "content": "nul \u0000"}]}, 400, "invalid_request_error"),
    ],
    ids=["bad-key", "unknown-model", "max-tokens", "api-base", "block-field", "server-tool", "nul"],
)
def test_errors_are_in_anthropics_shape(
    gateway, api_key, dialect_chain, mock_provider, headers, body, status, error_type
):
    model, (provider,) = dialect_chain("openai")
    request = {"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **(body or {})}
    raw = httpx.post(
        f"{gateway.url}/v1/messages",
        headers={"x-api-key": api_key, "anthropic-version": "2023-06-01", **headers},
        content=orjson.dumps(request),
        timeout=30,
    )
    assert raw.status_code == status
    assert raw.json()["type"] == "error" and raw.json()["error"]["type"] == error_type
    assert raw.json()["error"]["message"]
    assert mock_provider.stats(provider)["calls"] == 0  # nothing reached the provider


def test_the_sdk_raises_its_own_errors(gateway, api_key, tenant, make_key, dialect_chain, mock_provider):
    """Bearer works as x-api-key does; the SDK maps each status to its exception class."""
    model, (provider,) = dialect_chain("openai")
    bearer = anthropic.Anthropic(base_url=gateway.url, auth_token=api_key, api_key=None, max_retries=0)
    assert bearer.messages.create(model=model, max_tokens=10, messages=[{"role": "user", "content": "hi"}]).content
    limited = make_key(tenant, allowed_models=["another-model"])
    with pytest.raises(anthropic.PermissionDeniedError):
        sdk(gateway, limited).messages.create(model=model, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    mock_provider.control(provider, error_rate=1.0, error_status=503)
    with pytest.raises(anthropic.InternalServerError) as failed:
        sdk(gateway, api_key).messages.create(model=model, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert (failed.value.status_code, failed.value.body["error"]["type"]) == (503, "overloaded_error")


# --- fuzz: every field of the request with control characters, depth, size, unknown types --------

FIELDS = [*MessagesRequest.model_fields, "api_key", "base_url", "api_base", "x_extra"]
_fuzzed_chain: list = []  # one model for every example (fixtures are not set up again between them)


@st.composite
def fuzzed_body(draw) -> dict:
    body = {"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    body[draw(st.sampled_from(FIELDS))] = draw(VALUES | DEEP)
    return body


@HYPOTHESIS_SETTINGS
@given(body=fuzzed_body())
def test_messages_fields_never_answer_500(gateway, api_key, dialect_chain, mock_provider, body):
    if not _fuzzed_chain:
        _fuzzed_chain.append(dialect_chain("openai"))
    model, (provider,) = _fuzzed_chain[0]
    body.setdefault("model", model)
    calls = mock_provider.stats(provider)["calls"]
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        headers={"x-api-key": api_key, **NO_CACHE},
        content=json.dumps(body).encode(),
        timeout=30,
    )
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.json()["type"] == "error" and set(response.json()["error"]) == {"type", "message"}
        assert mock_provider.stats(provider)["calls"] == calls


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_stream_broken_after_it_started_ends_with_an_error_event(
    gateway, api_key, dialect_chain, mock_provider, kind
):
    model, (provider,) = dialect_chain(kind)
    mock_provider.control(provider, drop_after=3)
    raw = httpx.post(
        f"{gateway.url}/v1/messages",
        headers={"x-api-key": api_key, **NO_CACHE},
        json={"model": model, "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "cut"}]},
        timeout=30,
    )
    events = [line.removeprefix("event: ") for line in raw.text.splitlines() if line.startswith("event: ")]
    assert (raw.status_code, events[0], events[-1]) == (200, "message_start", "error")
    assert "message_stop" not in events
    error = json.loads(raw.text.rstrip().splitlines()[-1].removeprefix("data: "))
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    row = ledger_rows([raw.headers["x-sentinel-request-id"]])[raw.headers["x-sentinel-request-id"]]
    assert (row.status_code, row.error_code, row.provider) == (502, "stream_interrupted", provider)


def test_identical_messages_in_flight_ask_the_provider_once(gateway, api_key, dialect_chain, mock_provider):
    """Anthropic's endpoint shares the chat cache's lead: three identical requests while the first
    (streamed) is at a slow provider make one provider call (docs/cache.md, coalescing)."""
    from tests.gateway.test_cache_coalescing import asked_while_the_first_is_at_the_provider

    model, (provider,) = dialect_chain("anthropic")
    client = anthropic.Anthropic(base_url=gateway.url, api_key=api_key, max_retries=0, timeout=30)
    messages = [{"role": "user", "content": f"asked three times at once {time.time_ns()}"}]

    def streamed():
        with client.messages.stream(model=model, max_tokens=100, messages=messages) as stream:
            return stream.response.headers["x-sentinel-cache"], "".join(stream.text_stream)

    def plain():
        raw = client.messages.with_raw_response.create(model=model, max_tokens=100, messages=messages)
        return raw.headers["x-sentinel-cache"], raw.parse().content[0].text

    results = asked_while_the_first_is_at_the_provider(
        mock_provider, provider, streamed, [plain, streamed], slow_ms=1000
    )
    expected = answer_text(messages[0]["content"])
    assert results == [("miss", expected), ("hit-exact", expected), ("hit-exact", expected)]
    assert mock_provider.stats(provider)["calls"] == 1


def test_an_answer_is_served_again_from_the_cache_streamed_or_not(
    gateway, tenant, api_key, dialect_chain, mock_provider
):
    from tests.gateway.test_cache import wait_stored

    model, (provider,) = dialect_chain("anthropic")
    client = anthropic.Anthropic(base_url=gateway.url, api_key=api_key, max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "remember me"}]
    first = client.messages.with_raw_response.create(model=model, max_tokens=100, messages=messages)
    wait_stored(tenant, 1)
    again = client.messages.with_raw_response.create(model=model, max_tokens=100, messages=messages)
    with client.messages.stream(model=model, max_tokens=100, messages=messages) as stream:
        replayed = "".join(stream.text_stream)
        replayed_headers = stream.response.headers
    assert [r.headers["x-sentinel-cache"] for r in (first, again)] + [replayed_headers["x-sentinel-cache"]] == [
        "miss",
        "hit-exact",
        "hit-exact",
    ]
    assert again.parse().content[0].text == replayed == first.parse().content[0].text == answer_text("remember me")
    assert mock_provider.stats(provider)["calls"] == 1
    prompt = expected_prompt_tokens(messages)
    rows = ledger_rows([request_id(first), request_id(again)])
    assert (rows[request_id(again)].cost_usd, rows[request_id(again)].saved_cost_usd) == (
        Decimal(0),
        cost("anthropic", prompt, 40),
    )
