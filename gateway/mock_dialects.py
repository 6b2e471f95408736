"""The mock provider's other wire formats: Anthropic Messages and Gemini generateContent, and
OpenAI's embeddings, image generation, edits and variations (the last two as multipart forms).

Each answers the prompt with the same deterministic words as the OpenAI-format chat endpoint
(gateway.mock_answers.answer_tokens), and counts the prompt as OpenAI would count the same
conversation (the request read back into OpenAI's shape), so a chain that fails over between
formats gives the client the same answer and the same usage whichever deployment served it, as long
as the translation lost nothing. The virtual provider's fault switches apply as they do to chat.

Wire formats as the providers document them (and as litellm's translation reads them):
Anthropic https://docs.anthropic.com/en/api/messages (streamed: message_start, content_block_start,
content_block_delta, content_block_stop, message_delta, message_stop); Gemini
https://ai.google.dev/api/generate-content (streamed with ?alt=sse: one GenerateContentResponse per
event, the last with finishReason and usageMetadata).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from gateway import forms
from gateway.mock_answers import (
    DEFAULT_PROVIDER,
    TOOL_TRIGGER,
    ProviderState,
    answer_tokens,
    prompt_of,
    prompt_usage,
)

if TYPE_CHECKING:
    from gateway.mock_provider import MockProvider

EMBEDDING_DIMENSIONS = 8  # default length of a mock embedding (`dimensions` in the request changes it)
MAX_EMBEDDING_DIMENSIONS = 4096  # as the gateway bounds `dimensions`: more is a 400
IMAGE_SIDE = 8  # the mock's images are this many pixels square, whatever size was asked for
MOCK_IMAGE_CREATED = 1_700_000_000


def routes(mock: MockProvider, app: web.Application) -> None:
    for prefix in ("", "/p/{provider}"):
        app.router.add_post(prefix + "/v1/messages", _handler(mock, anthropic_messages))
        app.router.add_post(prefix + "/v1beta/models/{action}", _handler(mock, gemini_generate))
        app.router.add_post(prefix + "/v1/embeddings", _handler(mock, embeddings))
        app.router.add_post(prefix + "/v1/images/generations", _handler(mock, images))
        app.router.add_post(prefix + "/v1/images/edits", _handler(mock, image_edits))
        app.router.add_post(prefix + "/v1/images/variations", _handler(mock, image_variations))


def _handler(mock: MockProvider, serve: Callable[..., Awaitable[web.StreamResponse]]):
    async def handle(request: web.Request) -> web.StreamResponse:
        state = mock.state(request.match_info.get("provider", DEFAULT_PROVIDER))
        state.calls += 1
        auth = request.headers.get("x-api-key") or request.headers.get("x-goog-api-key") or ""
        auth = auth or request.headers.get("Authorization", "")
        raw = await request.read()
        state.note(auth, request.headers.get("x-request-id"), raw)
        try:
            if request.content_type == "multipart/form-data":
                body = form_fields(request.headers["Content-Type"], raw)
            else:
                body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise TypeError
        except (orjson.JSONDecodeError, TypeError, ValueError):
            return web.json_response({"error": {"message": "malformed request body"}}, status=400)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            faults = state.faults
            if faults.stall_ms:
                await asyncio.sleep(faults.stall_ms / 1000)
            if state.should_fail():
                state.errors += 1
                return _fault(serve, faults)
            if faults.slow_ms:
                await asyncio.sleep(faults.slow_ms / 1000)
            return await serve(request, state, body)
        finally:
            state.in_flight -= 1

    return handle


def _fault(serve: Callable, faults) -> web.Response:
    """The fault in the dialect's own error shape."""
    status, message = faults.error_status, faults.error_message
    headers = {"Retry-After": str(faults.retry_after)} if faults.retry_after is not None else None
    if serve is anthropic_messages:
        kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(status)
        kind = kind or ("invalid_request_error" if status < 500 else "api_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
    elif serve is gemini_generate:
        kind = {429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE", 400: "INVALID_ARGUMENT"}.get(status, "INTERNAL")
        body = {"error": {"code": status, "message": message, "status": kind}}
    else:
        kind = "invalid_request_error" if status < 500 else "server_error"
        body = {"error": {"message": message, "type": kind, "code": faults.error_code or str(status)}}
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


# --- reading the dialects back into OpenAI's shape (for the answer and its usage) ----------------


def _data_url(media_type: str, data: str) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}


def openai_from_anthropic(body: dict) -> dict:
    """An Anthropic Messages request as the OpenAI chat request it translates."""
    messages: list[dict] = []
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(block.get("text", "") for block in system if isinstance(block, dict))
    if system:
        messages.append({"role": "system", "content": system})
    for message in body.get("messages") or ():
        content = message.get("content")
        if isinstance(content, str):
            messages.append({"role": message.get("role"), "content": content})
            continue
        parts, calls = [], []
        for block in content or ():
            kind = block.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": block.get("text", "")})
            elif kind == "image" and (block.get("source") or {}).get("type") == "base64":
                parts.append(_data_url(block["source"].get("media_type", ""), block["source"].get("data", "")))
            elif kind == "tool_use":
                arguments = orjson.dumps(block.get("input") or {}).decode()
                calls.append({"id": block.get("id"), "function": {"name": block.get("name"), "arguments": arguments}})
            elif kind == "tool_result":
                messages.append({"role": "tool", "content": _text_of(block.get("content"))})
        if parts or calls:
            entry: dict = {"role": message.get("role"), "content": parts or None}
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
    tools = [
        {"type": "function", "function": {**_described(t), "parameters": t.get("input_schema") or {}}}
        for t in body.get("tools") or ()
    ]
    return {"model": body.get("model"), "messages": messages, **({"tools": tools} if tools else {})}


def openai_from_gemini(model: str, body: dict) -> dict:
    """A Gemini generateContent request as the OpenAI chat request it translates."""
    messages: list[dict] = []
    system = body.get("systemInstruction") or body.get("system_instruction")
    if system:
        messages.append({"role": "system", "content": "".join(p.get("text", "") for p in system.get("parts") or ())})
    for content in body.get("contents") or ():
        role = "assistant" if content.get("role") == "model" else "user"
        parts, calls = [], []
        for part in content.get("parts") or ():
            inline = part.get("inline_data") or part.get("inlineData")
            if "text" in part:
                parts.append({"type": "text", "text": part["text"]})
            elif inline:
                parts.append(_data_url(inline.get("mime_type") or inline.get("mimeType") or "", inline.get("data", "")))
            elif "functionCall" in part or "function_call" in part:
                call = part.get("functionCall") or part.get("function_call")
                arguments = orjson.dumps(call.get("args") or {}).decode()
                calls.append({"function": {"name": call.get("name"), "arguments": arguments}})
            elif "functionResponse" in part or "function_response" in part:
                messages.append({"role": "tool", "content": orjson.dumps(part).decode()})
        if parts or calls:
            entry: dict = {"role": role, "content": parts or None}
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
    tools = [
        {"type": "function", "function": {**_described(d), "parameters": d.get("parameters") or {}}}
        for tool in body.get("tools") or ()
        for d in tool.get("function_declarations") or tool.get("functionDeclarations") or ()
    ]
    return {"model": model, "messages": messages, **({"tools": tools} if tools else {})}


def _described(tool: dict) -> dict:
    return {"name": tool.get("name"), **({"description": tool["description"]} if tool.get("description") else {})}


def _text_of(content) -> str:
    if isinstance(content, list):
        return "".join(block.get("text", "") for block in content if isinstance(block, dict))
    return str(content or "")


def _answer(state: ProviderState, openai_body: dict, max_tokens) -> tuple[list[str], bool, bool, int]:
    """(tokens, cut at max_tokens, calls the first tool, prompt tokens) as the chat endpoint answers."""
    n_tokens, cut = state.faults.tokens, False
    if isinstance(max_tokens, int) and 0 < max_tokens < n_tokens:
        n_tokens, cut = max_tokens, True
    prompt = prompt_of(openai_body["messages"])
    tool = TOOL_TRIGGER in prompt and bool(openai_body.get("tools"))
    tokens = answer_tokens(prompt, n_tokens, refuses=state.faults.refuses, answers=state.faults.answers)
    return tokens, cut, tool, prompt_usage(openai_body)


async def _pace(state: ProviderState, index: int) -> None:
    faults = state.faults
    delay = faults.ttft_ms if index == 0 else faults.tpt_ms
    if delay:
        await asyncio.sleep(delay / 1000)


# --- Anthropic Messages ----------------------------------------------------------------------------


async def anthropic_messages(request: web.Request, state: ProviderState, body: dict) -> web.StreamResponse:
    faults = state.faults
    model = body.get("model") or "mock"
    state.last_model = model
    tokens, cut, tool, prompt = _answer(state, openai_from_anthropic(body), body.get("max_tokens"))
    message_id = "msg_mock_" + hashlib.sha256(orjson.dumps(body)).hexdigest()[:24]
    cache = {
        "cache_creation_input_tokens": faults.cache_creation_tokens,
        "cache_read_input_tokens": faults.cache_read_tokens,
    }
    # Anthropic's input_tokens leave out the cached part of the prompt.
    input_tokens = max(0, prompt - faults.cache_creation_tokens - faults.cache_read_tokens)
    if tool:
        name = (body["tools"][0] or {}).get("name") or "tool"
        blocks = [{"type": "tool_use", "id": "toolu_mock_1", "name": name, "input": {}}]
        tokens, stop_reason, output_tokens = [], "tool_use", 5
    else:
        blocks = [{"type": "text", "text": "".join(tokens)}]
        stop_reason, output_tokens = ("max_tokens" if cut else "end_turn"), len(tokens)
    if not body.get("stream"):
        await _pace(state, 0)
        state.completed += 1
        return web.json_response(
            {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": blocks,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens, **cache},
            },
            dumps=lambda o: orjson.dumps(o).decode(),
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)

    async def event(name: str, data: dict) -> None:
        await response.write(b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n")

    await _pace(state, 0)
    start = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": []}
    start |= {"stop_reason": None, "stop_sequence": None}
    start["usage"] = {"input_tokens": input_tokens, "output_tokens": 1, **cache}
    await event("message_start", {"message": start})
    if tool:
        await event("content_block_start", {"index": 0, "content_block": {**blocks[0], "input": {}}})
        await event("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": "{}"}})
    else:
        await event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        await event("ping", {})
        for i, token in enumerate(tokens):
            if i:
                await _pace(state, i)
            if faults.drop_after is not None and i >= faults.drop_after:
                request.transport.close()  # as a crashed upstream: no closing events
                return response
            await event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": token}})
    await event("content_block_stop", {"index": 0})
    delta = {"stop_reason": stop_reason, "stop_sequence": None}
    await event("message_delta", {"delta": delta, "usage": {"output_tokens": output_tokens}})
    await event("message_stop", {})
    await response.write_eof()
    state.completed += 1
    return response


