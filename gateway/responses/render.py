"""Answers in the Responses dialect: a chat completion (or a cached answer) as a Response object,
and a relayed chat stream as the Responses typed events (gateway.relay.StreamDialect).

Written here rather than with litellm's bridge (litellm.responses.litellm_completion_transformation,
which translates the requests, gateway.responses.translate): its streaming iterator pulls from its
own CustomStreamWrapper and bills through litellm's logging object, while Sentinel's pipeline pushes
OpenAI chunks (the fast path's bytes) and keeps its own ledger; and its non-streamed answer names
output items with ids of its own, which the official SDK's stream accumulator checks against the
items it saw streamed. One renderer for both keeps a streamed response and its stored copy the same.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal

import orjson

from billing.money import format_usd
from gateway.errors import GatewayError
from gateway.responses.schemas import ResponsesRequest
from gateway.upstream.transport import Event


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class Shape:
    """What every Response object of one request echoes: its id and the request's settings."""

    response_id: str
    request: ResponsesRequest
    body: dict
    store: bool
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(self, *, status: str, model: str, output: list[dict], usage: dict | None) -> dict:
        request, body = self.request, self.body
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "max_tool_calls": request.max_tool_calls,
            "model": model or request.model,
            "output": output,
            "parallel_tool_calls": True if request.parallel_tool_calls is None else request.parallel_tool_calls,
            "previous_response_id": request.previous_response_id,
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "store": self.store,
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": [{"strict": True, **tool} for tool in body.get("tools") or ()],
            "top_p": 1.0 if request.top_p is None else request.top_p,
            "truncation": request.truncation or "disabled",
            "usage": usage,
            "user": request.user,
            "metadata": body.get("metadata") or {},
        }


def usage_of(usage: dict) -> dict:
    """A chat completion's usage in the Responses dialect."""
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    reasoning = int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def message_item(item_id: str, text: str, refusal: str | None, status: str = "completed") -> dict:
    content: list[dict] = []
    if text:
        content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    if refusal:
        content.append({"type": "refusal", "refusal": refusal})
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_of(message: dict) -> list[dict]:
    """An assistant chat message as Response output items: its text (or refusal), then its calls."""
    output = []
    text = message.get("content") if isinstance(message.get("content"), str) else ""
    if text or message.get("refusal"):
        output.append(message_item(new_id("msg"), text, message.get("refusal")))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        name, arguments = function.get("name") or "", function.get("arguments") or ""
        output.append(call_item(new_id("fc"), call.get("id") or "", name, arguments))
    return output


