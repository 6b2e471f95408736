"""Validation of Responses API requests, with errors that name the offending field.

As for chat completions (gateway.schemas), what a client may send is an allowlist: OpenAI's
Responses request fields Sentinel serves, and its own `cache` controls. A field of OpenAI's that
Sentinel does not serve (background runs, stored prompts, server-side conversations, context
management) is refused by name (400 `unsupported_parameter`) rather than ignored; anything else,
above all the settings litellm reads from a call's keywords (`api_base`, `api_key`, `base_url`), is
refused as OpenAI refuses it (400 `unknown_parameter`). Tools are function tools, and file_search,
which Sentinel runs itself against the tenant's own vector stores (gateway.knowledge.grounding); the
other hosted tools (web search, code interpreter, MCP with its `server_url`) would run against
whatever server a request named.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationError

from gateway.bodies import check_body
from gateway.errors import invalid_request
from gateway.knowledge import grounding
from gateway.knowledge.grounding import FileSearch
from gateway.schemas import MAX_INT32, Metadata, _Strict, integer, json_object, validation_error

# Strings keyed on, stored or passed on as ids (gateway.bodies.CHAT_IDENTIFIERS, and the id of
# the response a request continues).
RESPONSES_IDENTIFIERS = (
    ("model",),
    ("user",),
    ("safety_identifier",),
    ("prompt_cache_key",),
    ("previous_response_id",),
    ("metadata", "*key"),
    ("metadata", "*"),
    ("cache", "namespace"),
)
# OpenAI's, not served by Sentinel: refused by name.
UNSUPPORTED = frozenset(
    {"background", "background_options", "conversation", "prompt", "context_management", "image", "access_programs"}
)


class InputContent(_Strict):
    type: Literal["input_text", "output_text", "refusal", "input_image", "input_file"]
    text: str | None = None
    refusal: str | None = None
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None
    image_url: str | None = None
    detail: Literal["low", "high", "auto", "original"] | None = None
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


class MessageItem(_Strict):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputContent]
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[InputContent]
    id: str | None = None
    status: str | None = None


# Tags are capitalized: gateway.schemas._param leaves them out of the parameter it names.
ITEM_TAGS = {
    None: "Message",
    "message": "Message",
    "function_call": "FunctionCall",
    "function_call_output": "FunctionCallOutput",
}


def _item_kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(value, dict) or not (kind is None or isinstance(kind, str)):
        return None
    return ITEM_TAGS.get(kind)


InputItem = Annotated[
    Annotated[MessageItem, Tag("Message")]
    | Annotated[FunctionCallItem, Tag("FunctionCall")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")],
    Discriminator(
        _item_kind,
        custom_error_type="invalid_item",
        custom_error_message="an input item is a message, a function_call or a function_call_output",
    ),
]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextOptions(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None


# OpenAI's `include` values Sentinel serves: what hosted tools would add (none run here, so there is
# never anything to add) and input images' URLs (input items are kept as sent). The schema lists
# these alone; the values it cannot give (token logprobs; reasoning kept encrypted across stateless
# turns) are refused by value, as are logprobs and truncation (refuse_unserved).
INCLUDABLE = Literal[
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
]
NOT_INCLUDED = ("message.output_text.logprobs", "reasoning.encrypted_content")


class ResponsesRequest(_Strict):
    """OpenAI's Responses request (the official SDK's ResponseCreateParams, which
    tests/gateway/test_responses.py holds this to, less UNSUPPORTED) plus Sentinel's `cache`."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    input: Annotated[str, Field(min_length=1)] | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    previous_response_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    store: bool | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: integer(ge=1, le=MAX_INT32) | None = None
    max_tool_calls: integer(ge=1, le=MAX_INT32) | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_logprobs: integer(ge=0, le=0) | None = None  # 0: Sentinel returns no logprobs
    text: TextOptions | None = None
    reasoning: Reasoning | None = None
    truncation: Literal["disabled"] | None = None
    include: list[INCLUDABLE] | None = None
    metadata: Metadata | None = None
    moderation: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    user: str | None = None
    # Sentinel's: read by gateway.cache.engine.controls_from, never sent to a provider.
    cache: dict[str, Any] | None = None


RESPONSES_PARAMETERS = frozenset(ResponsesRequest.model_fields)


def parse_responses_request(raw: bytes) -> tuple[ResponsesRequest, dict, tuple[FileSearch, str] | None]:
    """The validated request, the body as sent (less a file_search tool) and that tool with the
    name of its place (`tools[i]`), which Sentinel runs itself against the tenant's vector stores
    (gateway.knowledge.grounding). Raises GatewayError(400) on anything wrong."""
    body = json_object(raw)
    check_body(body, identifiers=RESPONSES_IDENTIFIERS, raw=raw)
    for name in body:
        if name in UNSUPPORTED:
            message = f"Sentinel does not support the parameter '{name}' of the Responses API."
            raise invalid_request(message, param=name, code="unsupported_parameter")
    refuse_unserved(body)
    file_search = _file_search_tool(body)
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    return request, body, file_search


def _file_search_tool(body: dict) -> tuple[FileSearch, str] | None:
    """The file_search tool taken out of `tools` (one at most), validated as grounded chat's is."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    found = [(i, tool) for i, tool in enumerate(tools) if isinstance(tool, dict) and tool.get("type") == "file_search"]
    if not found:
        return None
    if len(found) > 1:
        raise invalid_request("One file_search tool at most.", param=f"tools[{found[1][0]}]", code="invalid_value")
    index, tool = found[0]
    if tool.get("ranking_options") is not None:
        message = "Sentinel ranks by its own hybrid search: 'ranking_options' is not supported."
        raise invalid_request(message, param=f"tools[{index}].ranking_options", code="unsupported_parameter")
    spec = {name: value for name, value in tool.items() if name not in ("type", "ranking_options")}
    asked = grounding.parse(spec, f"tools[{index}]")
    body["tools"] = [tool for i, tool in enumerate(tools) if i != index]
    if not body["tools"]:
        del body["tools"]
    return asked, f"tools[{index}]"


def refuse_unserved(body: dict) -> None:
    """Values of OpenAI's that Sentinel cannot honour: refused by name, never silently ignored (the
    schema, which lists only what is served, would call them merely invalid)."""
    include = body.get("include")
    for i, value in enumerate(include if isinstance(include, list) else ()):
        if isinstance(value, str) and value in NOT_INCLUDED:
            raise invalid_request(
                f"Sentinel does not support include value '{value}'.", param=f"include[{i}]", code="unsupported_value"
            )
    top = body.get("top_logprobs")
    if isinstance(top, int) and not isinstance(top, bool) and 0 < top <= 20:
        raise invalid_request("Sentinel does not return logprobs.", param="top_logprobs", code="unsupported_value")
    if body.get("truncation") == "auto":
        message = "Sentinel does not truncate conversations: send truncation 'disabled' (the default)."
        raise invalid_request(message, param="truncation", code="unsupported_value")
