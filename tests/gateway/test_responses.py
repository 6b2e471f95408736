"""POST /v1/responses (and retrieve, delete, input_items) end to end: the official OpenAI SDK's
`client.responses` against a real gateway process, over OpenAI-format deployments (the fast path)
and Anthropic-format ones (litellm's translation) on the mock provider: conversations continued by
`previous_response_id`, function tools, streaming with the typed events, the ledger, tenant scope,
`store: false`, failover, and bad input."""

from __future__ import annotations

import json
from decimal import Decimal

import httpx
import openai
import pytest
from openai import OpenAI

from gateway.mock_answers import answer_text
from gateway.responses.models import StoredResponse
from gateway.responses.schemas import RESPONSES_PARAMETERS, UNSUPPORTED
from sentinel.text import MAX_JSON_DEPTH
from tests.gateway import test_dialect_chains
from tests.gateway.test_cache import wait_stored
from tests.gateway.test_dialect_chains import NO_CACHE, cost, ledger_rows
from tests.servers import scrape_metrics

dialect_chain = test_dialect_chains.dialect_chain  # the fixture: deployments of each format on the mock
TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    }
]
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def sdk(gateway, key: str) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30, default_headers=NO_CACHE)


def test_the_allowlist_is_openais_request_schema_and_sentinels_cache():
    """The official SDK's ResponseCreateParams: served, or refused by name (a new SDK with a new
    parameter fails this test: decide which, after checking litellm does not read it as a setting)."""
    from openai.types.responses.response_create_params import ResponseCreateParamsBase

    assert set(ResponseCreateParamsBase.__annotations__) | {"stream", "cache"} == RESPONSES_PARAMETERS | UNSUPPORTED


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"temperature": 0.2, "top_p": 0.9, "user": "u-1", "max_output_tokens": 5},
        {"temperature": 0, "top_p": None, "user": "", "max_output_tokens": 1},
        {"temperature": None, "stream": True},
    ],
)
@pytest.mark.parametrize("text", ["hello", "x" * 3000, " \u00e9t\u00e9 \u4e16\u754c \U0001f600\n"])
def test_a_text_input_translates_as_litellms_bridge_translates_it(fields, text):
    """The text-only shortcut (no bridge) gives the chat request the bridge gives."""
    from gateway.responses.schemas import parse_responses_request
    from gateway.responses.translate import BRIDGED, bridged, turn_messages

    request, body, _ = parse_responses_request(json.dumps({"model": "m", "input": text, **fields}).encode())
    params = {name: body[name] for name in BRIDGED if name in body}
    if request.max_output_tokens is not None:
        params["max_output_tokens"] = request.max_output_tokens
    assert turn_messages(request, body) == bridged(request, body, params)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_conversation_is_created_read_continued_and_deleted(
    gateway, tenant, make_key, dialect_chain, mock_provider, kind
):
    model, (provider,) = dialect_chain(kind)
    client = sdk(gateway, make_key(tenant))

    raw = client.responses.with_raw_response.create(
        model=model, input="[[echo]] one two three", instructions="Be brief."
    )
    first = raw.parse()
    assert (first.object, first.status, first.output_text, first.instructions) == (
        "response",
        "completed",
        "one two three",
        "Be brief.",
    )
    assert first.id.startswith("resp_") and raw.headers["x-sentinel-provider"] == provider
    assert "Be brief." in mock_provider.stats(provider)["last_body"]  # the instructions, as a system prompt
    # The ledger bills it at the deployment's prices, exactly; the usage is the provider's.
    request_id = raw.headers["x-sentinel-request-id"]
    row = ledger_rows([request_id])[request_id]
    usage = first.usage
    assert (row.status_code, row.model_requested, row.provider, row.stream) == (200, model, provider, False)
    assert (row.prompt_tokens, row.completion_tokens) == (usage.input_tokens, usage.output_tokens) != (0, 0)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert row.cost_usd == cost(kind, usage.input_tokens, usage.output_tokens)
    assert Decimal(raw.headers["x-sentinel-cost-usd"]) == row.cost_usd

    again = client.responses.retrieve(first.id)
    assert (again.id, again.output_text, again.usage.input_tokens) == (first.id, "one two three", usage.input_tokens)
    items = client.responses.input_items.list(first.id)
    assert [(i.type, i.role, [c.text for c in i.content]) for i in items.data] == [
        ("message", "user", ["[[echo]] one two three"])
    ]

    second = client.responses.create(model=model, input="[[echo]] four", previous_response_id=first.id)
    assert (second.output_text, second.previous_response_id) == ("four", first.id)
    sent = json.loads(mock_provider.stats(provider)["last_body"])
    texts = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in sent["messages"]]
    # The conversation goes on without the first turn's instructions (as OpenAI does).
    assert texts == ["[[echo]] one two three", "one two three", "[[echo]] four"]

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.retrieve(first.id)
    assert gone.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model, input="more", previous_response_id=first.id)
    assert client.responses.retrieve(second.id).output_text == "four"


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_stream_has_the_typed_events_and_is_stored_before_it_completes(gateway, api_key, dialect_chain, kind):
    model, _ = dialect_chain(kind)
    client = sdk(gateway, api_key)
    with client.responses.stream(model=model, input="[[echo]] streamed words") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert [k for i, k in enumerate(kinds) if k != kinds[i - 1] or i == 0] == TEXT_EVENTS
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "streamed words"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "streamed words" and final.status == "completed"
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0
    # Stored before response.completed went out: readable at once.
    assert client.responses.retrieve(final.id).output_text == "streamed words"


