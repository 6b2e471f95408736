"""The shape every API body must have before anything reads it (gateway.bodies): bounded depth, no
NUL, identifiers without control characters, each refused with a 400 naming the field. End to end
for the two defects of issue #15 (a NUL in `model` stopped billing; a body 300 deep was a 500), and
property-based: whatever hypothesis throws at a chat request's fields, parsing refuses it cleanly or
yields a body every later stage can key on, serialise and store."""

from __future__ import annotations

import json
import time

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.cache.keys import cache_key
from gateway.errors import GatewayError
from gateway.schemas import ChatRequest, parse_chat_request
from sentinel.text import CONTROL, MAX_JSON_DEPTH, json_problem

ASK = [{"role": "user", "content": "hello"}]


def depth(value) -> int:
    """Levels of objects and arrays (the outermost is 1), as gateway.bodies counts them."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def nested(levels: int, leaf=1) -> dict:
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def refused(body: dict | bytes) -> GatewayError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(GatewayError) as caught:
        parse_chat_request(raw)
    assert caught.value.status == 400
    return caught.value


# --- unit: what is refused, and named --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": "gpt\u0000"}, "model"),
        ({"model": "gpt\u0007"}, "model"),
        ({"model": "gpt\n"}, "model"),
        ({"model": "gpt\u009b"}, "model"),  # C1: a terminal's escape introducer
        ({"user": "alice\r\nx-forged: 1"}, "user"),
        ({"safety_identifier": "a\tb"}, "safety_identifier"),
        ({"prompt_cache_key": "k\u001b[31m"}, "prompt_cache_key"),
        ({"metadata": {"team": "a\u0000"}}, "metadata.team"),
        ({"metadata": {"team": "line\nbreak"}}, "metadata.team"),
        ({"metadata": {"te\u0001am": "a"}}, "metadata"),
        ({"cache": {"namespace": "v2\u0000"}}, "cache.namespace"),
        ({"cache": {"namespace": "v2\t"}}, "cache.namespace"),
        ({"messages": [{"role": "user", "content": "a\u0000b"}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\u0000"}]}]},
            "messages[0].content[0].text",
        ),
        ({"stop": ["ok", "\u0000"]}, "stop[1]"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"k\u0000": 1}}}]},
            "tools[0].function.parameters",
        ),
        ({"some_extension": {"x": "\u0000"}}, "some_extension.x"),
    ],
)
def test_nul_anywhere_and_control_characters_in_identifiers_are_refused_naming_the_field(fields, param):
    error = refused({"model": "m", "messages": ASK, **fields})
    assert (error.code, error.param) == ("invalid_value", param)
    assert error.message.startswith(f"Invalid value for '{param}': ")
    assert "U+00" in error.message


def test_message_content_may_hold_tabs_and_line_breaks_and_escaped_backslashes():
    text = "line one\n\tline two\r\nC:\\u0000 is a path, not a NUL"
    request, body = parse_chat_request(
        json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    )
    assert body["messages"][0]["content"] == text
    assert request.messages[0].content == text


@pytest.mark.parametrize("field", ["extra", "tools", "response_format", "messages"])
def test_json_nested_deeper_than_the_limit_is_refused_naming_the_outer_field(field):
    deep = nested(300)
    body = {"model": "m", "messages": ASK}
    body[field] = [deep] if field in ("tools", "messages") else deep
    error = refused(body)
    assert (error.code, error.param) == ("nesting_too_deep", field)
    assert f"at most {MAX_JSON_DEPTH} levels" in error.message


def test_the_limit_is_exact():
    # The body is level 1, `tools` 2, the tool 3, its function 4: a parameters schema of
    # MAX_JSON_DEPTH - 4 levels fits, one more does not.
    def with_schema(levels: int) -> dict:
        tool = {"type": "function", "function": {"name": "f", "parameters": nested(levels)}}
        return {"model": "m", "messages": ASK, "tools": [tool]}

    fits = with_schema(MAX_JSON_DEPTH - 4)
    assert depth(fits) == MAX_JSON_DEPTH
    _, body = parse_chat_request(json.dumps(fits).encode())
    cache_key(tenant_id=1, namespace="", model_identity=("m",), body=body)  # serialisable as the cache keys it
    too_deep = with_schema(MAX_JSON_DEPTH - 3)
    assert refused(too_deep).code == "nesting_too_deep"


def test_deep_json_beyond_what_the_parser_takes_is_invalid_json():
    raw = b'{"model": "m", "messages": [], "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert refused(raw).code == "invalid_json"


def _function_schema(levels: int) -> dict:
    """An object schema `levels` objects deep, each level an array of objects: deeper than OpenAI's
    structured outputs accept (10 levels of objects, arrays between them)."""
    schema: dict = {"type": "object", "properties": {"leaf": {"type": "string"}}, "required": ["leaf"]}
    for _ in range(levels - 1):
        schema = {
            "type": "object",
            "properties": {"children": {"type": "array", "items": schema}},
            "required": ["children"],
        }
    return schema


def test_real_requests_nest_far_less_than_the_limit():
    tools = [{"type": "function", "function": {"name": "plan", "parameters": _function_schema(10)}}]
    response_format = {"type": "json_schema", "json_schema": {"name": "plan", "schema": _function_schema(10)}}
    body = {"model": "m", "messages": ASK, "tools": tools, "response_format": response_format}
    assert depth({**body, "response_format": None}) == 34  # as sentinel.text says
    assert depth({**body, "tools": None}) == 33
    _request, parsed = parse_chat_request(json.dumps(body).encode())
    assert parsed["tools"] == tools
    assert depth(body) <= MAX_JSON_DEPTH // 2 + 2


def test_a_long_conversation_is_checked_and_accepted():
    # More brackets than the limit, so it is walked rather than skipped.
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(200)]
    _, body = parse_chat_request(json.dumps({"model": "m", "messages": messages}).encode())
    assert len(body["messages"]) == 200


# --- property: no body crashes parsing or the stages after it --------------------------------------

CONTROL_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x9F), min_size=1, max_size=8)
ANY_TEXT = st.text(max_size=40) | CONTROL_TEXT | st.builds(lambda c, n: c * n, st.characters(), st.integers(1, 200_000))
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | ANY_TEXT
JSON_VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3), max_leaves=12
)
DEEP = st.builds(
    lambda levels, leaf, wrap_list: [nested(levels, leaf)] if wrap_list else nested(levels, leaf),
    st.integers(40, 400),
    SCALARS,
    st.booleans(),
)
FIELD_VALUES = JSON_VALUES | DEEP
FIELDS = st.sampled_from(
    sorted({*ChatRequest.model_fields, "metadata", "safety_identifier", "prompt_cache_key", "cache", "x_unknown"})
)


@st.composite
def chat_bodies(draw) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": draw(ANY_TEXT)}]}
    for _ in range(draw(st.integers(1, 3))):
        body[draw(FIELDS)] = draw(FIELD_VALUES)
    if draw(st.booleans()):
        body["messages"] = [{"role": "user", "content": draw(ANY_TEXT), "name": draw(FIELD_VALUES)}]
    return body


@settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(chat_bodies())
def test_any_body_is_refused_with_a_400_or_is_safe_to_key_serialise_and_store(body):
    raw = json.dumps(body).encode()  # the stdlib writes any depth hypothesis makes
    try:
        request, parsed = parse_chat_request(raw)
    except GatewayError as error:
        assert error.status == 400
        assert error.param is None or isinstance(error.param, str)
        orjson.loads(error.body())
        return
    assert json_problem(parsed) is None  # no NUL, bounded depth
    for name in ("model", "user", "safety_identifier", "prompt_cache_key"):
        assert not (isinstance(parsed.get(name), str) and CONTROL.search(parsed[name]))
    orjson.dumps(parsed)
    cache_key(tenant_id=1, namespace="", model_identity=(request.model,), body=parsed)


# --- end to end: the defects of issue #15 -----------------------------------------------------------


def post(gateway, key: str, content: bytes, **headers) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {key}", "content-type": "application/json", **headers},
        content=content,
        timeout=30,
    )


def assert_refused(response: httpx.Response, code: str, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    return response.headers["x-sentinel-request-id"]


def test_nul_in_model_is_a_400_naming_model_and_billing_goes_on(
    gateway, make_tenant, make_key, make_model, mock_provider, live_db
):
    """Issue #15, 2: `{"model": "x\\u0000"}` was a 500 whose ledger record PostgreSQL refused, and the
    refused record held back the records of every tenant after it."""
    alias, (provider,) = make_model()
    attacker, victim = make_tenant(), make_tenant()
    attacker_key, victim_key = make_key(attacker), make_key(victim)
    content = orjson.dumps({"model": "x\u0000", "messages": ASK})

    refused_id = assert_refused(post(gateway, attacker_key, content), "invalid_value", "model")
    answered = post(gateway, victim_key, orjson.dumps({"model": alias, "messages": ASK}))
    assert answered.status_code == 200
    time.sleep(0.3)  # the records are handed off after the responses
    drain()

    # The refusal is billed at zero like any refused request, with nothing of the NUL in it ...
    row = LedgerEntry.objects.get(request_id=refused_id)
    assert (row.tenant_id, row.status_code, row.error_code, row.model_requested, row.cost_usd) == (
        attacker.pk,
        400,
        "invalid_value",
        "",
        0,
    )
    # ... and the other tenant's answer is on the ledger.
    billed = LedgerEntry.objects.get(request_id=answered.headers["x-sentinel-request-id"])
    assert (billed.tenant_id, billed.status_code, billed.model_requested) == (victim.pk, 200, alias)
    assert billed.cost_usd > 0
    assert mock_provider.stats(provider)["calls"] == 1  # the refused request reached no provider


def test_json_300_deep_is_a_400_not_a_500(gateway, api_key, make_model, mock_provider, live_db, tenant):
    """Issue #15, 5: the cache key's orjson.dumps gave up on it (500)."""
    alias, (provider,) = make_model()
    content = json.dumps({"model": alias, "messages": ASK, "metadata_extra": nested(300)}).encode()
    request_id = assert_refused(post(gateway, api_key, content), "nesting_too_deep", "metadata_extra")
    time.sleep(0.3)
    drain()
    assert LedgerEntry.objects.get(request_id=request_id).status_code == 400
    assert mock_provider.stats(provider)["calls"] == 0


def test_a_control_character_in_the_request_id_header_is_never_echoed(gateway, api_key, model):
    alias, _ = model
    body = orjson.dumps({"model": alias, "messages": ASK})
    response = post(gateway, api_key, body, **{"x-sentinel-request-id": "id\twith-tab"})
    assert response.status_code == 200
    assert response.headers["x-sentinel-request-id"].startswith("req_")
