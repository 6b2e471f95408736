"""Every HTTP response carries x-sentinel-request-id: the client's when it sent a sane one, a new one
otherwise, on the API (errors and unknown URLs included), the probes, the console and the metrics;
and X-Content-Type-Options: nosniff, once."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from billing.ledger import drain
from billing.models import LedgerEntry

GENERATED = re.compile(r"^req_[0-9a-f]{32}$")


def requests_to_make(gateway, api_key: str, alias: str) -> list[tuple[str, str, dict]]:
    key = {"authorization": f"Bearer {api_key}"}
    chat = {"model": alias, "messages": [{"role": "user", "content": "hi"}]}
    return [
        ("POST", "/v1/chat/completions", {"headers": key, "json": chat}),
        ("POST", "/v1/chat/completions", {"headers": key, "json": {**chat, "stream": True}}),
        ("POST", "/v1/chat/completions", {"headers": key, "content": b"{not json"}),
        ("POST", "/v1/chat/completions", {"json": chat}),  # no key
        ("GET", "/v1/chat/completions", {}),  # wrong method
        ("POST", "/v1/chat/completions", {"headers": key, "content": b"x" * (4 * 1024 * 1024 + 1)}),  # 413
        ("GET", "/v1/models", {"headers": key}),
        ("GET", "/v1/models", {}),
        ("GET", "/v1/no/such/thing", {}),
        ("GET", "/health/live", {}),
        ("GET", "/health/ready", {}),
        ("GET", "/metrics", {}),
        ("GET", "/admin/login/", {}),
        ("GET", "/no-such-page/", {}),
        ("GET", "/api/schema/", {}),
    ]


def test_every_response_carries_a_generated_request_id(gateway, api_key, model):
    seen = set()
    for method, path, options in requests_to_make(gateway, api_key, model[0]):
        response = httpx.request(method, gateway.url + path, timeout=30, **options)
        request_id = response.headers.get("x-sentinel-request-id")
        assert request_id and GENERATED.match(request_id), (method, path, response.status_code)
        assert len(response.headers.get_list("x-sentinel-request-id")) == 1, (method, path)
        seen.add(request_id)
    assert len(seen) == len(requests_to_make(gateway, api_key, model[0]))


def test_every_response_says_nosniff_once(gateway, api_key, model):
    """The hot endpoints (no Django), the rest of the API (Django without middleware), their errors,
    the console, static files: a browser may guess the type of none of them."""
    key = {"authorization": f"Bearer {api_key}"}
    more = [
        ("GET", "/static/console/live.js", {}),
        ("GET", "/v1/files/file-none/content", {"headers": key}),
        ("POST", "/v1/files", {"headers": key, "content": b"x" * (51 * 1024 * 1024)}),  # 413, API handler
    ]
    for method, path, options in [*requests_to_make(gateway, api_key, model[0]), *more]:
        response = httpx.request(method, gateway.url + path, timeout=30, **options)
        assert response.headers.get_list("x-content-type-options") == ["nosniff"], (method, path, response.status_code)


def test_a_clients_request_id_is_returned_on_every_response(gateway, api_key, model):
    for index, (method, path, options) in enumerate(requests_to_make(gateway, api_key, model[0])):
        mine = f"client-trace.{index}:a-b_c"
        headers = {**options.pop("headers", {}), "x-sentinel-request-id": mine}
        response = httpx.request(method, gateway.url + path, headers=headers, timeout=30, **options)
        assert response.headers["x-sentinel-request-id"] == mine, (method, path, response.status_code)


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "semi;colon", "", "é"])
def test_an_invalid_request_id_is_replaced(gateway, bad):
    response = httpx.get(f"{gateway.url}/health/live", headers={"x-sentinel-request-id": bad.encode()})
    assert GENERATED.match(response.headers["x-sentinel-request-id"])


def test_the_ledger_and_the_provider_get_the_same_id(gateway, tenant, api_key, model, mock_provider, live_db):
    alias, (provider,) = model
    mine = "trace-to-the-provider"
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {api_key}", "x-sentinel-request-id": mine},
        json={"model": alias, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200
    assert mock_provider.stats(provider)["last_request_id"] == mine
    time.sleep(0.1)
    drain()
    assert list(LedgerEntry.objects.filter(tenant=tenant).values_list("request_id", flat=True)) == [mine]


def test_an_invalid_id_is_replaced_by_one_id_everywhere(gateway, tenant, api_key, model, mock_provider, live_db):
    alias, (provider,) = model
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {api_key}", "x-sentinel-request-id": "no good"},
        json={"model": alias, "messages": [{"role": "user", "content": "hi"}]},
    )
    generated = response.headers["x-sentinel-request-id"]
    assert GENERATED.match(generated)
    assert mock_provider.stats(provider)["last_request_id"] == generated
    time.sleep(0.1)
    drain()
    assert list(LedgerEntry.objects.filter(tenant=tenant).values_list("request_id", flat=True)) == [generated]