def test_a_function_tool_round_trip(gateway, api_key, dialect_chain, mock_provider):
    model, (provider,) = dialect_chain("openai")
    client = sdk(gateway, api_key)
    asked = client.responses.create(model=model, input="[[tool]] look up gateway", tools=TOOLS)
    (call,) = asked.output
    assert (call.type, call.name, call.arguments, call.call_id) == ("function_call", "lookup", "{}", "call_mock_1")

    # Streamed too: the call's item and its arguments as events.
    streamed = client.responses.create(model=model, input="[[tool]] look up gateway", tools=TOOLS, stream=True)
    kinds = [event.type for event in streamed]
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"

    answered = client.responses.create(
        model=model,
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "a gateway is a door"}],
    )
    # The mock answers the last user turn's text (its tool trigger needs tools, not sent this time).
    assert answered.output_text == answer_text("[[tool]] look up gateway")
    sent = json.loads(mock_provider.stats(provider)["last_body"])["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == "call_mock_1"
    assert sent[-1] == {"role": "tool", "content": "a gateway is a door", "tool_call_id": "call_mock_1"}
    items = client.responses.input_items.list(answered.id).data
    assert [(i.type, i.call_id, i.output) for i in items] == [
        ("function_call_output", "call_mock_1", "a gateway is a door")
    ]


def test_responses_are_the_tenants_own_and_store_false_keeps_nothing(gateway, make_tenant, make_key, dialect_chain):
    model, _ = dialect_chain("openai")
    mine, theirs = sdk(gateway, make_key(make_tenant())), sdk(gateway, make_key(make_tenant()))
    kept = mine.responses.create(model=model, input="keep me")
    for attempt in (
        lambda: theirs.responses.retrieve(kept.id),
        lambda: theirs.responses.input_items.list(kept.id),
        lambda: theirs.responses.delete(kept.id),
        lambda: theirs.responses.create(model=model, input="x", previous_response_id=kept.id),
    ):
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert refused.value.body["type"] == "invalid_request_error"
    assert mine.responses.retrieve(kept.id).output_text == kept.output_text

    counted = {"endpoint": "responses", "status": "200"}
    before = scrape_metrics(gateway.url).value("sentinel_endpoint_requests_total", **counted)
    unkept = mine.responses.create(model=model, input="forget me", store=False)
    assert scrape_metrics(gateway.url).value("sentinel_endpoint_requests_total", **counted) == before + 1
    assert unkept.store is False and unkept.output_text == answer_text("forget me")
    assert not StoredResponse.objects.filter(public_id=unkept.id).exists()
    with pytest.raises(openai.NotFoundError):
        mine.responses.create(model=model, input="x", previous_response_id=unkept.id)


def test_stored_responses_older_than_the_retention_go_and_younger_ones_stay(
    gateway, make_tenant, make_key, dialect_chain, settings
):
    """Beat's hourly task deletes the stored responses older than SENTINEL_RESPONSES_RETENTION_DAYS
    (30 by default, as OpenAI keeps them): they can no longer be read or continued; the rest can."""
    from datetime import timedelta

    from django.utils import timezone

    from gateway.tasks import prune_responses

    model, _ = dialect_chain("openai")
    client = sdk(gateway, make_key(make_tenant()))
    old, edge, young = (client.responses.create(model=model, input=f"[[echo]] {n}") for n in ("old", "edge", "young"))
    now = timezone.now()
    StoredResponse.objects.filter(public_id=old.id).update(created_at=now - timedelta(days=30, seconds=5))
    StoredResponse.objects.filter(public_id=edge.id).update(created_at=now - timedelta(days=29, hours=23))
    everyone_else = StoredResponse.objects.exclude(public_id__in=[old.id, edge.id, young.id]).count()

    settings.RESPONSES_RETENTION_DAYS = 0  # kept forever: nothing goes
    assert prune_responses() == 0 and StoredResponse.objects.filter(public_id=old.id).exists()
    settings.RESPONSES_RETENTION_DAYS = 30
    assert prune_responses() == 1
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(old.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model, input="x", previous_response_id=old.id)
    assert [client.responses.retrieve(r.id).output_text for r in (edge, young)] == ["edge", "young"]
    assert StoredResponse.objects.exclude(public_id__in=[edge.id, young.id]).count() == everyone_else


def test_deleting_a_key_or_its_tenant_reaches_their_stored_responses(make_tenant, make_key):
    """The table has no database constraint on its tenant and key (its check locked both rows on
    every insert): deleting them through Django still nulls the key and deletes the tenant's rows."""
    from tenants.models import VirtualKey

    tenant, other = make_tenant(), make_tenant()
    make_key(tenant)
    key = VirtualKey.objects.get(tenant=tenant)
    fields = {"request_id": "r", "response": {}, "input_items": [], "conversation": []}
    kept = StoredResponse.objects.create(public_id="resp_kept", tenant=tenant, key=key, **fields)
    theirs = StoredResponse.objects.create(public_id="resp_theirs", tenant=other, key=None, **fields)

    key.delete()
    kept.refresh_from_db()
    assert kept.key_id is None
    tenant.delete()
    assert not StoredResponse.objects.filter(pk=kept.pk).exists()
    assert StoredResponse.objects.filter(pk=theirs.pk).exists()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_chain_fails_over_from_openai_to_anthropic(gateway, api_key, dialect_chain, mock_provider, stream):
    model, (first, second) = dialect_chain("openai", "anthropic")
    mock_provider.control(first, error_rate=1.0, error_status=503)
    client = sdk(gateway, api_key)
    raw = client.responses.with_raw_response.create(model=model, input="[[echo]] fail over", stream=stream)
    assert (raw.headers["x-sentinel-provider"], raw.headers["x-sentinel-fallbacks"]) == (second, "1")
    done = next(e for e in raw.parse() if e.type == "response.completed").response if stream else raw.parse()
    assert done.output_text == "fail over"
    assert [mock_provider.stats(p)["completed"] for p in (first, second)] == [0, 1]


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_an_answer_is_cached_and_replayed_as_a_response_and_as_its_events(
    gateway, tenant, make_key, dialect_chain, mock_provider
):
    model, (provider,) = dialect_chain("openai")
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0, timeout=30)
    first = client.responses.with_raw_response.create(model=model, input="cache this answer")
    wait_stored(tenant, 1)
    again = client.responses.with_raw_response.create(model=model, input="cache this answer")
    assert (first.headers["x-sentinel-cache"], again.headers["x-sentinel-cache"]) == ("miss", "hit-exact")
    assert again.parse().output_text == first.parse().output_text == answer_text("cache this answer")
    assert again.parse().id != first.parse().id
    with client.responses.stream(model=model, input="cache this answer") as stream:
        kinds = [event.type for event in stream]
        replayed = stream.get_final_response()
    assert [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]] == TEXT_EVENTS
    assert replayed.output_text == answer_text("cache this answer")
    assert client.responses.retrieve(replayed.id).output_text == replayed.output_text
    assert mock_provider.stats(provider)["calls"] == 1
    ids = [first.headers["x-sentinel-request-id"], again.headers["x-sentinel-request-id"]]
    paid, saved = (ledger_rows(ids)[i] for i in ids)
    assert (saved.provider, saved.cache_tier, saved.cost_usd, saved.saved_cost_usd) == (
        "cache",
        "hit-exact",
        Decimal(0),
        paid.cost_usd,
    )