# --- Gemini generateContent ------------------------------------------------------------------------


async def gemini_generate(request: web.Request, state: ProviderState, body: dict) -> web.StreamResponse:
    faults = state.faults
    model, _, action = request.match_info["action"].partition(":")
    if action == "batchEmbedContents":
        return await gemini_embeddings(state, model, body)
    if action not in ("generateContent", "streamGenerateContent"):
        unknown = {"error": {"code": 404, "message": "unknown action", "status": "NOT_FOUND"}}
        return web.json_response(unknown, status=404)
    state.last_model = model
    config = body.get("generationConfig") or body.get("generation_config") or {}
    tokens, cut, tool, prompt = _answer(
        state, openai_from_gemini(model, body), config.get("maxOutputTokens") or config.get("max_output_tokens")
    )
    response_id = "mock-" + hashlib.sha256(orjson.dumps(body)).hexdigest()[:24]
    finish = "MAX_TOKENS" if cut else "STOP"
    if tool:
        declarations = body["tools"][0].get("function_declarations") or body["tools"][0].get("functionDeclarations")
        parts: list[dict] = [{"functionCall": {"name": (declarations or [{}])[0].get("name") or "tool", "args": {}}}]
        tokens, output_tokens = [], 5
    else:
        parts, output_tokens = [{"text": "".join(tokens)}], len(tokens)
    usage = {"promptTokenCount": prompt, "candidatesTokenCount": output_tokens}
    usage["totalTokenCount"] = prompt + output_tokens
    if faults.cache_read_tokens:
        usage["cachedContentTokenCount"] = faults.cache_read_tokens

    def payload(chunk_parts: list, finish_reason: str | None, with_usage: bool) -> dict:
        candidate: dict = {"content": {"parts": chunk_parts, "role": "model"}, "index": 0}
        if finish_reason:
            candidate["finishReason"] = finish_reason
        answer = {"candidates": [candidate], "modelVersion": model, "responseId": response_id}
        if with_usage:
            answer["usageMetadata"] = usage
        return answer

    if action == "generateContent":
        await _pace(state, 0)
        state.completed += 1
        return web.Response(body=orjson.dumps(payload(parts, finish, True)), content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)

    async def event(data: dict) -> None:
        await response.write(b"data: " + orjson.dumps(data) + b"\r\n\r\n")

    await _pace(state, 0)
    if tool:
        await event(payload(parts, finish, True))
    else:
        for i, token in enumerate(tokens):
            if i:
                await _pace(state, i)
            if faults.drop_after is not None and i >= faults.drop_after:
                request.transport.close()
                return response
            last = i == len(tokens) - 1
            await event(payload([{"text": token}], finish if last else None, last))
        if not tokens:
            await event(payload([{"text": ""}], finish, True))
    await response.write_eof()
    state.completed += 1
    return response