def assistant_message(output: list[dict]) -> dict:
    """Response output items as the assistant chat message a next turn continues from."""
    text = "".join(
        part["text"] for item in output if item["type"] == "message" for part in item["content"] if part.get("text")
    )
    calls = [
        {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
        for item in output
        if item["type"] == "function_call"
    ]
    message: dict = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


_CITATION = re.compile(r"\[(\d{1,2})\]")


def citations(text: str, sources: list) -> list[dict]:
    """The `[n]` markers of an answer's text as OpenAI's file_citation annotations: passage n of those
    the file search gave (gateway.knowledge.grounding numbers them from 1); other numbers are text."""
    return [
        {
            "type": "file_citation",
            "index": match.start(),
            "file_id": sources[int(match[1]) - 1].file_id,
            "filename": sources[int(match[1]) - 1].filename,
        }
        for match in _CITATION.finditer(text)
        if 1 <= int(match[1]) <= len(sources)
    ]


def cite(output: list[dict], sources: list) -> None:
    """Annotate, in place, each output_text of the output's messages with its citations."""
    if not sources:
        return
    for item in output:
        for part in item.get("content") or () if item["type"] == "message" else ():
            if part["type"] == "output_text":
                part["annotations"] = citations(part["text"], sources)


def file_search_item(query: str, hits: list, *, with_results: bool) -> dict:
    """A file_search_call output item: what was searched for and, when the request's `include` asks
    for `file_search_call.results`, the passages found."""
    results = [
        {
            "file_id": hit.file_id,
            "filename": hit.filename,
            "score": round(hit.score, 6),
            "text": hit.text,
            "attributes": hit.attributes,
        }
        for hit in hits
    ]
    return {
        "id": new_id("fs"),
        "type": "file_search_call",
        "status": "completed",
        "queries": [query] if query else [],
        "results": results if with_results else None,
    }


def response_from_completion(shape: Shape, completion: dict) -> dict:
    """A non-streamed chat completion as a Response object."""
    choice = (completion.get("choices") or [{}])[0]
    output = output_of(choice.get("message") or {})
    status = status_of(choice.get("finish_reason"))
    return shape.response(
        status=status, model=completion.get("model", ""), output=output, usage=usage_of(completion.get("usage") or {})
    )


# --- the stream --------------------------------------------------------------------------------


def sse(payload: dict) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@dataclass
class _Call:
    output_index: int
    item_id: str
    call_id: str
    name: str
    arguments: str = ""


class ResponsesEvents:
    """A chat stream written as the Responses API streams: response.created and .in_progress,
    then for the text an output item and its content part with output_text deltas, and for each
    tool call a function_call item with its arguments' deltas; at the end each item's done events,
    then response.completed (or .incomplete, cut at max_output_tokens) carrying the whole Response,
    stored first when it is to be (`keep`), so it can be read as soon as the client has it."""

    def __init__(
        self,
        shape: Shape,
        keep: Callable[[dict], Awaitable[None]],
        prelude: list[dict] | None = None,
        sources: list | None = None,
    ) -> None:
        self.shape = shape
        self.keep = keep
        # Items done before the model runs (a file_search_call), first in the output, and the passages
        # it gave, which the answer's [n] markers cite.
        self.prelude = prelude or []
        self.sources = sources or []
        self.sequence = 0
        self.started = False
        self.model = ""
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.message_index: int | None = None
        self.message_id = new_id("msg")
        self.calls: dict[int, _Call] = {}
        self.next_index = len(self.prelude)
        self.finish_reason: str | None = None

    def _event(self, kind: str, **fields) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(payload)

    def _start(self) -> bytes:
        self.started = True
        snapshot = self.shape.response(status="in_progress", model=self.model, output=[], usage=None)
        out = self._event("response.created", response=snapshot) + self._event(
            "response.in_progress", response=snapshot
        )
        for index, item in enumerate(self.prelude):  # a file search, as OpenAI streams one
            out += self._event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"})
            for stage in ("in_progress", "searching", "completed"):
                out += self._event(f"response.file_search_call.{stage}", output_index=index, item_id=item["id"])
            out += self._event("response.output_item.done", output_index=index, item=item)
        return out

    def _index(self) -> int:
        self.next_index += 1
        return self.next_index - 1

    def chunk(self, event: Event) -> bytes:
        data = event.data
        self.model = self.model or data.get("model", "")
        out = b"" if self.started else self._start()
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            out += self._text(delta.get("content"))
            if delta.get("refusal"):
                self.refusal.append(delta["refusal"])
            for call in delta.get("tool_calls") or ():
                out += self._call(call)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return out

    def _text(self, text: str | None) -> bytes:
        if not text:
            return b""
        out = b""
        if self.message_index is None:
            self.message_index = self._index()
            item = message_item(self.message_id, "", None, status="in_progress")
            out += self._event("response.output_item.added", output_index=self.message_index, item=item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._event(
                "response.content_part.added",
                item_id=self.message_id,
                output_index=self.message_index,
                content_index=0,
                part=part,
            )
        self.text.append(text)
        return out + self._event(
            "response.output_text.delta",
            item_id=self.message_id,
            output_index=self.message_index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _call(self, delta: dict) -> bytes:
        position = int(delta.get("index") or 0)
        function = delta.get("function") or {}
        out = b""
        call = self.calls.get(position)
        if call is None:
            call = _Call(self._index(), new_id("fc"), delta.get("id") or "", function.get("name") or "")
            self.calls[position] = call
            item = call_item(call.item_id, call.call_id, call.name, "", status="in_progress")
            out += self._event("response.output_item.added", output_index=call.output_index, item=item)
        arguments = function.get("arguments") or ""
        if arguments:
            call.arguments += arguments
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=call.item_id,
                output_index=call.output_index,
                delta=arguments,
            )
        return out

    def usage(self, chunk: dict) -> None:
        pass  # the usage reaches end() with the answer

    def output(self) -> list[dict]:
        items: list[tuple[int, dict]] = list(enumerate(self.prelude))
        if self.message_index is not None or self.refusal:
            text, refusal = "".join(self.text), "".join(self.refusal) or None
            position = self.message_index if self.message_index is not None else -1
            items.append((position, message_item(self.message_id, text, refusal)))
        for call in self.calls.values():
            items.append((call.output_index, call_item(call.item_id, call.call_id, call.name, call.arguments)))
        return [item for _, item in sorted(items, key=lambda pair: pair[0])]

    async def end(self, cost: Decimal, answer: dict) -> bytes:
        out = b"" if self.started else self._start()
        if self.message_index is not None:
            text = "".join(self.text)
            annotations = citations(text, self.sources)
            part = {"type": "output_text", "text": text, "annotations": annotations, "logprobs": []}
            common = {"item_id": self.message_id, "output_index": self.message_index, "content_index": 0}
            for number, annotation in enumerate(annotations):
                out += self._event(
                    "response.output_text.annotation.added", **common, annotation_index=number, annotation=annotation
                )
            out += self._event("response.output_text.done", **common, text=text, logprobs=[])
            out += self._event("response.content_part.done", **common, part=part)
        output = self.output()
        cite(output, self.sources)
        for item in output:
            if item["type"] == "function_call":
                call = next(c for c in self.calls.values() if c.item_id == item["id"])
                out += self._event(
                    "response.function_call_arguments.done",
                    item_id=call.item_id,
                    output_index=call.output_index,
                    name=call.name,
                    arguments=call.arguments,
                )
                out += self._event("response.output_item.done", output_index=call.output_index, item=item)
            elif self.message_index is not None:
                out += self._event("response.output_item.done", output_index=self.message_index, item=item)
        status = status_of(self.finish_reason or answer.get("finish_reason"))
        response = self.shape.response(
            status=status, model=self.model or answer.get("model", ""), output=output, usage=usage_of(answer["usage"])
        )
        await self.keep(response)
        # The cost of the request, the ledger's exact figure as a string: a stream has no header for it.
        streamed = {**response, "usage": {**response["usage"], "cost_usd": format_usd(cost)}}
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(kind, response=streamed)

    def broken(self, error: GatewayError) -> bytes:
        failed = self.shape.response(status="failed", model=self.model, output=self.output(), usage=None)
        failed["error"] = {"code": error.code, "message": error.message}
        return self._event("response.failed", response=failed)
