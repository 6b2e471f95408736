"""Reading a batch's input file line by line: a line bounded as a chat request is (size, depth, NUL,
control characters) is refused with its line and field named; nothing in a line crashes the read
(issue #15, 5: a line 300 deep crashed it, and the batch stayed validating through 21 retries)."""

from __future__ import annotations

import json

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.batches.validation import read_requests
from sentinel.text import MAX_JSON_DEPTH, json_problem

ENDPOINT = "/v1/chat/completions"


def line(custom_id="a", **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": ENDPOINT,
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body},
    }


def read(*lines) -> tuple[list, list[tuple]]:
    content = b"\n".join(raw if isinstance(raw, bytes) else json.dumps(raw).encode() for raw in lines)
    requests, errors = read_requests(content, endpoint=ENDPOINT, max_requests=100)
    return [r.custom_id for r in requests], [(e["line"], e["code"], e["param"]) for e in errors]


def nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def test_a_line_nested_300_deep_is_that_lines_error():
    assert read(line("ok"), line("deep", extra=nested(300)), line("fine")) == (
        ["ok", "fine"],
        [(2, "nesting_too_deep", "body.extra")],
    )


def test_a_line_nests_as_deep_as_a_chat_request_may():
    def with_schema(custom_id: str, levels: int) -> dict:  # body 1, tools 2, tool 3, function 4
        tool = {"type": "function", "function": {"name": "f", "parameters": nested(levels)}}
        return line(custom_id, tools=[tool])

    fits = with_schema("fits", MAX_JSON_DEPTH - 5)  # nested(n) is n + 1 levels deep
    assert read(fits, with_schema("over", MAX_JSON_DEPTH - 4)) == (
        ["fits"],
        [(2, "nesting_too_deep", "body.tools")],
    )


def test_nul_and_control_characters_are_named_by_line_and_field():
    assert read(
        line("nul\u0000"),
        line("tab\tid"),
        line("c", model="m\u0000"),
        line("d", model="m\u0007"),
        line("e", messages=[{"role": "user", "content": "a\u0000"}]),
        line("f", metadata={"k": "v\r\n"}),
        line("g", messages=[{"role": "user", "content": "tabs\tand\nlines are text"}]),
    ) == (
        ["g"],
        [
            (1, "invalid_custom_id", "custom_id"),
            (2, "invalid_custom_id", "custom_id"),
            (3, "invalid_value", "body.model"),
            (4, "invalid_value", "body.model"),
            (5, "invalid_value", "body.messages[0].content"),
            (6, "invalid_value", "body.metadata.k"),
        ],
    )


def test_a_line_larger_than_a_request_may_be_is_refused(settings):
    settings.MAX_BODY_BYTES = 1000
    big = line("big", messages=[{"role": "user", "content": "é" * 600}])  # 600 characters, 1,200 bytes
    assert read(line("small"), big) == (["small"], [(2, "request_too_large", None)])


# --- property: nothing in a file crashes the read ---------------------------------------------------

CONTROL_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x9F), min_size=1, max_size=6)
TEXT = st.text(max_size=30) | CONTROL_TEXT
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=10
)
DEEP = st.builds(nested, st.integers(MAX_JSON_DEPTH - 3, 400))
LINE_FIELDS = st.sampled_from(["custom_id", "method", "url", "body", "extra"])
BODY_FIELDS = st.sampled_from(["model", "messages", "user", "metadata", "tools", "stream", "max_tokens", "x"])


@st.composite
def input_lines(draw) -> bytes:
    data = line(draw(TEXT))
    target = data if draw(st.booleans()) else data["body"]
    target[draw(LINE_FIELDS if target is data else BODY_FIELDS)] = draw(VALUES | DEEP)
    raw = json.dumps(data).encode()
    return draw(st.sampled_from([raw, raw[: len(raw) // 2], raw.replace(b'"', b"'", 1), b"\xff" + raw]))


@settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(input_lines(), min_size=1, max_size=5))
def test_no_file_crashes_the_read_and_every_request_kept_is_storable(lines):
    requests, errors = read_requests(b"\n".join(lines), endpoint=ENDPOINT, max_requests=100)
    assert all(error["code"] and error["message"] for error in errors)
    assert "unreadable_line" not in {e["code"] for e in errors}  # the read's last resort: a bug
    for request in requests:
        assert json_problem(request.body) is None
        assert json_problem(request.custom_id) is None
        orjson.dumps({"custom_id": request.custom_id, "body": request.body})
