"""Validation of chat-completion requests, with errors that name the offending field.

The body is validated with pydantic (strict types, as OpenAI's API is strict) but forwarded as the
client sent it, so parameters this gateway does not know still reach the provider.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import GatewayError, invalid_request

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ContentPart(_Strict):
    type: str


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
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None


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


def _error_from(exc: ValidationError) -> GatewayError:
    error = exc.errors(include_url=False)[0]
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
    try:
        return ChatRequest.model_validate(body), body
    except ValidationError as exc:
        raise _error_from(exc) from None
