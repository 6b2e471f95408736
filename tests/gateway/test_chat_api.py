"""POST /v1/chat/completions and GET /v1/models end to end: the official OpenAI SDK against a real
gateway process, which reaches the mock provider over HTTP through litellm."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import httpx
import openai
import orjson
import pytest
from django.utils import timezone
from openai import OpenAI

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.mock_provider import answer_text
from tenants.models import Tenant
from tenants.services import key_revoke, tenant_set_status


def ask(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def test_non_streamed_answer_is_the_providers_answer(client, model, mock_provider):
    alias, (provider,) = model
    raw = client.chat.completions.with_raw_response.create(model=alias, messages=ask("What is 2+2?"))
    completion = raw.parse()

    assert completion.choices[0].message.content == answer_text("What is 2+2?")
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.completion_tokens == 40
    assert completion.usage.prompt_tokens > 0
    assert raw.headers["x-sentinel-provider"] == provider
    assert raw.headers["x-sentinel-cache"] == "miss"
    assert raw.headers["x-sentinel-fallbacks"] == "0"
    assert raw.headers["x-sentinel-request-id"].startswith("req_")
    assert mock_provider.stats(provider)["calls"] == 1
    assert mock_provider.stats(provider)["last_model"] == "gpt-4o-mini"


def test_streamed_answer_is_the_providers_answer(client, model):
    alias, _ = model
    chunks = list(client.chat.completions.create(model=alias, messages=ask("Stream me"), stream=True))

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer_text("Stream me")
    assert chunks[-1].choices[0].finish_reason == "stop"
    # No usage-only chunk unless the client asked for one (a chunk without choices breaks naive clients).
    assert all(c.choices for c in chunks)


def test_streamed_usage_when_asked(client, model):
    alias, _ = model
    chunks = list(
        client.chat.completions.create(
            model=alias, messages=ask("usage please"), stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 40


def test_a_streams_cost_comes_in_its_usage_chunk(client, model, live_db):
    """A stream has no header for its cost: the final usage chunk carries it (`usage.cost_usd`, the
    ledger's exact figure), so apps reconcile streamed requests as they do the others."""
    alias, _ = model
    stream = client.chat.completions.with_raw_response.create(
        model=alias, messages=ask("what did this cost"), stream=True, stream_options={"include_usage": True}
    )
    request_id = stream.headers["x-sentinel-request-id"]
    chunks = list(stream.parse())
    cost = chunks[-1].usage.model_extra["cost_usd"]
    drain()
    assert Decimal(cost) == LedgerEntry.objects.get(request_id=request_id).cost_usd > 0


def test_max_tokens_reaches_the_provider(client, model):
    alias, _ = model
    completion = client.chat.completions.create(model=alias, messages=ask("short"), max_tokens=5)
    assert completion.choices[0].message.content == answer_text("short", 5)
    assert completion.choices[0].finish_reason == "length"


def test_the_sdks_parameters_all_pass(client, model, mock_provider):
    """What the official SDK sends in normal use is on the allowlist (anything else is refused:
    tests/gateway/upstream/test_providers.py), and reaches the provider as sent."""
    alias, (provider,) = model
    weather = {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            "strict": True,
        },
    }
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    completion = client.chat.completions.create(
        model=alias,
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "sdk parameters"}], "name": "ada"},
        ],
        tools=[weather],
        tool_choice="auto",
        parallel_tool_calls=False,
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}},
        temperature=0.2,
        top_p=0.9,
        seed=7,
        stop=["\n\n"],
        presence_penalty=0.1,
        frequency_penalty=0.1,
        logit_bias={"50256": -100},
        logprobs=True,
        top_logprobs=2,
        max_completion_tokens=50,
        store=True,
        metadata={"job": "nightly"},
        user="user-1",
        safety_identifier="user-1-hash",
        prompt_cache_key="sdk-test",
        service_tier="auto",
        extra_body={"cache": {"no-store": True}},
    )
    assert completion.choices[0].message.content == answer_text("sdk parameters")
    sent = orjson.loads(mock_provider.stats(provider)["last_body"])
    assert sent["tools"] == [weather] and sent["seed"] == 7 and sent["metadata"] == {"job": "nightly"}
    assert sent["logit_bias"] == {"50256": -100} and sent["safety_identifier"] == "user-1-hash"
    assert "cache" not in sent  # Sentinel's own

    # An answer goes back into the conversation as the SDK gives it.
    followed = client.chat.completions.create(
        model=alias, messages=[*ask("first"), completion.choices[0].message, *ask("and then?")]
    )
    assert followed.choices[0].message.content == answer_text("and then?")