def test_the_served_include_values_and_max_tool_calls_are_honoured(gateway, api_key, dialect_chain, mock_provider):
    """What hosted tools would add never exists here (they are refused), input images' URLs are kept
    as sent, and max_tool_calls bounds built-in tool calls, of which there are none: served as asked."""
    model, (provider,) = dialect_chain("openai")
    image = "data:image/png;base64,iVBORw0KGgo="
    content = [{"type": "input_text", "text": "[[echo]] look"}, {"type": "input_image", "image_url": image}]
    response = sdk(gateway, api_key).responses.create(
        model=model,
        input=[{"role": "user", "content": content}],
        include=["file_search_call.results", "web_search_call.action.sources", "message.input_image.image_url"],
        max_tool_calls=3,
        truncation="disabled",
        top_logprobs=0,
    )
    assert (response.output_text, response.max_tool_calls, response.truncation) == ("look", 3, "disabled")
    (item,) = sdk(gateway, api_key).responses.input_items.list(response.id).data
    assert [part.type for part in item.content] == ["input_text", "input_image"]
    assert item.content[1].image_url == image
    sent = json.loads(mock_provider.stats(provider)["last_body"])
    assert not {"include", "max_tool_calls", "truncation", "top_logprobs", "logprobs"} & set(sent)


