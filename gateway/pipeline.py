"""POST /v1/chat/completions, top to bottom.

    authenticate → check blocks → validate → allowlist → route → call (stream or not)
    → respond → hand the ledger record off

Each stage is a small function; the view only turns the Reply into an HTTP response.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from decimal import Decimal

import orjson
from django.conf import settings

from billing.ledger import LedgerRecord, hand_off
from billing.money import ZERO, format_usd, request_cost
from billing.prices import aprice_at
from gateway import providers
from gateway.auth import KeyInfo, authenticate, block_markers, check_blocks
from gateway.errors import GatewayError
from gateway.failures import UpstreamError
from gateway.localstate import GENERATION_KEY, observe_generation
from gateway.routing import Target, chain_for, order_for_request
from gateway.schemas import ChatRequest, parse_chat_request
from gateway.transport import Event
from sentinel.redis_clients import async_redis

REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_background: set[asyncio.Task] = set()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None


@dataclass
class Call:
    """What the pipeline learns about one request as it goes."""

    request_id: str
    started: float = field(default_factory=time.perf_counter)
    key: KeyInfo | None = None
    request: ChatRequest | None = None
    body: dict = field(default_factory=dict)
    target: Target | None = None
    fallbacks: int = 0
    ttft_ms: int | None = None

    def elapsed_ms(self) -> int:
        return int((time.perf_counter() - self.started) * 1000)


def request_id_from(header: str | None) -> str:
    """The client's id when it is a sane token, else a fresh one."""
    if header and REQUEST_ID_PATTERN.match(header):
        return header
    return "req_" + uuid.uuid4().hex


