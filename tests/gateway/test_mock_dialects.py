"""The mock provider's Anthropic Messages and Gemini formats, read by litellm's own translation (as
the gateway reads them): the same answer as the OpenAI format, the providers' event sequences, tool
calls, cache token counts, and the fault switches."""

from __future__ import annotations

import asyncio

import httpx
import litellm
import orjson
import pytest

from gateway.mock_provider import answer_text
from tests.conftest import unique

MODELS = {
    "openai": "openai/gpt-4o",
    "anthropic": "anthropic/claude-3-5-haiku-20241022",
    "gemini": "gemini/gemini-2.5-flash",
}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
# A 1x1 PNG.
IMAGE = "data:image/png;base64," + (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {
        "role": "user",
        "content": [{"type": "text", "text": "hello there"}, {"type": "image_url", "image_url": {"url": IMAGE}}],
    },
]


def call(mock_provider, kind: str, provider: str, **arguments):
    async def run():
        return await litellm.acompletion(
            model=MODELS[kind],
            api_base=mock_provider.api_base(provider, kind),
            api_key="sk-test",
            num_retries=0,
            **{"messages": MESSAGES, **arguments},
        )

    return asyncio.run(run())


def streamed(mock_provider, kind: str, provider: str, **arguments) -> tuple[str, list, str | None, object]:
    async def run():
        response = await litellm.acompletion(
            model=MODELS[kind],
            api_base=mock_provider.api_base(provider, kind),
            api_key="sk-test",
            num_retries=0,
            stream=True,
            stream_options={"include_usage": True},
            **{"messages": MESSAGES, **arguments},
        )
        text, calls, finish, usage = "", [], None, None
        async for chunk in response:
            if chunk.choices:
                delta = chunk.choices[0].delta
                text += delta.content or ""
                calls += [(c.function.name, c.function.arguments) for c in delta.tool_calls or ()]
                finish = chunk.choices[0].finish_reason or finish
            usage = getattr(chunk, "usage", None) or usage
        return text, calls, finish, usage

    return asyncio.run(run())


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
def test_same_answer_and_usage_as_the_openai_format(mock_provider, kind):
    """litellm translates a system prompt and an image part; the mock reads them back and answers
    (and counts the prompt) as the OpenAI format does for the same conversation."""
    reference = call(mock_provider, "openai", unique("o"))
    provider = unique(kind)
    answer = call(mock_provider, kind, provider)
    assert answer.choices[0].message.content == reference.choices[0].message.content == answer_text("hello there ")
    assert answer.choices[0].finish_reason == "stop"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (reference.usage.prompt_tokens, 40)
    text, _, finish, usage = streamed(mock_provider, kind, provider)
    assert (text, finish) == (answer_text("hello there "), "stop")
    assert (usage.prompt_tokens, usage.completion_tokens) == (reference.usage.prompt_tokens, 40)
    assert mock_provider.stats(provider)["completed"] == 2


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
def test_tool_calls(mock_provider, kind):
    provider = unique(kind)
    messages = [{"role": "user", "content": "weather [[tool]]"}]
    answer = call(mock_provider, kind, provider, messages=messages, tools=TOOLS)
    (tool_call,) = answer.choices[0].message.tool_calls
    assert (tool_call.function.name, tool_call.function.arguments, answer.choices[0].finish_reason) == (
        "lookup",
        "{}",
        "tool_calls",
    )
    assert answer.usage.completion_tokens == 5
    _, calls, finish, _ = streamed(mock_provider, kind, provider, messages=messages, tools=TOOLS)
    assert ("".join(name or "" for name, _ in calls), "".join(a for _, a in calls), finish) == (
        "lookup",
        "{}",
        "tool_calls",
    )


def test_anthropic_event_sequence_and_cache_usage(mock_provider):
    provider = unique("anthropic")
    mock_provider.control(provider, tokens=3, cache_read_tokens=4, cache_creation_tokens=2)
    body = {"model": "claude-3-5-haiku-20241022", "max_tokens": 100, "stream": True}
    body["messages"] = [{"role": "user", "content": "hi"}]
    response = httpx.post(f"{mock_provider.api_base(provider, 'anthropic')}/v1/messages", json=body, timeout=10)
    events = [block.split("\n") for block in response.text.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in events]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = orjson.loads(events[0][1].removeprefix("data: "))
    usage = start["message"]["usage"]
    assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (4, 2)
    # litellm's prompt_tokens are Anthropic's input tokens plus both cached parts.
    answer = call(mock_provider, "anthropic", provider, messages=body["messages"])
    reference = call(mock_provider, "openai", unique("o"), messages=body["messages"])
    assert answer.usage.prompt_tokens == reference.usage.prompt_tokens
    assert answer.usage.prompt_tokens_details.cached_tokens == 4
    assert answer.usage.cache_creation_input_tokens == 2


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
def test_faults_in_the_dialects_error_shape(mock_provider, kind):
    provider = unique(kind)
    mock_provider.control(provider, error_rate=1.0, error_status=503)
    with pytest.raises(litellm.ServiceUnavailableError) as raised:
        call(mock_provider, kind, provider)
    assert raised.value.status_code == 503
    assert "mock fault" in str(raised.value)
    assert mock_provider.stats(provider)["errors"] == 1


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
def test_a_dropped_stream_breaks_off(mock_provider, kind):
    provider = unique(kind)
    mock_provider.control(provider, drop_after=2)
    with pytest.raises(litellm.exceptions.MidStreamFallbackError, match="Response payload is not completed"):
        streamed(mock_provider, kind, provider)
    assert mock_provider.stats(provider)["completed"] == 0