def test_x_api_key_header_also_authenticates(gateway, api_key, model):
    alias, _ = model
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"x-api-key": api_key},
        json={"model": alias, "messages": ask("via x-api-key")},
    )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == answer_text("via x-api-key")


def test_client_request_id_is_kept_and_a_bad_one_replaced(gateway, api_key, model):
    alias, _ = model
    body = {"model": alias, "messages": ask("ids")}
    headers = {"authorization": f"Bearer {api_key}"}
    kept = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={**headers, "x-sentinel-request-id": "trace-42.a"},
        json=body,
    )
    replaced = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={**headers, "x-sentinel-request-id": "bad id; drop table"},
        json=body,
    )
    assert kept.headers["x-sentinel-request-id"] == "trace-42.a"
    assert replaced.headers["x-sentinel-request-id"].startswith("req_")


def test_every_request_gets_a_ledger_row(client, model, tenant, live_db):
    alias, (provider,) = model
    raw = client.chat.completions.with_raw_response.create(model=alias, messages=ask("bill me"))
    list(client.chat.completions.create(model=alias, messages=ask("bill my stream"), stream=True))
    time.sleep(0.3)  # the stream's record is handed off as the stream ends
    drain()

    rows = {row.stream: row for row in LedgerEntry.objects.filter(tenant=tenant)}
    assert set(rows) == {False, True}
    plain = rows[False]
    assert plain.request_id == raw.headers["x-sentinel-request-id"]
    assert plain.model_requested == alias
    assert plain.model_served == "openai/gpt-4o-mini"
    assert plain.provider == provider
    assert plain.status_code == 200
    assert plain.completion_tokens == 40
    # gpt-4o-mini in litellm's bundled map: $0.15 / 1M prompt tokens, $0.60 / 1M completion tokens.
    assert plain.cost_usd == plain.prompt_tokens * Decimal("0.00000015") + 40 * Decimal("0.0000006")
    assert str(plain.cost_usd) == raw.headers["x-sentinel-cost-usd"]
    assert plain.price_id is not None
    assert plain.key_id is not None
    assert rows[True].completion_tokens == 40
    assert rows[True].ttft_ms is not None


def test_models_lists_what_the_key_may_use(gateway, make_tenant, make_key, make_model):
    allowed, _ = make_model()
    other, _ = make_model()
    key = make_key(make_tenant(allowed_models=[allowed]))
    listed = [m.id for m in OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0).models.list()]
    assert allowed in listed
    assert other not in listed


# --- errors: each in OpenAI's shape with a precise code, and none reaches the provider ------------


def post(gateway, *, key: str | None, body=None, content: bytes | None = None, headers=None):
    all_headers = {"content-type": "application/json", **(headers or {})}
    if key is not None:
        all_headers["authorization"] = f"Bearer {key}"
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers=all_headers,
        json=body if content is None else None,
        content=content,
        timeout=30,
    )


def assert_error(response: httpx.Response, status: int, code: str, error_type: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["message"]
    if error_type:
        assert error["type"] == error_type
    return error


@pytest.fixture
def untouched(mock_provider, model):
    """Asserts after the test that the provider behind `model` was never called."""
    yield model
    assert mock_provider.stats(model[1][0])["calls"] == 0


def test_missing_key(gateway, untouched):
    error = assert_error(
        post(gateway, key=None, body={"model": untouched[0], "messages": ask("x")}),
        401,
        "invalid_api_key",
        "authentication_error",
    )
    assert "Missing API key" in error["message"]


def test_unknown_key(gateway, untouched):
    assert_error(
        post(gateway, key="sk-sen-nope", body={"model": untouched[0], "messages": ask("x")}),
        401,
        "invalid_api_key",
    )


def test_revoked_key_is_refused_at_once(gateway, tenant, live_db, make_model, mock_provider):
    from tenants.services import key_create

    alias, (provider,) = make_model()
    key, secret = key_create(tenant=tenant, name="to revoke")
    assert post(gateway, key=secret, body={"model": alias, "messages": ask("before")}).status_code == 200
    key_revoke(key=key)
    response = post(gateway, key=secret, body={"model": alias, "messages": ask("after")})
    assert_error(response, 401, "invalid_api_key")
    assert "revoked" in response.json()["error"]["message"]
    assert mock_provider.stats(provider)["calls"] == 1


def test_expired_key(gateway, tenant, make_key, untouched):
    secret = make_key(tenant, expires_at=timezone.now() - timedelta(seconds=1))
    response = post(gateway, key=secret, body={"model": untouched[0], "messages": ask("x")})
    assert_error(response, 401, "invalid_api_key")
    assert "expired" in response.json()["error"]["message"]


def test_suspended_tenant(gateway, tenant, api_key, untouched):
    tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)
    assert_error(
        post(gateway, key=api_key, body={"model": untouched[0], "messages": ask("x")}),
        403,
        "tenant_suspended",
        "permission_error",
    )
    tenant_set_status(tenant=tenant, status=Tenant.Status.ACTIVE)


