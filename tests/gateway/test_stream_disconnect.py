"""A stream the client leaves before the provider's usage arrives is billed for what the provider
produced: the prompt as reserved for the deployment that answered, and the answer text relayed
counted by that deployment's tokenizer (cl100k_base where it is not public, as litellm's own
counter does), never the number of chunks. Each endpoint that streams, over OpenAI- and
Anthropic-format deployments, cut by the official SDK closing its stream after three deltas."""

from __future__ import annotations

import anthropic
import pytest
from openai import OpenAI

from gateway.limits.tokens import encoding
from tests.conftest import unique
from tests.gateway import test_dialect_chains
from tests.gateway.test_dialect_chains import NO_CACHE, cost, ledger_rows

dialect_chain = test_dialect_chains.dialect_chain
# A word every tokenizer here splits in several tokens: a chunk per word, more tokens than chunks.
WORD = "xqzvbrtk"
WORDS = 40
ENCODINGS = {"openai": "o200k_base", "anthropic": "cl100k_base"}  # gpt-4o's; Anthropic's is not public


def read_three_then_leave(endpoint: str, gateway, key: str, alias: str, prompt: str) -> str:
    """Open a stream, read three text deltas, close it; returns the request id."""
    if endpoint == "messages":
        client = anthropic.Anthropic(
            base_url=gateway.url, api_key=key, max_retries=0, timeout=30, default_headers=NO_CACHE
        )
        with client.messages.stream(
            model=alias, max_tokens=200, messages=[{"role": "user", "content": prompt}]
        ) as stream:
            request_id = stream.response.headers["x-sentinel-request-id"]
            for seen, _ in enumerate(stream.text_stream, 1):
                if seen == 3:
                    break
        return request_id
    client = OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30, default_headers=NO_CACHE)
    if endpoint == "responses":
        raw = client.responses.with_raw_response.create(model=alias, input=prompt, stream=True)
        deltas = (event for event in raw.parse() if event.type == "response.output_text.delta")
    else:
        raw = client.chat.completions.with_raw_response.create(
            model=alias, messages=[{"role": "user", "content": prompt}], stream=True
        )
        deltas = (chunk for chunk in raw.parse() if chunk.choices and chunk.choices[0].delta.content)
    for seen, _ in enumerate(deltas, 1):
        if seen == 3:
            break
    raw.http_response.close()
    return raw.headers["x-sentinel-request-id"]


@pytest.mark.parametrize(
    ("endpoint", "kind"),
    [("chat", "openai"), ("chat", "anthropic"), ("messages", "openai"), ("responses", "anthropic")],
)
def test_a_stream_the_client_leaves_is_billed_for_the_tokens_relayed(
    gateway, api_key, dialect_chain, mock_provider, endpoint, kind
):
    alias, (provider,) = dialect_chain(kind)
    prompt = unique("leave early")
    answer = " ".join([WORD] * WORDS)
    # Slow enough that the client leaves long before the end (and the provider's usage).
    mock_provider.control(provider, tpt_ms=150, tokens=WORDS, answers={prompt: answer})
    request_id = read_three_then_leave(endpoint, gateway, api_key, alias, prompt)

    row = ledger_rows([request_id])[request_id]
    assert (row.status_code, row.error_code) == (499, "client_disconnected")
    tokenizer = encoding(ENCODINGS[kind])
    by_words = {len(tokenizer.encode_ordinary(" ".join([WORD] * n))): n for n in range(1, WORDS + 1)}
    assert len(tokenizer.encode_ordinary(WORD)) >= 2  # the point: tokens are not chunks
    # The tokenizer's count of a whole number of the words relayed: at least the three the client
    # read, not all forty (it left), and more tokens than chunks.
    assert row.completion_tokens in by_words, row.completion_tokens
    assert 3 <= by_words[row.completion_tokens] < WORDS
    assert row.completion_tokens > by_words[row.completion_tokens]
    assert row.prompt_tokens > 0
    assert row.cost_usd == cost(kind, row.prompt_tokens, row.completion_tokens)
