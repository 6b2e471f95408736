"""Only OpenAI's parameters reach a provider call: a request body cannot redirect the call made with
the operator's provider key, or add headers or credentials to it. Driven end to end through
deployments litellm translates (litellm.acompletion does the whole call), whose upstream is a local
listener, with a second listener standing for the place a caller would redirect the call to."""

from __future__ import annotations

import functools
import inspect
import re
import uuid
from pathlib import Path

import httpx
import litellm
import orjson
import pytest
from litellm.llms.bedrock.base_aws_llm import BaseAWSLLM
from litellm.types.utils import all_litellm_params

from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
from gateway.schemas import CHAT_PARAMETERS
from gateway.upstream import providers
from gateway.upstream.routing import Target
from tests.conftest import unique
from tests.gateway.upstream.targets import target as plain_target
from tests.servers import Listener

ANTHROPIC_MODEL = "anthropic/claude-3-5-haiku-20241022"
ANTHROPIC_ANSWER = {
    "id": "msg_listener",
    "type": "message",
    "role": "assistant",
    "model": "claude-3-5-haiku-20241022",
    "content": [{"type": "text", "text": "hello from the listener"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 5, "output_tokens": 4},
}
OLLAMA_ANSWER = {
    "model": "llama3",
    "created_at": "2026-12-01T00:00:00Z",
    "response": "hello from the listener",
    "done": True,
    "prompt_eval_count": 5,
    "eval_count": 4,
}


def provider_listener() -> Listener:
    """A listener that answers as a provider would (Anthropic's messages API, Ollama's generate API),
    so that a redirected call succeeds as it did in the attack."""
    return Listener(
        respond=lambda path, headers, body: (200, orjson.dumps(OLLAMA_ANSWER if "/api/" in path else ANTHROPIC_ANSWER))
    )


@pytest.fixture
def upstream():
    listener = provider_listener()
    yield listener
    listener.close()


@pytest.fixture
def redirect():
    listener = provider_listener()
    yield listener
    listener.close()


def translated_model(litellm_model: str, kind: str, *, api_base: str = "") -> tuple[str, str]:
    """A model alias on a deployment litellm translates; returns (alias, the operator's key)."""
    secret = f"sk-operator-{uuid.uuid4().hex}"
    provider = Provider(name=unique("translated"), kind=kind, api_base=api_base)
    provider.set_api_key(secret)
    provider.save()
    alias = ModelAlias.objects.create(name=unique("translated"))
    deployment = Deployment.objects.create(name=provider.name, provider=provider, litellm_model=litellm_model)
    ChainEntry.objects.create(alias=alias, deployment=deployment)
    return alias.name, secret


def ask(gateway, key: str, body: dict) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body)


def refusal(response: httpx.Response) -> tuple:
    if response.status_code != 400:
        return (response.status_code,)
    error = response.json()["error"]
    return (400, error["type"], error["code"], error["param"], error["message"])


def unknown(name: str) -> tuple:
    """OpenAI's own answer to a parameter it does not know."""
    return (400, "invalid_request_error", "unknown_parameter", name, f"Unrecognized request argument supplied: {name}")


def test_the_body_cannot_redirect_a_translated_call_with_the_operators_key(
    gateway, tenant, make_key, redirect, live_db
):
    """The issue's attack, as reported: an Ollama deployment with no API base of its own, and
    `api_base` in the body. The call went to the caller's URL with the operator's key, and the
    caller got a 200."""
    alias, secret = translated_model("ollama/llama3", "ollama")
    key = make_key(tenant)
    response = ask(
        gateway,
        key,
        {"model": alias, "messages": [{"role": "user", "content": "hi"}], "api_base": f"{redirect.origin}/x"},
    )

    assert refusal(response) == unknown("api_base")
    assert redirect.requests == []
    assert secret not in response.text


def test_the_fast_path_refuses_them_too(gateway, api_key, model, mock_provider, redirect):
    """OpenAI-format deployments relay the body (gateway.upstream.transport): the same allowlist applies."""
    alias, (provider,) = model
    for name in ("api_base", "base_url", "api_key", "extra_headers", "headers", "custom_llm_provider"):
        body = {"model": alias, "messages": [{"role": "user", "content": "hi"}]}
        body[name] = hostile_value(name, redirect.origin)
        assert refusal(ask(gateway, api_key, body)) == unknown(name)
    assert mock_provider.stats(provider)["calls"] == 0
    assert redirect.requests == []


# --- every keyword litellm takes ----------------------------------------------------------------

LITELLM_SOURCE = Path(litellm.__file__).parent
# Where litellm's code reads a setting from the keywords of a call (or the dicts they are sorted into).
READ_FROM_KEYWORDS = re.compile(
    r"\b(?:kwargs|optional_params|litellm_params|non_default_params|passed_params)\.(?:get|pop)\(\s*\"(\w+)\""
)


