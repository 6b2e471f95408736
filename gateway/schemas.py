"""Validation of chat-completion requests, with errors that name the offending field.

The body is validated with pydantic (strict types, as OpenAI's API is strict) but forwarded as the
client sent it, so parameters this gateway does not know still reach the provider.
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
    model_config = ConfigDict(extra="allow", strict=True)


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
    model_config = ConfigDict(json_schema_extra=_part_rules())
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
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Strict):
    include_usage: bool | None = None


class ChatRequest(_Strict):
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
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None


_INTEGER_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed")
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
    # The deepest error is the most precise: a bad content part, not "content is not a string".
    error = max(exc.errors(include_url=False), key=lambda e: len(e["loc"]))
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


def parse_chat_request(raw: bytes) -> tuple[ChatRequest, dict]:
    """The validated request and the body as sent. Raises GatewayError(400) on anything wrong."""
    if not raw:
        raise invalid_request("Request body is empty; expected a JSON object.", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"Request body is not valid JSON: {exc}.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid_request("Request body must be a JSON object.", code="invalid_json")
    check_body(body, raw=raw)  # depth, NUL, identifiers: before anything reads or serialises it
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    for name in _INTEGER_FIELDS:
        if isinstance(body.get(name), float):  # 855.0 goes on as 855: providers want an integer
            body[name] = getattr(request, name)
    return request, body