def spawn(coro) -> None:
    """Run follow-up work after the response without letting the task be garbage-collected."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


# --- the request path --------------------------------------------------------------------------


async def chat_completions(headers, raw_body: bytes) -> Reply:
    call = Call(request_id=request_id_from(headers.get("x-sentinel-request-id")))
    try:
        call.key = await authenticate(headers.get("authorization"), headers.get("x-api-key"))
        await check_shared_state(call.key)
        call.request, call.body = parse_chat_request(raw_body)
        authorize_model(call.key, call.request.model)
        chain = order_for_request(await chain_for(call.request.model))
        if call.request.stream:
            return await stream_from_chain(call, chain)
        return await complete_from_chain(call, chain)
    except GatewayError as error:
        return await error_reply(call, error)


async def check_shared_state(key: KeyInfo) -> None:
    """One Redis round trip: the configuration generation and the key's and tenant's blocks."""
    key_marker, tenant_marker = block_markers(key)
    generation, key_blocked, tenant_blocked = await async_redis().mget(GENERATION_KEY, key_marker, tenant_marker)
    observe_generation(generation)
    check_blocks(key, key_blocked, tenant_blocked)


def authorize_model(key: KeyInfo, model: str) -> None:
    if not key.may_use(model):
        raise GatewayError(
            403,
            "model_not_allowed",
            f"This key is not allowed to use the model '{model}'.",
            param="model",
        )


async def complete_from_chain(call: Call, chain: list[Target]) -> Reply:
    deadline = call.started + settings.CHAIN_DEADLINE_SECONDS
    last_error: UpstreamError | None = None
    for index, target in enumerate(chain):
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            break
        call.target, call.fallbacks = target, index
        try:
            response = await providers.complete(
                target, call.body, timeout=min(target.timeout, remaining), request_id=call.request_id
            )
        except UpstreamError as error:
            if not error.retryable:
                raise as_client_error(error) from None
            last_error = error
            continue
        usage = response.get("usage") or {}
        cost, price_id = await cost_of(target, usage)
        headers = response_headers(call, cost)
        await finish(ledger_record(call, 200, usage=usage, cost=cost, price_id=price_id))
        return Reply(200, headers, orjson.dumps(response))
    raise all_failed(last_error)


async def stream_from_chain(call: Call, chain: list[Target]) -> Reply:
    deadline = call.started + settings.CHAIN_DEADLINE_SECONDS
    last_error: UpstreamError | None = None
    for index, target in enumerate(chain):
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            break
        call.target, call.fallbacks = target, index
        try:
            first, rest = await providers.open_stream(
                target,
                call.body,
                first_token_timeout=min(target.first_token_timeout, remaining),
                timeout=min(target.timeout, remaining),
                request_id=call.request_id,
            )
        except UpstreamError as error:
            if not error.retryable:
                raise as_client_error(error) from None
            last_error = error
            continue
        call.ttft_ms = call.elapsed_ms()
        headers = response_headers(call, None)
        headers["content-type"] = "text/event-stream"
        headers["cache-control"] = "no-cache"
        return Reply(200, headers, stream=relay(call, first, rest))
    raise all_failed(last_error)


async def relay(call: Call, first: Event, rest: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    """Forward the provider's chunks as SSE; on a failure after the first token, end with an
    error event (never a silently truncated stream). The ledger record is written however it ends."""
    wants_usage = bool(call.request.stream_options and call.request.stream_options.include_usage)
    usage: dict = {}
    recorded = False
    try:
        yield first.raw or sse(first.data)
        async for event in rest:
            chunk = event.data
            if chunk.get("usage"):
                usage = chunk["usage"]
                if not chunk.get("choices") and not wants_usage:
                    continue
            yield event.raw or sse(chunk)
        recorded = True
        await finish(await stream_record(call, 200, "", usage))
        yield b"data: [DONE]\n\n"
    except UpstreamError as error:
        message = f"The provider's stream broke off after it started: {error.message}"
        yield sse(GatewayError(502, "stream_interrupted", message).payload())
        recorded = True
        await finish(await stream_record(call, 502, "stream_interrupted", usage))
    finally:
        if not recorded:
            # The client went away (this task is being cancelled): record what it got, separately.
            spawn(finish_disconnected(call, usage))
        await rest.aclose()


async def finish_disconnected(call: Call, usage: dict) -> None:
    await finish(await stream_record(call, 499, "client_disconnected", usage))


async def stream_record(call: Call, status: int, error_code: str, usage: dict) -> LedgerRecord:
    cost, price_id = await cost_of(call.target, usage)
    return ledger_record(call, status, error_code=error_code, usage=usage, cost=cost, price_id=price_id)


def sse(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def as_client_error(error: UpstreamError) -> GatewayError:
    """An error retrying cannot fix goes back to the client as it is (and trips nothing)."""
    return GatewayError(error.status, error.code, error.message)


def all_failed(last_error: UpstreamError | None) -> GatewayError:
    detail = f" Last error: {last_error}." if last_error else ""
    return GatewayError(
        503,
        "all_providers_unavailable",
        "No provider could serve this request." + detail,
        headers={"retry-after": "1"},
    )


# --- the end of every request ------------------------------------------------------------------


async def finish(record: LedgerRecord) -> None:
    """Every authenticated request ends here, once: its record goes to the durable ledger queue."""
    await hand_off(record)


# --- money and records -------------------------------------------------------------------------


async def cost_of(target: Target, usage: dict) -> tuple[Decimal, int | None]:
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    if target.input_price_override is not None and target.output_price_override is not None:
        return request_cost(prompt, completion, target.input_price_override, target.output_price_override), None
    price = await aprice_at(target.litellm_model)
    return request_cost(prompt, completion, price.input_per_token, price.output_per_token), price.id


def response_headers(call: Call, cost: Decimal | None) -> dict[str, str]:
    headers = {
        "x-sentinel-request-id": call.request_id,
        "x-sentinel-cache": "miss",
        "x-sentinel-fallbacks": str(call.fallbacks),
    }
    if call.target is not None:
        headers["x-sentinel-provider"] = call.target.provider
        headers["x-sentinel-deployment"] = call.target.deployment
    if cost is not None:
        headers["x-sentinel-cost-usd"] = format_usd(cost)
    return headers


def ledger_record(
    call: Call,
    status: int,
    *,
    error_code: str = "",
    usage: dict | None = None,
    cost: Decimal = ZERO,
    price_id: int | None = None,
) -> LedgerRecord:
    usage = usage or {}
    target = call.target
    return LedgerRecord(
        request_id=call.request_id,
        tenant_id=call.key.tenant_id,
        key_id=call.key.key_id,
        model_requested=call.request.model if call.request else "",
        status_code=status,
        model_served=target.litellm_model if target and status == 200 else "",
        deployment=target.deployment if target else "",
        provider=target.provider if target else "",
        stream=bool(call.request and call.request.stream),
        error_code=error_code,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cost_usd=format_usd(cost),
        price_id=price_id,
        latency_ms=call.elapsed_ms(),
        ttft_ms=call.ttft_ms,
        fallbacks=call.fallbacks,
    )


async def error_reply(call: Call, error: GatewayError) -> Reply:
    headers = {"x-sentinel-request-id": call.request_id, **error.headers}
    if call.key is not None:
        # Authenticated requests are billed records even when refused (at zero cost).
        await finish(ledger_record(call, error.status, error_code=error.code))
    return Reply(error.status, headers, error.body())