@functools.cache
def litellm_keywords() -> frozenset[str]:
    """Every keyword litellm.completion takes: its signature, every name litellm owns (connection,
    credentials, routing, callbacks, pricing: `all_litellm_params`), the AWS credentials its Bedrock
    and SageMaker providers take, and every name litellm's code reads from a call's keywords."""
    names = set(inspect.signature(litellm.completion).parameters) - {"kwargs"}
    names |= set(all_litellm_params)
    names |= set(BaseAWSLLM().aws_authentication_params)
    for source in LITELLM_SOURCE.rglob("*.py"):
        names |= set(READ_FROM_KEYWORDS.findall(source.read_text(errors="replace")))
    return frozenset(names)


def hostile_value(name: str, url: str) -> object:
    """What a caller would put in the keyword to move the call or add to it."""
    if "header" in name:
        return {"authorization": f"Bearer {url}", "x-forwarded-host": url}
    if name.endswith(("_params", "_config", "_settings")) or name in ("metadata", "litellm_metadata"):
        return {"api_base": url, "base_url": url}
    return url


def test_every_keyword_litellm_takes_is_refused_unless_it_is_openais(
    gateway, tenant, make_key, upstream, redirect, live_db
):
    alias, secret = translated_model(ANTHROPIC_MODEL, "anthropic", api_base=upstream.origin)
    key = make_key(tenant)
    keywords = litellm_keywords()
    assert len(keywords) > 500  # the scan found litellm's code, not nothing

    misanswered = {}
    with httpx.Client(headers={"authorization": f"Bearer {key}"}, timeout=30) as client:
        for name in sorted(keywords - CHAT_PARAMETERS):
            body = {"model": alias, "messages": [{"role": "user", "content": "hi"}]}
            body[name] = hostile_value(name, f"{redirect.origin}/{name}")
            response = client.post(f"{gateway.base_url}/chat/completions", json=body)
            if refusal(response) != unknown(name) or secret in response.text:
                misanswered[name] = refusal(response)

    assert misanswered == {}
    assert redirect.requests == []
    assert upstream.requests == []  # refused before any call


def test_the_keywords_litellm_shares_with_openai_reach_only_the_configured_upstream(
    gateway, make_tenant, make_key, upstream, redirect, live_db
):
    """The names litellm takes that are also OpenAI's request fields are accepted (or refused as
    invalid), and with values that look like settings they still move nothing: `metadata` is
    litellm's own on its path (the client's is replaced), `cache` is Sentinel's (never forwarded),
    the rest are request fields the provider gets, not settings of the call."""
    alias, secret = translated_model(ANTHROPIC_MODEL, "anthropic", api_base=upstream.origin)
    key = make_key(make_tenant(cache_enabled=False))  # every accepted request is a call
    url = f"{redirect.origin}/x"
    shared = sorted((litellm_keywords() & CHAT_PARAMETERS) - {"model", "messages"})
    assert {"metadata", "cache", "user", "tools", "response_format"} <= set(shared)

    statuses = {}
    with httpx.Client(headers={"authorization": f"Bearer {key}"}, timeout=30) as client:
        for name in shared:
            body = {"model": alias, "messages": [{"role": "user", "content": "hi"}]}
            body[name] = {"no-store": True} if name == "cache" else hostile_value(name, url)
            response = client.post(f"{gateway.base_url}/chat/completions", json=body)
            statuses[name] = response.status_code
            assert secret not in response.text

    assert set(statuses.values()) <= {200, 400}, statuses
    assert (statuses["metadata"], statuses["user"], statuses["cache"]) == (200, 200, 200)
    assert redirect.requests == []
    assert {(method, path) for method, path, _, _ in upstream.calls} == {("POST", "/v1/messages")}
    assert len(upstream.requests) == list(statuses.values()).count(200)
    for _, _, headers, body in upstream.calls:
        assert headers["x-api-key"] == secret
        assert not any(redirect.origin in value for value in headers.values())
        assert b"base_url" not in body  # the client's metadata went nowhere


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": "hi", "api_base": "{url}"}, "messages[0].api_base"),
        ({"role": "user", "content": "hi", "extra_headers": {"x": "{url}"}}, "messages[0].extra_headers"),
        ({"role": "user", "content": "hi", "litellm_params": {"api_base": "{url}"}}, "messages[0].litellm_params"),
    ],
)
def test_a_message_carries_no_settings(message, param, gateway, tenant, make_key, upstream, redirect, live_db):
    alias, _ = translated_model(ANTHROPIC_MODEL, "anthropic", api_base=upstream.origin)
    message = orjson.loads(orjson.dumps(message).decode().replace("{url}", redirect.origin))
    response = ask(gateway, make_key(tenant), {"model": alias, "messages": [message]})

    assert refusal(response) == unknown(param)
    assert redirect.requests == [] and upstream.requests == []


