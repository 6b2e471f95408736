"""The mock provider: deterministic answers, OpenAI's wire format, and faults switched at run time."""

import httpx
import pytest

from gateway.mock_provider import REFUSAL_TEXT, answer_text
from tests.conftest import unique


@pytest.fixture
def provider(mock_provider):
    return unique("mockp")


def chat(mock_provider, provider, prompt="hello", **body):
    return httpx.post(
        f"{mock_provider.api_base(provider)}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": prompt}], **body},
        timeout=10,
    )


def test_answers_are_deterministic_per_prompt(mock_provider, provider):
    first, again, other = (
        chat(mock_provider, provider, "a"),
        chat(mock_provider, provider, "a"),
        chat(mock_provider, provider, "b"),
    )
    text = first.json()["choices"][0]["message"]["content"]
    assert text == again.json()["choices"][0]["message"]["content"] == answer_text("a")
    assert text != other.json()["choices"][0]["message"]["content"]
    assert len(text.split()) == 40
    assert first.json()["usage"]["completion_tokens"] == 40


def test_stream_is_sse_with_usage_when_asked(mock_provider, provider):
    response = chat(mock_provider, provider, "s", stream=True, stream_options={"include_usage": True}, max_tokens=3)
    events = [line[6:] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert '"usage"' in events[-2] and '"completion_tokens":3' in events[-2]
    assert '"finish_reason":"length"' in events[-3]


def test_error_rate_and_status(mock_provider, provider):
    mock_provider.control(provider, error_rate=0.5, error_status=429, retry_after=2)
    statuses = [chat(mock_provider, provider).status_code for _ in range(4)]
    assert statuses == [200, 429, 200, 429]
    stats = mock_provider.stats(provider)
    assert stats["calls"] == 4 and stats["errors"] == 2


def test_retry_after_header(mock_provider, provider):
    mock_provider.control(provider, error_rate=1.0, error_status=503, retry_after=3)
    response = chat(mock_provider, provider)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "3"


@pytest.mark.parametrize("setting", ["stall_ms", "slow_ms", "ttft_ms"])
def test_added_latency(mock_provider, provider, setting):
    """The added latency holds the answer back: a client that waits less than it gets nothing (the
    server cannot answer before its own sleep ends), one that waits longer gets the answer."""
    mock_provider.control(provider, **{setting: 1000})
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{mock_provider.api_base(provider)}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
            timeout=httpx.Timeout(10, read=0.2),
        )
    assert chat(mock_provider, provider).status_code == 200


def test_drop_mid_stream(mock_provider, provider):
    mock_provider.control(provider, drop_after=2)
    with pytest.raises(httpx.RemoteProtocolError):
        chat(mock_provider, provider, stream=True)


def test_refusal_trigger(mock_provider, provider):
    content = chat(mock_provider, provider, "tell me [[refuse]]").json()["choices"][0]["message"]["content"]
    assert content == REFUSAL_TEXT


def test_unknown_fault_setting_is_refused(mock_provider, provider):
    response = httpx.post(f"{mock_provider.url}/_control/{provider}", json={"explode": True})
    assert response.status_code == 400
