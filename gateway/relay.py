"""A streamed answer relayed to the client in its dialect, and billed however the stream ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Protocol

from billing.ledger import LedgerRecord
from billing.money import format_usd
from gateway import sse
from gateway.call import Call, Reply, both, response_headers, spawn
from gateway.chain import call_chain
from gateway.errors import GatewayError
from gateway.limits import tokens as prompt_tokens
from gateway.screening.streaming import screen_stream
from gateway.settlement import charge, finish, ledger_record, remember
from gateway.upstream.failures import UpstreamError
from gateway.upstream.routing import Target
from gateway.upstream.transport import Event


class StreamDialect(Protocol):
    """How a relayed stream is written in the client's dialect (chat chunks, Responses events)."""

    def chunk(self, event: Event) -> bytes: ...

    def usage(self, chunk: dict) -> None: ...

    async def end(self, cost: Decimal, answer: dict) -> bytes: ...

    def broken(self, error: GatewayError) -> bytes: ...


class ChatChunks:
    """Chat completions' dialect: the provider's chunks as they came (the fast path's bytes
    untouched). A client that asked for usage gets the request's cost in the final usage chunk too
    (`usage.cost_usd`, the ledger's exact figure as a string: a stream has no header to carry it)."""

    def __init__(self, call: Call) -> None:
        self.wants_usage = bool(call.request.stream_options and call.request.stream_options.include_usage)
        self.usage_chunk: dict | None = None

    def chunk(self, event: Event) -> bytes:
        return event.raw or sse.event(event.data)

    def usage(self, chunk: dict) -> None:
        if self.wants_usage:
            self.usage_chunk = chunk  # sent last, with the cost

    async def end(self, cost: Decimal, answer: dict) -> bytes:
        if self.usage_chunk is None:
            return sse.DONE
        usage = {**self.usage_chunk["usage"], "cost_usd": format_usd(cost)}
        return sse.event({**self.usage_chunk, "usage": usage}) + sse.DONE

    def broken(self, error: GatewayError) -> bytes:
        return sse.event(error.payload())


async def stream_from_chain(call: Call, chain: list[Target], dialect: StreamDialect | None = None) -> Reply:
    first, rest = await call_chain(call, chain, stream=True)
    first, rest = screen_stream(call, first, rest)
    call.ttft_ms = call.elapsed_ms()
    headers = response_headers(call, None)
    headers["content-type"] = "text/event-stream"
    headers["cache-control"] = "no-cache"
    return Reply(200, headers, stream=relay(call, first, rest, dialect or ChatChunks(call)))


async def relay(call: Call, first: Event, rest: AsyncIterator[Event], dialect: StreamDialect) -> AsyncIterator[bytes]:
    """Forward the provider's chunks as SSE in the client's dialect; on a failure after the first
    token, end with an error event (never a silently truncated stream). The ledger record is
    written however it ends, before the dialect's last events."""
    usage: dict = {}
    answer = Answer()
    recorded = False
    try:
        answer.add(first.data)
        yield dialect.chunk(first)
        async for event in rest:
            chunk = event.data
            if chunk.get("usage"):
                usage = chunk["usage"]
                if not chunk.get("choices"):
                    dialect.usage(chunk)
                    continue
            answer.add(chunk)
            yield dialect.chunk(event)
        recorded = True
        record, stored = await stream_answer(call, usage, answer, first.data.get("model", ""))
        # The dialect's last events are made while the record is handed off: the Responses API
        # stores the response meanwhile, two round trips at once, both done before the client has them.
        _, last = await both(finish(call, record), dialect.end(Decimal(record.cost_usd), stored))
        yield last
        remember(call, stored, Decimal(record.cost_usd))
    except UpstreamError as error:
        yield dialect.broken(stream_broke(call, error))
        recorded = True
        await finish(call, await stream_record(call, 502, "stream_interrupted", usage))
    finally:
        if not recorded:
            # The client went away (this task is being cancelled): record what it got, separately.
            spawn(finish_disconnected(call, usage, answer))
        await rest.aclose()


async def stream_completed(call: Call, usage: dict, answer: Answer, model: str) -> tuple[LedgerRecord, dict]:
    """A relayed stream that ended well: its ledger record written, its answer put together to cache."""
    record, stored = await stream_answer(call, usage, answer, model)
    await finish(call, record)
    return record, stored


async def stream_answer(call: Call, usage: dict, answer: Answer, model: str) -> tuple[LedgerRecord, dict]:
    """A relayed stream that ended well: its ledger record, and its answer put together to cache."""
    record = await stream_record(call, 200, "", usage)
    stored = answer.stored(usage, model)
    call.answer_text = stored["content"]
    return record, stored


def stream_broke(call: Call, error: UpstreamError) -> GatewayError:
    """After the first token there is no failing over: the stream ends with this error, and the
    breaker counts the broken stream against the deployment."""
    call.attempts[-1].outcome = "fail"
    return GatewayError(502, "stream_interrupted", f"The provider's stream broke off after it started: {error.message}")


class Answer:
    """A streamed answer put back together, to be cached once the stream completes."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.arguments: list[str] = []  # tool calls' names and arguments as relayed
        self.finish_reason: str | None = None
        self.tool_calls = False

    def add(self, chunk: dict) -> None:
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.parts.append(delta["content"])
            calls = delta.get("tool_calls") or ([delta["function_call"]] if delta.get("function_call") else [])
            for tool_call in calls:
                self.tool_calls = True
                function = (tool_call.get("function") if "function" in tool_call else tool_call) or {}
                self.arguments.extend(v for v in (function.get("name"), function.get("arguments")) if v)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def relayed(self) -> str:
        """All the answer text the client was sent, tool calls included."""
        return "".join(self.parts) + "".join(self.arguments)

    def stored(self, usage: dict, model: str) -> dict:
        return {
            "content": "".join(self.parts),
            "tool_calls": self.tool_calls,
            "finish_reason": self.finish_reason,
            "usage": usage,
            "model": model,
        }


async def finish_disconnected(call: Call, usage: dict, answer: Answer) -> None:
    """A client gone mid-stream is billed for what the provider produced: its own usage when it sent
    one (an explicit zero included), else the prompt as reserved for the deployment that answered
    and the text relayed, both by that deployment's tokenizer where it is public."""
    if not usage:
        model = call.target.litellm_model
        prompt = await prompt_tokens.aprompt_bound(call.body, [model])
        usage = {"prompt_tokens": prompt, "completion_tokens": prompt_tokens.completion_count(model, answer.relayed())}
    await finish(call, await stream_record(call, 499, "client_disconnected", usage))


async def stream_record(call: Call, status: int, error_code: str, usage: dict) -> LedgerRecord:
    return ledger_record(call, status, error_code=error_code, charged=await charge(call, usage))
