"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, an adapter at the edge
of the chat path (gateway.pipeline):

    authenticate (x-api-key or Bearer) → validate Anthropic's request → translate it to a chat request
    → allowlist → route → admit (limits, budgets) → screen input → cache → call the chain (stream or
    not, failing over across formats) → screen output → translate the answer back → finish (ledger)

The translation both ways is litellm's own Messages adapter (LiteLLMAnthropicMessagesAdapter and its
AnthropicStreamWrapper, from litellm.llms.anthropic.messages.adapters), so every deployment a chat
request can reach serves Messages too, and an Anthropic-format deployment gets `cache_control` as
sent (litellm's Anthropic translation carries it from the chat messages to the provider's blocks).
Hand-written here: the request's validation (Anthropic's schema as an allowlist: a client names no
URL, key or server tool), the error shape, and the relay that bills a stream however it ends.

`anthropic-version` may be sent or left out, and is not checked: the request and answer shapes
Sentinel speaks are those every version since 2023-06-01 shares (the SDKs send newer ones).
count_tokens counts with litellm's token counter for the model's first deployment; it calls no
provider, so it is neither admitted nor billed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Annotated, Any, Literal

import litellm
import orjson
from litellm.llms.anthropic.messages.adapters.streaming_iterator import AnthropicStreamWrapper
from litellm.llms.anthropic.messages.adapters.transformation import LiteLLMAnthropicMessagesAdapter
from litellm.llms.anthropic.messages.utils import anthropic_sse_frame
from pydantic import Field, ValidationError

from gateway.auth import ensure_not_blocked
from gateway.bodies import check_body
from gateway.cache import engine as cache
from gateway.cache.replay import completion_body, stream_chunks
from gateway.call import Call, Reply, request_id_from, response_headers, spawn
from gateway.chain import call_chain
from gateway.errors import GatewayError, invalid_request
from gateway.pipeline import (
    INTERNAL_ERROR,
    admit,
    answer_from_chain,
    answered,
    authorize_model,
    consult_cache,
    identify,
    pick_model,
    route_and_admit,
)
from gateway.relay import Answer, finish_disconnected, stream_broke, stream_completed, stream_record
from gateway.schemas import CHAT_PARAMETERS, ChatRequest, _Strict, integer, json_object, validation_error
from gateway.screening import engine as screening
from gateway.screening.streaming import screen_stream
from gateway.settlement import finish, ledger_record, remember
from gateway.upstream.failures import UpstreamError
from gateway.upstream.routing import Target, route_for
from gateway.upstream.transport import Event

log = logging.getLogger(__name__)
# Accepted, not sent on: Sentinel's cache controls; top_k, which OpenAI's format has no equivalent
# of; service_tier, whose values are Anthropic's and mean something else to OpenAI.
NOT_SENT = frozenset({"cache", "top_k", "service_tier"})
MESSAGES_IDENTIFIERS = (("model",), ("metadata", "user_id"), ("cache", "namespace"))

# Anthropic's error `type` for each status a client can receive (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


# --- Anthropic's request, as an allowlist --------------------------------------------------------


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class _Block(_Strict):
    cache_control: CacheControl | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list[dict[str, Any]] | None = None


NonEmpty = Annotated[str, Field(min_length=1)]


class Base64Source(_Strict):
    type: Literal["base64"]
    media_type: NonEmpty
    data: NonEmpty


class UrlSource(_Strict):
    # Fetched by the provider, as an image_url part of a chat request is.
    type: Literal["url"]
    url: NonEmpty


# Sources litellm translates for every format: inline data and URLs (not Anthropic's Files API ids,
# which only Anthropic could read).
Source = Annotated[Base64Source | UrlSource, Field(discriminator="type")]


class ImageBlock(_Block):
    type: Literal["image"]
    source: Source


