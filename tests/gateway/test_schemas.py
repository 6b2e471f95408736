"""Chat request validation details the fuzzer leans on: integers as JSON has them, content parts
that carry their payload, and errors that name the deepest field at fault."""

from __future__ import annotations

import json

import pytest

from gateway.errors import GatewayError
from gateway.schemas import parse_chat_request


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
    request, body = parse(messages=[{"role": "user", "content": [{"type": "document", "source": {"x": 1}}]}])
    assert body["messages"][0]["content"][0] == {"type": "document", "source": {"x": 1}}
