"""The fast path's own behaviour beyond the contract tests: what it sends besides the body, and how
it answers parameters litellm cannot translate."""

from __future__ import annotations

import pytest

from gateway import transport
from gateway.failures import UpstreamError


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