# --- OpenAI embeddings -----------------------------------------------------------------------------


def embedding_of(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    """A deterministic vector for `text`: a test can compute the one an input should get."""
    values, stream = [], hashlib.sha256(text.encode()).digest()
    while len(values) < dimensions:
        values.extend(round((b - 127.5) / 127.5, 6) for b in stream)
        stream = hashlib.sha256(stream).digest()
    return values[:dimensions]


def _embedding_input_texts(value) -> list[str]:
    """OpenAI's four input shapes: a string, strings, a token array, token arrays (as text: the ids)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [" ".join(map(str, value))]
    return [v if isinstance(v, str) else " ".join(map(str, v)) for v in value]


def embedding_usage(value) -> int:
    """Input tokens as OpenAI counts them: with cl100k_base, the embedding models' encoding; a
    token array counts its length."""
    from gateway.limits.tokens import encoding

    if isinstance(value, str):
        value = [value]
    if value and all(isinstance(v, int) for v in value):
        return len(value)
    tokenizer = encoding("cl100k_base")
    return sum(len(v) if isinstance(v, list) else len(tokenizer.encode_ordinary(v)) for v in value)


async def embeddings(request: web.Request, state: ProviderState, body: dict) -> web.StreamResponse:
    try:
        texts = _embedding_input_texts(body["input"])
        dimensions = int(body.get("dimensions") or EMBEDDING_DIMENSIONS)
        if not 1 <= dimensions <= MAX_EMBEDDING_DIMENSIONS:
            raise ValueError
    except (KeyError, TypeError, ValueError):
        return web.json_response({"error": {"message": "bad input", "type": "invalid_request_error"}}, status=400)
    model = body.get("model") or "mock-embedding"
    state.last_model = model
    await _pace(state, 0)
    data = []
    for index, text in enumerate(texts):
        vector = embedding_of(text, dimensions)
        if body.get("encoding_format") == "base64":
            vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = embedding_usage(body["input"])
    state.completed += 1
    return web.json_response(
        {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    )


async def gemini_embeddings(state: ProviderState, model: str, body: dict) -> web.Response:
    """Gemini's batchEmbedContents: one vector per request, as the OpenAI-format endpoint gives it
    for the same text (Gemini reports no token count: litellm counts the input itself)."""
    try:
        texts = ["".join(p.get("text", "") for p in r["content"]["parts"]) for r in body["requests"]]
        dimensions = [int(r.get("outputDimensionality") or EMBEDDING_DIMENSIONS) for r in body["requests"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        return web.json_response(
            {"error": {"code": 400, "message": "bad input", "status": "INVALID_ARGUMENT"}}, status=400
        )
    state.last_model = model
    await _pace(state, 0)
    state.completed += 1
    return web.json_response(
        {"embeddings": [{"values": embedding_of(t, d)} for t, d in zip(texts, dimensions, strict=True)]}
    )


# --- OpenAI image generation ---------------------------------------------------------------------


def image_of(prompt: str, index: int = 0) -> bytes:
    """A small PNG (Pillow's) in a colour from the prompt's digest: the same prompt and index, the same image."""
    from PIL import Image

    red, green, blue = hashlib.sha256(f"{index}:{prompt}".encode()).digest()[:3]
    buffer = io.BytesIO()
    Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), (red, green, blue)).save(buffer, format="PNG")
    return buffer.getvalue()


def form_fields(content_type: str, raw: bytes) -> dict:
    """A multipart/form-data body as {name: value}: text as str, a file as (filename, bytes, media
    type); a name given more than once (`image[]`) as a list, under its name without the brackets."""
    fields: dict = {}
    for part in forms.parts(content_type, raw):
        value = (part.filename, part.content, part.media_type) if part.filename else part.content.decode()
        fields.setdefault(part.name.removesuffix("[]"), []).append(value)
    return {name: values[0] if len(values) == 1 else values for name, values in fields.items()}


def _files(value: object) -> list[tuple]:
    values = value if isinstance(value, list) else [value]
    return [item for item in values if isinstance(item, tuple)]


def _as_int(value: object, default: int) -> int | None:
    if value is None:
        return default
    return int(value) if isinstance(value, str) and value.isdigit() else None


async def image_edits(request: web.Request, state: ProviderState, body: dict) -> web.StreamResponse:
    """OpenAI's images/edits (a multipart form): `n` PNGs made from the prompt and the digest of every
    image and mask sent, so a test knows which images the provider was given."""
    return await _images_from(state, body, kind="edit")


async def image_variations(request: web.Request, state: ProviderState, body: dict) -> web.StreamResponse:
    """OpenAI's images/variations (a multipart form, one image, no prompt)."""
    return await _images_from(state, body, kind="variation")


async def _images_from(state: ProviderState, body: dict, *, kind: str) -> web.StreamResponse:
    images, masks = _files(body.get("image")), _files(body.get("mask"))
    prompt = body.get("prompt") if kind == "edit" else ""
    count = _as_int(body.get("n"), 1)
    if not images or not isinstance(prompt, str) or (kind == "edit" and not prompt) or not count or count > 10:
        return web.json_response({"error": {"message": "bad input", "type": "invalid_request_error"}}, status=400)
    state.last_model = body.get("model") or "mock-image"
    state.last_form = {
        name: [(file[0], hashlib.sha256(file[1]).hexdigest(), file[2]) for file in _files(value)] or value
        for name, value in body.items()
    }
    await _pace(state, 0)
    seed = f"{kind}:{edit_seed(prompt, [file[1] for file in images], [file[1] for file in masks])}"
    data = []
    for index in range(count):
        encoded = base64.b64encode(image_of(seed, index)).decode()
        url = body.get("response_format") == "url"
        data.append({"url": "data:image/png;base64," + encoded} if url else {"b64_json": encoded})
    answer: dict = {"created": MOCK_IMAGE_CREATED, "data": data}
    answer.update({name: body[name] for name in ("size", "quality") if isinstance(body.get(name), str)})
    state.completed += 1
    return web.json_response(answer)


def edit_seed(prompt: str, images: list[bytes], masks: list[bytes]) -> str:
    """What the mock draws an edit or variation from (tests compute the expected images with it)."""
    digests = [hashlib.sha256(content).hexdigest()[:16] for content in (*images, *masks)]
    return f"{prompt}|{len(images)}|{','.join(digests)}"


async def images(request: web.Request, state: ProviderState, body: dict) -> web.StreamResponse:
    """OpenAI's images/generations: `n` PNGs as base64 (b64_json), or as data URLs when
    `response_format` is "url"; `size` and `quality` echoed when asked for, as gpt-image models do,
    and a `revised_prompt` when a `style` is."""
    prompt, count = body.get("prompt"), body.get("n", 1)
    if not isinstance(prompt, str) or not prompt or not isinstance(count, int) or not 1 <= count <= 10:
        return web.json_response({"error": {"message": "bad input", "type": "invalid_request_error"}}, status=400)
    state.last_model = body.get("model") or "mock-image"
    await _pace(state, 0)
    data = []
    for index in range(count):
        encoded = base64.b64encode(image_of(prompt, index)).decode()
        url = body.get("response_format") == "url"
        data.append({"url": "data:image/png;base64," + encoded} if url else {"b64_json": encoded})
    if isinstance(body.get("style"), str):  # as dall-e-3 does, which takes a style: the prompt it drew
        for item in data:
            item["revised_prompt"] = f"{prompt}, in a {body['style']} style"
    answer: dict = {"created": MOCK_IMAGE_CREATED, "data": data}
    answer.update({name: body[name] for name in ("size", "quality") if name in body})
    state.completed += 1
    return web.json_response(answer)
