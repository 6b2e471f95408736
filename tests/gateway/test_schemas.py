"""Chat request validation details the fuzzer leans on: integers as JSON has them, content parts
that carry their payload, and errors that name the deepest field at fault."""

from __future__ import annotations

import json

import pytest

from gateway.errors import GatewayError
from gateway.schemas import CHAT_PARAMETERS, Message, parse_chat_request


def parse(**fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    return parse_chat_request(json.dumps(body).encode())  # the stdlib writes integers of any size


def refused(**fields) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse(**fields)
    assert caught.value.status == 400
    return caught.value


def test_an_integral_float_is_an_integer_and_goes_on_as_one():
    request, body = parse(max_tokens=855.0, n=2.0)
    assert (request.max_tokens, request.n) == (855, 2)
    assert body["max_tokens"] == 855 and isinstance(body["max_tokens"], int)


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"max_tokens": 5.5}, "invalid_type", "max_tokens"),
        ({"max_tokens": True}, "invalid_type", "max_tokens"),
        ({"max_tokens": 2**31}, "invalid_value", "max_tokens"),
        ({"seed": 2**63}, "invalid_value", "seed"),
        ({"seed": -(2**63) - 1}, "invalid_type", "seed"),  # past 64 bits JSON parsers give a float
        ({"n": 1e30}, "invalid_type", "n"),
    ],
)
def test_integers_out_of_bounds_or_not_integers(fields, code, param):
    error = refused(**fields)
    assert (error.code, error.param) == (code, param)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url"},
        {"type": "image_url", "image_url": {}},
        {"type": "image_url", "image_url": "http://x"},
        {"type": "text"},
        {"type": "text", "text": 5},
        {"type": "file", "file": "x"},
        {"type": "input_audio"},
    ],
)
def test_a_content_part_without_its_payload_is_refused(part):
    error = refused(messages=[{"role": "user", "content": [part]}])
    assert (error.code, error.param) == ("invalid_value", "messages[0].content[0]")
    assert f"'{part['type']}' part needs" in error.message


def test_parts_of_other_types_pass_through():
    _request, body = parse(messages=[{"role": "user", "content": [{"type": "document", "source": {"x": 1}}]}])
    assert body["messages"][0]["content"][0] == {"type": "document", "source": {"x": 1}}


def test_the_allowlist_is_openais_request_schema_and_sentinels_cache():
    """OpenAI's published request schema, as the official SDK has it (a new SDK with a new parameter
    fails this test: add it to ChatRequest after checking litellm does not read it as a setting)."""
    from openai.types.chat.completion_create_params import CompletionCreateParamsBase

    openais = set(CompletionCreateParamsBase.__annotations__)
    assert openais | {"stream", "cache", "file_search"} == CHAT_PARAMETERS


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"api_base": "http://127.0.0.1:9/x"}, "api_base"),
        ({"Api_Base": "http://127.0.0.1:9/x"}, "Api_Base"),  # named as sent
        ({"extra_body": {"api_base": "x"}}, "extra_body"),
        ({"api_key": "sk-other", "temperature": "hot"}, "api_key"),  # before any other error
        ({"stream_options": {"include_usage": True, "api_base": "x"}}, "stream_options.api_base"),
        ({"messages": [{"role": "user", "content": "x", "api_base": "x"}]}, "messages[0].api_base"),
    ],
)
def test_a_parameter_outside_the_allowlist_is_refused_by_name(fields, param):
    error = refused(**fields)
    assert (error.code, error.param, error.message) == (
        "unknown_parameter",
        param,
        f"Unrecognized request argument supplied: {param}",
    )


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_value", "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "invalid_value", "metadata." + "k" * 65),
        ({"metadata": {"k": "v" * 513}}, "invalid_value", "metadata.k"),
        ({"metadata": {"k": {"api_base": "x"}}}, "invalid_type", "metadata.k"),
        ({"tools": [{"type": "mcp", "server_url": "litellm_proxy/mcp/x"}]}, "invalid_value", "tools[0].type"),
        ({"top_logprobs": 21}, "invalid_value", "top_logprobs"),
        ({"logit_bias": {"1": 101}}, "invalid_value", "logit_bias.1"),
    ],
)
def test_typed_parameters_carry_only_what_openai_allows(fields, code, param):
    error = refused(**fields)
    assert (error.code, error.param) == (code, param)


def test_an_answer_goes_back_into_the_conversation_as_the_sdks_give_it():
    """The fields of an answer's message, OpenAI's and litellm's, are on the message allowlist."""
    from litellm.types.utils import Message as LitellmMessage
    from openai.types.chat import ChatCompletionMessage

    openai_message = ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": "x", "refusal": None, "annotations": [], "audio": None, "tool_calls": None}
    )
    litellm_message = LitellmMessage(
        content="x", reasoning_content="why", thinking_blocks=[{"type": "thinking", "thinking": "hm"}]
    )
    for answer in (openai_message, litellm_message):
        message = answer.model_dump(mode="json")
        assert set(message) <= set(Message.model_fields)
        parse(messages=[{"role": "user", "content": "q"}, message, {"role": "user", "content": "more"}])
