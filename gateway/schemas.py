"""Validation of chat-completion requests, with errors that name the offending field.

The body is validated with pydantic (strict types, as OpenAI's API is strict). What a client may
send is an allowlist: OpenAI's request schema and Sentinel's `cache` controls. Anything else is
refused as OpenAI refuses it (400 `unknown_parameter`), above all the settings litellm reads from
the keywords of a call (`api_base`, `api_key`, `extra_headers`, cloud credentials, ...), which would
let a caller send the operator's provider key wherever it liked. The provider layer (gateway.upstream.providers,
gateway.upstream.transport) builds its calls from the same allowlist, never from the body minus a deny list.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from gateway.bodies import check_body
from gateway.errors import GatewayError, invalid_request

# Integers are bounded as the providers' APIs bound them.
MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1
# OpenAI's `metadata`: at most 16 pairs, keys of 64 characters, values of 512.
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)
]


def _integral(value: Any) -> Any:
    """JSON has one number type: 855.0 is the integer 855. Not past 2**53, where a float no longer
    holds an integer exactly (orjson also reads an integer past 64 bits as a float): such a number
    stays a float, and is refused as one."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def integer(*, ge: int, le: int) -> Any:
    # The bounds before the validator, or pydantic leaves them out of the JSON Schema it documents.
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral)]


Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# A content part of one of OpenAI's types must carry that type's payload (litellm's translation
# fails on one that does not); parts of other types pass through to providers that know them.
_PART_PAYLOADS = {
    "text": "string",
    "refusal": "string",
    "image_url": "object",
    "input_audio": "object",
    "file": "object",
}


def _part_rules() -> dict:
    rules = []
    for kind, payload in _PART_PAYLOADS.items():
        rule = {
            "if": {"properties": {"type": {"const": kind}}, "required": ["type"]},
            "then": {"properties": {kind: {"type": payload}}, "required": [kind]},
        }
        if kind == "image_url":
            rule["then"]["properties"][kind].update(properties={"url": {"type": "string"}}, required=["url"])
        rules.append(rule)
    return {"allOf": rules}


class ContentPart(_Strict):
    # A part is the model's input, which litellm translates into the provider's body and never reads
    # as a setting: parts of other types, and fields beside the payload, go on as sent.
    model_config = ConfigDict(extra="allow", json_schema_extra=_part_rules())
    type: str

    @model_validator(mode="after")
    def _payload_present(self) -> ContentPart:
        payload = _PART_PAYLOADS.get(self.type)
        if payload is None:
            return self
        value = (self.model_extra or {}).get(self.type)
        if not isinstance(value, str if payload == "string" else dict):
            raise ValueError(
                f"a '{self.type}' part needs '{self.type}' ({'a string' if payload == 'string' else 'an object'})"
            )
        if self.type == "image_url" and not isinstance(value.get("url"), str):
            raise ValueError("an 'image_url' part needs 'image_url.url' (a string)")
        return self


class Message(_Strict):
    """OpenAI's message fields, and those of the messages Sentinel answers with (OpenAI's and
    litellm's), so that a client can put an answer back into the conversation as the SDK gives it."""

    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    refusal: str | None = None
    annotations: list[dict[str, Any]] | None = None
    # litellm's, from answers of providers it translates (reasoning, Anthropic's thinking blocks,
    # generated images), and Anthropic's prompt caching marker, which litellm translates.
    reasoning_content: str | None = None
    thinking_blocks: list[dict[str, Any]] | None = None
    reasoning_items: list[dict[str, Any]] | None = None
    images: list[dict[str, Any]] | None = None
    provider_specific_fields: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class Tool(_Strict):
    # OpenAI's chat completions have function and custom tools. Other types are refused: litellm
    # itself runs an "mcp" tool whose server_url names its MCP gateway.
    model_config = ConfigDict(extra="allow")
    type: Literal["function", "custom"]


