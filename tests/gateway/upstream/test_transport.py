"""The fast path's own behaviour beyond the contract tests: what it sends besides the body, and how
it answers parameters litellm cannot translate."""

from __future__ import annotations

import orjson
import pytest

from gateway.upstream import transport
from gateway.upstream.failures import UpstreamError


@pytest.fixture
def route() -> transport.FastRoute:
    return transport.prepare("openai/gpt-4o-mini", "http://127.0.0.1:9/v1", "sk-test")


def test_parameters_litellm_cannot_translate_are_the_clients_error(route):
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    with pytest.raises(UpstreamError) as caught:
        transport._request_body(route, body, stream=False)
    error = caught.value
    assert (error.status, error.code, error.retryable, error.client_fault) == (400, "invalid_request", False, True)
    assert "could not be translated" in error.message


def test_the_request_id_goes_upstream_with_the_providers_headers(route):
    headers = transport._headers(route, "req-abc")
    assert headers["x-request-id"] == "req-abc"
    assert headers["Authorization"] == "Bearer sk-test"


def test_the_body_holds_openais_parameters_alone(route):
    """The second line of defence on this path: the provider's body is built from the allowlist, so
    a body that skipped validation still sends nothing else (and the URL and headers are the
    deployment's, resolved once)."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
        "metadata": {"job": "nightly"},
        "api_base": "http://127.0.0.1:9/elsewhere",
        "base_url": "http://127.0.0.1:9/elsewhere",
        "extra_headers": {"authorization": "Bearer other"},
        "litellm_params": {"api_base": "http://127.0.0.1:9/elsewhere"},
        "cache": {"no-store": True},
        "stream_options": {"include_usage": False},
    }
    sent = orjson.loads(transport._request_body(route, body, stream=False))
    assert sent == {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
        "metadata": {"job": "nightly"},
        "stream": False,
    }
    streamed = orjson.loads(transport._request_body(route, body, stream=True))
    assert streamed["stream_options"] == {"include_usage": True}
    assert set(streamed) == {"model", "messages", "temperature", "metadata", "stream", "stream_options"}
    assert route.url == "http://127.0.0.1:9/v1/chat/completions"