BAD = [
    ({"input": "x", "api_base": "http://evil"}, "unknown_parameter", "api_base"),
    ({"input": "x", "api_key": "sk-x"}, "unknown_parameter", "api_key"),
    ({"input": "x", "base_url": "http://evil"}, "unknown_parameter", "base_url"),
    ({"input": "x", "background": True}, "unsupported_parameter", "background"),
    ({"input": "x", "tools": [{"type": "mcp", "server_url": "http://e"}]}, "unknown_parameter", "tools[0].server_url"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "invalid_value", "tools[0].type"),
    ({"input": [{"type": "nope"}]}, "invalid_value", "input[0]"),
    ({"input": [{"role": "user", "content": "x", "api_base": "h"}]}, "unknown_parameter", "input[0].api_base"),
    ({"input": "a\u0000b"}, "invalid_value", "input"),
    ({"input": "x", "user": "a\nb"}, "invalid_value", "user"),
    ({"input": nested(MAX_JSON_DEPTH + 1)}, "nesting_too_deep", "input"),
    ({}, "missing_required_parameter", "input"),
    ({"input": "x", "max_output_tokens": 0}, "invalid_value", "max_output_tokens"),
    ({"input": "x", "include": ["nope"]}, "invalid_value", "include[0]"),
    (
        {"input": "x", "include": ["file_search_call.results", "message.output_text.logprobs"]},
        "unsupported_value",
        "include[1]",
    ),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "unsupported_value", "include[0]"),
    ({"input": "x", "top_logprobs": 2}, "unsupported_value", "top_logprobs"),
    ({"input": "x", "truncation": "auto"}, "unsupported_value", "truncation"),
]


@pytest.mark.parametrize(("body", "code", "param"), BAD)
def test_bad_input_is_refused_in_openais_shape_and_nothing_is_sent(
    gateway, api_key, dialect_chain, mock_provider, body, code, param
):
    model, (provider,) = dialect_chain("openai")
    answer = httpx.post(
        f"{gateway.base_url}/responses",
        json={"model": model, **body},
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["type"]) == (400, code, "invalid_request_error")
    if param is not None:
        assert error["param"] == param
    assert mock_provider.stats(provider)["calls"] == 0