def test_a_tool_cannot_send_the_call_through_litellms_mcp_gateway(
    gateway, tenant, make_key, upstream, redirect, live_db
):
    """litellm runs a tool of type "mcp" whose server_url names its MCP gateway itself; OpenAI's chat
    completions know function and custom tools only."""
    alias, _ = translated_model(ANTHROPIC_MODEL, "anthropic", api_base=upstream.origin)
    tool = {"type": "mcp", "server_url": f"litellm_proxy/mcp/{redirect.origin}", "server_label": "x"}
    body = {"model": alias, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    response = ask(gateway, make_key(tenant), body)

    assert refusal(response)[:4] == (400, "invalid_request_error", "invalid_value", "tools[0].type")
    assert redirect.requests == [] and upstream.requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_parameter_the_provider_lacks_is_the_clients_error(
    stream, gateway, tenant, make_key, upstream, live_db
):
    """litellm refuses an OpenAI parameter a translated provider has no equivalent for; that was a
    500 (its exception carries no HTTP response), and is the client's 400, naming the parameter."""
    alias, _ = translated_model(ANTHROPIC_MODEL, "anthropic", api_base=upstream.origin)
    body = {"model": alias, "messages": [{"role": "user", "content": "hi"}], "verbosity": "low", "stream": stream}
    response = ask(gateway, make_key(tenant), body)

    assert refusal(response) == (
        400,
        "invalid_request_error",
        "unsupported_parameter",
        "verbosity",
        "Unsupported parameter: 'verbosity' is not supported with this model.",
    )
    assert upstream.requests == []


def test_litellm_fetches_no_image_from_an_internal_address(gateway, tenant, make_key, upstream, redirect, live_db):
    """A content part is the model's input, yet for providers that take images inline litellm
    downloads an image URL itself: its own guard (litellm.user_url_validation, on by default, which
    Sentinel leaves on) refuses loopback, private and link-local addresses before connecting."""
    alias, _ = translated_model("ollama/llama3", "ollama", api_base=upstream.origin)
    image = {"type": "image_url", "image_url": {"url": f"{redirect.origin}/image.png"}}
    body = {"model": alias, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]}
    response = ask(gateway, make_key(tenant), body)

    assert refusal(response)[:3] == (400, "invalid_request_error", "invalid_request")
    assert redirect.requests == [] and upstream.requests == []


# --- the provider layer's own line of defence ---------------------------------------------------


def target(litellm_model: str, api_base: str | None, api_key: str | None) -> Target:
    return plain_target(
        deployment_id=1,
        provider_kind="anthropic",
        litellm_model=litellm_model,
        api_base=api_base,
        api_key=api_key,
        timeout=10.0,
        first_token_timeout=5.0,
        max_retries=0,
    )


@pytest.mark.parametrize("api_base", [None, "http://127.0.0.1:9/configured"])
@pytest.mark.parametrize("stream", [False, True])
def test_litellms_arguments_are_built_from_the_allowlist_alone(stream, api_base):
    """Even a body that skipped validation (a batch item stored by an older version, a future code
    path) gives litellm nothing but OpenAI's parameters and the deployment's own settings."""
    url = "http://127.0.0.1:9/redirect"
    body = {name: hostile_value(name, url) for name in litellm_keywords()}
    body.update(model="alias", messages=[{"role": "user", "content": "hi"}], temperature=0.5)
    args = providers._arguments(target(ANTHROPIC_MODEL, api_base, "sk-operator"), body, stream=stream, request_id="r1")

    ours = {"model", "messages", "stream", "num_retries", "metadata", "api_key"}
    ours |= {"stream_options"} if stream else set()
    ours |= {"api_base"} if api_base else set()
    openais = (set(body) & CHAT_PARAMETERS) - {"model", "messages", "stream", "stream_options", "metadata", "cache"}
    assert set(args) == ours | openais
    assert (args["model"], args["api_key"], args.get("api_base")) == (ANTHROPIC_MODEL, "sk-operator", api_base)
    assert args["metadata"] == {"sentinel_request_id": "r1"}  # litellm's own: the client's is replaced
    assert args["temperature"] == 0.5


# --- what a client reads of a provider's failure ------------------------------------------------


@pytest.fixture
def garbage_upstream():
    """A provider that answers 200 with something no translation can read."""
    upstream = Listener(body=b'{"id": 7, "content": "not a message"}')
    yield upstream.origin
    upstream.close()


def test_a_malformed_answer_reaches_the_client_without_a_traceback(
    gateway, tenant, make_key, garbage_upstream, live_db
):
    """litellm puts a whole Python traceback into the message of some of its exceptions; the client
    gets an OpenAI-shaped error with none of it (no traceback, no server path)."""
    alias, secret = translated_model(ANTHROPIC_MODEL, "anthropic", api_base=garbage_upstream)
    response = ask(gateway, make_key(tenant), {"model": alias, "messages": [{"role": "user", "content": "hi"}]})

    assert response.status_code in (502, 503)
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert "Traceback" not in response.text
    assert not re.search(r"(/[\w.+-]+){2,}\.py", response.text), response.text
    assert secret not in response.text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            'Invalid response. Traceback (most recent call last):\n  File "/srv/app/x.py", line 3, in f\nKeyError: 1',
            "Invalid response.",
        ),
        ("bad answer from /opt/venv/lib/litellm/llms/anthropic/handler.py here", "bad answer from <path> here"),
        ("  two\n  lines  ", "two lines"),
        ("", "The provider's answer could not be read."),
    ],
)
def test_client_text_drops_tracebacks_and_paths(raw, expected):
    from gateway.upstream.failures import client_text

    assert client_text(raw) == expected
