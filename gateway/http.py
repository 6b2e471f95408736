"""The hot endpoints, POST /v1/chat/completions, /v1/embeddings, /v1/images/generations (and its edits
and variations), /v1/responses and /v1/messages (and its count_tokens), and GET /v1/models, served as
a plain ASGI app.

The request path (gateway.pipeline) takes headers and a body and returns a Reply; serving it
through Django's ASGI handler cost more CPU than the whole pipeline (two signals whose receivers run
in a fresh thread per request, a thread hop for response.close, a disconnect-listener task, a send
loop per chunk; docs/decisions.md #1). Here the same pipeline is served directly:
the body is read with its size limit, the reply is sent as it is, and a client that goes away
cancels the request so what it held is released (the pipeline records it as 499). Everything else
under /v1 and /health stays with Django (sentinel.asgi).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from django.conf import settings

from gateway import embeddings, image_edits, images, messages, metrics, pipeline
from gateway.call import Reply
from gateway.errors import GatewayError
from gateway.responses import api as responses

Handler = Callable[[dict, bytes], Awaitable[Reply]]


@dataclass(frozen=True)
class Route:
    method: str
    handler: Handler
    endpoint: str  # the metrics label
    # The dialect's error body, for refusals before the handler runs (Anthropic's for /v1/messages).
    error_body: Callable[[GatewayError], bytes] = GatewayError.body


async def _models(headers: dict, body: bytes) -> Reply:
    return await pipeline.list_models(headers)


ROUTES = {
    "/v1/chat/completions": Route("POST", pipeline.chat_completions, "chat_completions"),
    "/v1/embeddings": Route("POST", embeddings.create, "embeddings"),
    "/v1/images/generations": Route("POST", images.create, "images_generations"),
    "/v1/images/edits": Route("POST", image_edits.edit, "images_edits"),
    "/v1/images/variations": Route("POST", image_edits.variation, "images_variations"),
    "/v1/responses": Route("POST", responses.create, "responses"),
    "/v1/messages": Route("POST", messages.create, "messages", messages.render_error),
    "/v1/messages/count_tokens": Route("POST", messages.count_tokens, "messages_count_tokens", messages.render_error),
    "/v1/models": Route("GET", _models, "models"),
}


class _Connection:
    """Whether the client is still there, watched while the request is handled."""

    def __init__(self) -> None:
        self.gone = False
        self.done = False


async def _watch(receive, handling: asyncio.Task, connection: _Connection) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not connection.done:
                connection.gone = True
                handling.cancel()
            return


async def _read_body(receive, declared: bytes | None) -> bytes | None:
    """The body, or None when the client left or the body is over the limit (raises GatewayError)."""
    limit = settings.MAX_BODY_BYTES
    too_large = GatewayError(413, "request_too_large", f"Request body is larger than {limit} bytes.")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(reply: Reply, send, *, close: bool = False) -> None:
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in reply.headers.items()]
    if "content-type" not in reply.headers:
        headers.append((b"content-type", b"application/json"))
    if reply.stream is None:
        headers.append((b"content-length", str(len(reply.body)).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    if reply.stream is None:
        await send({"type": "http.response.body", "body": reply.body})
        return
    async for chunk in reply.stream:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def serve(scope, receive, send) -> None:
    route = ROUTES[scope["path"]]
    raw_headers = scope["headers"]
    if scope["method"] != route.method:
        error = GatewayError(
            405,
            "method_not_allowed",
            f"Use {route.method} for {scope['path']}.",
            headers={"allow": route.method},
        )
        metrics.endpoint_request(route.endpoint, 405)
        await _send(Reply(405, error.headers, route.error_body(error)), send)
        return
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in raw_headers}
    try:
        body = await _read_body(receive, headers.get("content-length", "").encode() or None)
    except GatewayError as error:
        metrics.endpoint_request(route.endpoint, error.status)
        await _send(Reply(error.status, {}, route.error_body(error)), send, close=True)
        return
    if body is None:
        return
    connection = _Connection()
    watcher = asyncio.get_running_loop().create_task(_watch(receive, asyncio.current_task(), connection))
    try:
        reply = await route.handler(headers, body)
        metrics.endpoint_request(route.endpoint, reply.status)
        await _send(reply, send)
    except asyncio.CancelledError:
        if not connection.gone:
            raise  # the server is shutting down, not the client leaving
    finally:
        connection.done = True
        watcher.cancel()
