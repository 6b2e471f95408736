"""Stored answers: what may be stored, and how a hit is served (a completion, or a stream chunked
like a live one, which the OpenAI SDK cannot tell from the real thing)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator

import orjson

from gateway import sse

# Openings of refusals and apologies: such an answer is about this model's mood, not the question.
REFUSAL = re.compile(
    r"^\s*(i'?m sorry|i am sorry|sorry,? (but )?i|i apologi[sz]e|i can(not|'t|’t) (help|assist|provide|do|comply)"
    r"|i('m| am) (not able|unable) to|as an ai\b)",
    re.IGNORECASE,
)
STORABLE_FINISH = frozenset({"stop", "length"})


def storable(answer: dict) -> bool:
    """Complete, plain-text answers only: no errors, refusals, tool calls or broken streams."""
    content = answer.get("content")
    return (
        answer.get("finish_reason") in STORABLE_FINISH
        and isinstance(content, str)
        and bool(content.strip())
        and not answer.get("tool_calls")
        and not REFUSAL.match(content)
    )


def answer_from_response(response: dict) -> dict | None:
    """The storable part of a non-streamed completion (one choice), else None."""
    choices = response.get("choices") or []
    if len(choices) != 1:
        return None
    message = choices[0].get("message") or {}
    return {
        "content": message.get("content"),
        "tool_calls": message.get("tool_calls"),
        "finish_reason": choices[0].get("finish_reason"),
        "usage": response.get("usage") or {},
        "model": response.get("model", ""),
    }


def completion_body(answer: dict) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-cache-" + uuid.uuid4().hex[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": answer["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer["content"]},
                    "finish_reason": answer["finish_reason"],
                }
            ],
            "usage": answer["usage"],
        }
    )


_PIECES = re.compile(r"\s*\S+|\s+")


async def stream_chunks(answer: dict, *, include_usage: bool) -> AsyncIterator[bytes]:
    """The answer as SSE chunks, a word at a time, framed exactly like a provider's stream."""
    completion_id = "chatcmpl-cache-" + uuid.uuid4().hex[:24]
    created = int(time.time())
    model = answer["model"]

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return sse.chunk(completion_id, created, model, delta, finish)

    yield chunk({"role": "assistant", "content": ""})
    for piece in _PIECES.findall(answer["content"]):
        yield chunk({"content": piece})
    yield chunk({}, answer["finish_reason"])
    if include_usage:
        yield sse.usage_chunk(completion_id, created, model, answer["usage"])
    yield sse.DONE