def test_model_not_on_the_allowlist(gateway, make_tenant, make_key, untouched):
    key = make_key(make_tenant(allowed_models=["something-else"]))
    error = assert_error(
        post(gateway, key=key, body={"model": untouched[0], "messages": ask("x")}), 403, "model_not_allowed"
    )
    assert error["param"] == "model"


def test_key_allowlist_narrows_the_tenants(gateway, tenant, make_key, untouched):
    key = make_key(tenant, allowed_models=["only-this"])
    assert_error(post(gateway, key=key, body={"model": untouched[0], "messages": ask("x")}), 403, "model_not_allowed")


def test_unknown_model(gateway, api_key):
    assert_error(
        post(gateway, key=api_key, body={"model": "no-such-model", "messages": ask("x")}),
        404,
        "model_not_found",
    )


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b'{"model": "m", "messages": [', "invalid_json"),
        (b"", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
    ],
)
def test_malformed_json(gateway, api_key, untouched, content, code):
    assert_error(post(gateway, key=api_key, content=content), 400, code, "invalid_request_error")


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "missing_required_parameter", "model"),
        ({"model": "MODEL"}, "missing_required_parameter", "messages"),
        ({"model": "MODEL", "messages": []}, "invalid_value", "messages"),
        ({"model": "MODEL", "messages": "hi"}, "invalid_type", "messages"),
        ({"model": 42, "messages": [{"role": "user", "content": "x"}]}, "invalid_type", "model"),
        (
            {"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
            "invalid_type",
            "temperature",
        ),
        (
            {"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "temperature": 3},
            "invalid_value",
            "temperature",
        ),
        (
            {"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
            "invalid_type",
            "stream",
        ),
        (
            {"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            "invalid_value",
            "max_tokens",
        ),
        (
            {"model": "MODEL", "messages": [{"role": "wizard", "content": "x"}]},
            "invalid_value",
            "messages[0].role",
        ),
        (
            {"model": "MODEL", "messages": [{"content": "x"}]},
            "missing_required_parameter",
            "messages[0].role",
        ),
        (
            {"model": "MODEL", "messages": [{"role": "user", "content": 5}]},
            "invalid_type",
            "messages[0].content",
        ),
    ],
)
def test_invalid_fields(gateway, api_key, untouched, body, code, param):
    if body.get("model") == "MODEL":
        body["model"] = untouched[0]
    error = assert_error(post(gateway, key=api_key, body=body), 400, code, "invalid_request_error")
    assert error["param"] == param


def test_body_over_the_limit_declared(gateway, api_key, untouched):
    big = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"a" * (4 * 1024 * 1024) + b'"}]}'
    assert_error(post(gateway, key=api_key, content=big), 413, "request_too_large")


def test_body_over_the_limit_chunked(gateway, api_key, untouched):
    def body():
        yield b'{"model": "x", "messages": [{"role": "user", "content": "'
        for _ in range(5):
            yield b"a" * (1024 * 1024)
        yield b'"}]}'

    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {api_key}", "content-type": "application/json"},
        content=body(),
        timeout=30,
    )
    assert_error(response, 413, "request_too_large")


def test_wrong_method_and_unknown_path(gateway, api_key):
    assert_error(httpx.get(f"{gateway.base_url}/chat/completions"), 405, "method_not_allowed")
    assert_error(httpx.get(f"{gateway.base_url}/nothing/here"), 404, "unknown_url")


def test_sdk_raises_typed_errors(gateway, model):
    bad = OpenAI(base_url=gateway.base_url, api_key="sk-sen-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.chat.completions.create(model=model[0], messages=ask("x"))
    assert caught.value.code == "invalid_api_key"


def test_refused_requests_are_recorded_at_zero_cost(gateway, tenant, api_key, untouched, live_db):
    post(gateway, key=api_key, body={"model": untouched[0], "messages": "nope"})
    drain()
    row = LedgerEntry.objects.get(tenant=tenant)
    assert (row.status_code, row.error_code, row.cost_usd, row.provider) == (400, "invalid_type", 0, "")