class DocumentBlock(_Block):
    type: Literal["document"]
    source: Source
    title: str | None = None
    context: str | None = None
    citations: dict[str, Any] | None = None


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1, max_length=200)]
    name: Annotated[str, Field(min_length=1, max_length=200)]
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1, max_length=200)]
    content: str | list[Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


# Anthropic's blocks by who may send them: thinking and tool calls are the assistant's, tool results
# and documents the user's.
UserBlock = Annotated[TextBlock | ImageBlock | DocumentBlock | ToolResultBlock, Field(discriminator="type")]
AssistantBlock = Annotated[
    TextBlock | ToolUseBlock | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")
]


class UserMessage(_Strict):
    role: Literal["user"]
    content: NonEmpty | Annotated[list[UserBlock], Field(min_length=1)]


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: NonEmpty | Annotated[list[AssistantBlock], Field(min_length=1)]


MessageParam = Annotated[UserMessage | AssistantMessage, Field(discriminator="role")]


class ToolParam(_Strict):
    # Client tools only: Anthropic's server tools (web search, code execution, MCP) run on
    # Anthropic's side and have no equivalent on other providers.
    type: Literal["custom"] | None = None
    name: Annotated[str, Field(min_length=1, max_length=200)]
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None


class _ToolChoice(_Strict):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAuto(_ToolChoice):
    type: Literal["auto"]


class ToolChoiceAny(_ToolChoice):
    type: Literal["any"]


class ToolChoiceTool(_ToolChoice):
    type: Literal["tool"]
    name: Annotated[str, Field(min_length=1, max_length=200)]


class ToolChoiceNone(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class ThinkingConfig(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: integer(ge=1024, le=2**31 - 1) | None = None


class Metadata(_Strict):
    user_id: Annotated[str, Field(max_length=256)] | None = None


class _MessagesBody(_Strict):
    model: Annotated[str, Field(min_length=1, max_length=200)]
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None


class MessagesRequest(_MessagesBody):
    """Anthropic's Messages request (https://docs.anthropic.com/en/api/messages) plus Sentinel's `cache`."""

    max_tokens: integer(ge=1, le=2**31 - 1)
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: integer(ge=0, le=2**31 - 1) | None = None
    metadata: Metadata | None = None
    # Asked of the chain as OpenAI's reasoning_effort (litellm's translation; an Anthropic-format
    # deployment gets its thinking budget back from it). "disabled" asks for nothing.
    thinking: ThinkingConfig | None = None
    service_tier: str | None = None
    # Sentinel's: read by gateway.cache.engine.controls_from, never sent to a provider.
    cache: dict[str, Any] | None = None


class CountTokensRequest(_MessagesBody):
    """The body of /v1/messages/count_tokens: what a request's input is made of."""


def parse_messages_request(raw: bytes, schema: type[_MessagesBody] = MessagesRequest) -> tuple[_MessagesBody, dict]:
    """The validated request and the body it read (without the nulls that stand for leaving a field
    out, which litellm's adapter would not all read so). Raises GatewayError(400) on anything wrong."""
    body = json_object(raw)
    check_body(body, identifiers=MESSAGES_IDENTIFIERS, raw=raw)
    try:
        request = schema.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    read = request.model_dump(exclude_none=True)
    if body.get("cache") is not None:
        read["cache"] = body["cache"]  # as sent: gateway.cache.engine.controls_from checks it
    return request, read


def chat_request_from(body: dict) -> tuple[ChatRequest, dict]:
    """The chat request a validated Messages body translates to (litellm's adapter), checked as the
    chat path checks its own: what it produces outside OpenAI's parameters (top_k, thinking) is not
    sent on, so nothing reaches a provider that the chat allowlist would refuse."""
    anthropic = {name: value for name, value in body.items() if name not in NOT_SENT}
    if (body.get("thinking") or {}).get("type") == "disabled":
        del anthropic["thinking"]
    try:
        translated, _ = LiteLLMAnthropicMessagesAdapter(keep_cache_control=True).translate_anthropic_to_openai(
            anthropic
        )
    except Exception as exc:  # noqa: BLE001 - a request litellm cannot read is the client's to fix
        log.info("untranslatable messages request: %r", exc)
        raise invalid_request("The request could not be translated: check its content blocks.") from None
    chat = {name: value for name, value in dict(translated).items() if name in CHAT_PARAMETERS}
    chat["messages"] = [_without_nulls(message) for message in chat["messages"]]
    if not chat["messages"]:
        raise invalid_request("The messages hold nothing a model can read.", param="messages")
    if "cache" in body:
        chat["cache"] = body["cache"]
    try:
        return ChatRequest.model_validate(chat), chat
    except ValidationError as exc:
        raise validation_error(exc) from None


def _without_nulls(message: dict) -> dict:
    return {name: value for name, value in dict(message).items() if value is not None}


# --- errors in Anthropic's shape -----------------------------------------------------------------


def error_payload(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def anthropic_error(reply: Reply) -> Reply:
    """A gateway error reply (OpenAI's shape) in Anthropic's shape, same status and headers."""
    try:
        message = orjson.loads(reply.body)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = "Sentinel failed to handle this request."
    headers = dict(reply.headers)
    if "x-sentinel-request-id" in headers:
        headers["request-id"] = headers["x-sentinel-request-id"]
    return Reply(reply.status, headers, orjson.dumps(error_payload(reply.status, message)))


def render_error(error: GatewayError) -> bytes:
    """For gateway.http's refusals before a handler runs (405, 413)."""
    return orjson.dumps(error_payload(error.status, error.message))


# --- the request path ----------------------------------------------------------------------------


async def create(headers, raw_body: bytes) -> Reply:
    call = Call(request_id=request_id_from(headers.get("x-sentinel-request-id")))
    return await answered(call, lambda: _create(call, headers, raw_body), error_shape=anthropic_error)


async def _create(call: Call, headers, raw_body: bytes) -> Reply:
    call.key = await identify(headers, None)
    _, anthropic = parse_messages_request(raw_body)
    call.request, call.body = chat_request_from(anthropic)
    call.cache_controls = cache.controls_from(call.body, headers)
    route, chain = await route_and_admit(call, headers, None, model_of=pick_model, admit_with=admit)
    await screening.screen_input(call)
    hit = await consult_cache(call, route)
    if hit is not None:
        return await serve_from_cache(call, hit)
    if call.request.stream:
        return await stream_from_chain(call, chain)
    return await complete_from_chain(call, chain)


async def complete_from_chain(call: Call, chain: list[Target]) -> Reply:
    """The chat path's non-streamed answer (screened, a refusal escalated, billed, cached), as a message."""
    response, headers = await answer_from_chain(call, chain)
    headers["request-id"] = call.request_id
    return Reply(200, headers, orjson.dumps(message_from(response)))


def message_from(response: dict) -> dict:
    """An OpenAI chat completion as Anthropic's message (litellm's adapter)."""
    translated = LiteLLMAnthropicMessagesAdapter().translate_openai_response_to_anthropic(
        litellm.ModelResponse(**response)
    )
    message = dict(translated)
    message["id"] = _message_id()
    if message.get("stop_details") is None:
        message.pop("stop_details", None)
    return message


def _message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def _headers(call: Call, cost: Decimal | None) -> dict[str, str]:
    headers = response_headers(call, cost)
    headers["request-id"] = call.request_id
    return headers


async def serve_from_cache(call: Call, hit: cache.Hit) -> Reply:
    """A hit (stored by either dialect: the same chat request is the same question) at zero cost."""
    call.cache_tier = hit.tier
    cache.note_hit(hit.entry_id)
    headers = _headers(call, Decimal(0))
    headers["x-sentinel-provider"] = "cache"
    call.answer_text = hit.answer.get("content")
    await finish(call, ledger_record(call, 200, usage=hit.answer.get("usage") or {}, saved=hit.cost_usd))
    if not call.request.stream:
        return Reply(200, headers, orjson.dumps(message_from(orjson.loads(completion_body(hit.answer)))))

    async def replayed() -> AsyncIterator[Event]:
        async for raw in stream_chunks(hit.answer, include_usage=True):
            if raw.startswith(b"data: {"):
                yield Event(orjson.loads(raw[len(b"data: ") :]))

    return Reply(200, _stream_headers(headers), stream=_anthropic_events(replayed(), hit.answer["model"]))


def _stream_headers(headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "content-type": "text/event-stream", "cache-control": "no-cache"}


async def _anthropic_events(events: AsyncIterator[Event], model: str) -> AsyncIterator[bytes]:
    """OpenAI chunks as Anthropic's event sequence (litellm's AnthropicStreamWrapper), framed."""

    async def chunks():
        async for event in events:
            yield litellm.ModelResponseStream(**event.data)

    async for event in AnthropicStreamWrapper(chunks(), model=model):
        yield anthropic_sse_frame(event)


async def stream_from_chain(call: Call, chain: list[Target]) -> Reply:
    first, rest = await call_chain(call, chain, stream=True)
    first, rest = screen_stream(call, first, rest)
    call.ttft_ms = call.elapsed_ms()
    return Reply(200, _stream_headers(_headers(call, None)), stream=relay(call, first, rest))


async def relay(call: Call, first: Event, rest: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    """The provider's chunks as Anthropic's events. As the chat relay does: usage read as it passes,
    the ledger record written however the stream ends, a failure after the first token ends the
    stream with an `error` event (never a stream that looks complete), a client gone is billed for
    what it got."""
    usage: dict = {}
    answer = Answer()
    recorded = False

    async def chunks() -> AsyncIterator[Event]:
        nonlocal usage
        answer.add(first.data)
        yield first
        async for event in rest:
            if event.data.get("usage"):
                usage = event.data["usage"]
            if event.data.get("choices"):
                answer.add(event.data)
            yield event

    try:
        async for frame in _anthropic_events(chunks(), first.data.get("model", "")):
            yield frame
        recorded = True
        record, stored = await stream_completed(call, usage, answer, first.data.get("model", ""))
        remember(call, stored, Decimal(record.cost_usd))
    except UpstreamError as error:
        yield anthropic_sse_frame(error_payload(502, stream_broke(call, error).message))
        recorded = True
        await finish(call, await stream_record(call, 502, "stream_interrupted", usage))
    finally:
        if not recorded:
            spawn(finish_disconnected(call, usage, answer))
        await rest.aclose()


# --- count_tokens --------------------------------------------------------------------------------


async def count_tokens(headers, raw_body: bytes) -> Reply:
    """The input's tokens as the model's first deployment counts them (litellm.token_counter)."""
    request_id = request_id_from(headers.get("x-sentinel-request-id"))
    reply_headers = {"x-sentinel-request-id": request_id, "request-id": request_id}
    try:
        key = await identify(headers, None)
        await ensure_not_blocked(key)
        request, body = parse_messages_request(raw_body, CountTokensRequest)
        authorize_model(key, request.model)
        route = await route_for(request.model, key.tenant_id)
        chat = chat_request_from({**body, "max_tokens": 1})[1]
        counted = await asyncio.to_thread(
            litellm.token_counter,
            model=route.targets[0].litellm_model,
            messages=chat["messages"],
            tools=chat.get("tools"),
        )
    except GatewayError as error:
        return Reply(error.status, {**reply_headers, **error.headers}, render_error(error))
    except Exception:
        log.exception("request %s failed unexpectedly", request_id)
        return Reply(500, reply_headers, render_error(INTERNAL_ERROR))
    return Reply(200, reply_headers, orjson.dumps({"input_tokens": int(counted)}))
