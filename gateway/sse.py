"""Server-sent events as OpenAI streams them: each event one `data:` line of JSON, the stream ending
with `data: [DONE]`. The gateway's relay, the cache's replay and the mock provider frame with these."""

from __future__ import annotations

import orjson

DONE = b"data: [DONE]\n\n"


def event(payload: dict) -> bytes:
    """One event carrying `payload` as JSON."""
    return frame(orjson.dumps(payload))


def frame(payload: bytes) -> bytes:
    """One event carrying `payload`, JSON already encoded (a provider's, relayed as it came)."""
    return b"data: " + payload + b"\n\n"


def chunk(completion_id: str, created: int, model: str, delta: dict, finish: str | None = None) -> bytes:
    """One chat.completion.chunk event with a single choice."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return event(_chunk(completion_id, created, model, choices=[choice]))


def usage_chunk(completion_id: str, created: int, model: str, usage: dict) -> bytes:
    """The last chunk when the client asked for usage (stream_options.include_usage): no choices."""
    return event(_chunk(completion_id, created, model, choices=[], usage=usage))


def _chunk(completion_id: str, created: int, model: str, **fields) -> dict:
    return {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model, **fields}