class ChatRequest(_Strict):
    """OpenAI's chat completion request (its published schema; the official SDK's
    CompletionCreateParams, which tests/gateway/test_schemas.py holds this to) plus Sentinel's `cache` and
    `file_search`."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    messages: Annotated[list[Message], Field(min_length=1)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: integer(ge=1, le=MAX_INT32) | None = None
    max_completion_tokens: integer(ge=1, le=MAX_INT32) | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    n: integer(ge=1, le=128) | None = None
    seed: integer(ge=-MAX_INT64 - 1, le=MAX_INT64) | None = None
    stop: str | list[str] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    logprobs: bool | None = None
    top_logprobs: integer(ge=0, le=20) | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    service_tier: str | None = None
    store: bool | None = None
    # OpenAI's bounds. litellm keeps a `metadata` of its own: on its path the client's is not passed.
    metadata: Metadata | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    user: str | None = None
    # Sentinel's: read by gateway.cache.engine.controls_from, never sent to a provider.
    cache: dict[str, Any] | None = None
    # Sentinel's: vector stores to ground the answer in (gateway.knowledge.grounding), never sent on.
    file_search: dict[str, Any] | None = None


# The allowlist, in one place. Every field of ChatRequest may be sent; what goes to a provider as
# the client sent it is the rest of OpenAI's parameters (model, messages and streaming are set by
# the path that makes the call, and `cache` is Sentinel's).
CHAT_PARAMETERS = frozenset(ChatRequest.model_fields)
FORWARDED_PARAMETERS = CHAT_PARAMETERS - {"model", "messages", "stream", "stream_options", "cache", "file_search"}


def forwarded(body: dict) -> dict:
    """The client's parameters for the provider: those on the allowlist, whatever else the body holds."""
    return {name: value for name, value in body.items() if name in FORWARDED_PARAMETERS}


_INTEGER_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed", "top_logprobs")
_UNION_LABELS = frozenset({"str", "int", "float", "bool", "none"})


def _is_union_label(item: str) -> bool:
    """pydantic puts the tried union member in the location (`str`, `list[ContentPart]`, ...)."""
    return item in _UNION_LABELS or "[" in item or item.startswith("function-") or item[:1].isupper()


def _param(loc: tuple) -> str:
    """OpenAI's way of naming a field: messages[0].content."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not _is_union_label(item):
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def validation_error(exc: ValidationError) -> GatewayError:
    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        # Named as sent: the field's own name is never a union label, whatever its spelling.
        *parent, name = unknown[0]["loc"]
        param = f"{_param(tuple(parent))}.{name}" if parent else str(name)
        return invalid_request(
            f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter"
        )
    # The deepest error is the most precise: a bad content part, not "content is not a string".
    error = max(errors, key=lambda e: len(e["loc"]))
    param = _param(error["loc"])
    kind = error["type"]
    if kind == "missing":
        return invalid_request(
            f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
        )
    if kind == "literal_error" and param.endswith(".role"):
        return invalid_request(
            f"Invalid value for '{param}': must be one of system, developer, user, assistant, tool, function.",
            param=param,
            code="invalid_value",
        )
    if kind.endswith("_type") or kind in ("model_type", "list_type", "union_tag_invalid"):
        return invalid_request(f"Invalid type for '{param}': {error['msg'].lower()}.", param=param, code="invalid_type")
    return invalid_request(f"Invalid value for '{param}': {error['msg'].lower()}.", param=param, code="invalid_value")


def json_object(raw: bytes) -> dict:
    """A request body parsed as a JSON object. Raises GatewayError(400) when it is not one."""
    if not raw:
        raise invalid_request("Request body is empty; expected a JSON object.", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"Request body is not valid JSON: {exc}.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid_request("Request body must be a JSON object.", code="invalid_json")
    return body


def parse_chat_request(raw: bytes) -> tuple[ChatRequest, dict]:
    """The validated request and the body as sent. Raises GatewayError(400) on anything wrong."""
    body = json_object(raw)
    check_body(body, raw=raw)  # depth, NUL, identifiers: before anything reads or serialises it
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    for name in _INTEGER_FIELDS:
        if isinstance(body.get(name), float):  # 855.0 goes on as 855: providers want an integer
            body[name] = getattr(request, name)
    return request, body
