"""An OpenAI-compatible upstream for the demo, the tests and the benchmarks.

A real HTTP server (aiohttp) that the gateway reaches through litellm exactly as it would reach a real
provider. Answers are deterministic functions of the prompt, so a test can tell which prompt an answer
belongs to (`answer_text`). Several virtual providers share one process: a path prefix
(`/p/<name>/v1/chat/completions`) selects one, and each has its own fault switches and call counters,
changed at run time through `/_control/<name>`.

Run: python -m gateway.mock_provider --port 8100 [--profile zero|realistic]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import io
import math
import re
import time
from dataclasses import asdict, dataclass, field, fields

import orjson
from aiohttp import web

from gateway import sse

DEFAULT_PROVIDER = "default"

# Short common words: each one is a token of the answer, so an answer of N tokens is N words.
_VOCAB = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "amber",
    "basil",
    "cedar",
    "dune",
    "ember",
    "fern",
    "grove",
    "harbor",
    "iris",
    "jade",
    "koala",
    "lotus",
    "maple",
    "nectar",
    "olive",
    "pearl",
    "quartz",
    "river",
    "sage",
    "tulip",
]

# Moderation (/v1/moderations): flags a marker `[[harm:<category>]]` or a word from a small list.
MODERATION_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
HARM_MARKER = re.compile(r"\[\[harm:([a-z/-]+)\]\]")
HARM_WORDS = {"bloodbath": "violence/graphic", "massacre": "violence", "genocide": "hate/threatening"}

REFUSAL_TRIGGER = "[[refuse]]"
TOOL_TRIGGER = "[[tool]]"  # with `tools` in the request: the answer calls the first tool (arguments "{}")
ECHO_TRIGGER = "[[echo]]"  # the answer is the prompt's text after the marker, a word per token
REFUSAL_TEXT = "I'm sorry, but I can't help with that request."


@dataclass
class Faults:
    """Behaviour of one virtual provider. All times in milliseconds."""

    ttft_ms: float = 0.0  # time to the first token (stream) or before the body (non-stream)
    tpt_ms: float = 0.0  # time per further token
    tokens: int = 40  # answer length in tokens (words)
    error_rate: float = 0.0  # share of calls answered with `error_status` (deterministic spacing)
    error_status: int = 503
    error_code: str | None = None  # `error.code` in the error body (default: the status)
    error_message: str = "mock fault"
    retry_after: float | None = None  # seconds, sent with 429/503 errors when set
    stall_ms: float = 0.0  # extra wait before anything is sent (a hung provider)
    slow_ms: float = 0.0  # extra latency added to every answer (a slow but healthy provider)
    drop_after: int | None = None  # stream: close the connection after this many content tokens
    refuses: bool = True  # answer a prompt containing [[refuse]] with a refusal (False: a model that does not)

    def update(self, values: dict) -> None:
        known = {f.name: f.type for f in fields(self)}
        for name, value in values.items():
            if name not in known:
                raise ValueError(f"unknown fault setting: {name}")
            setattr(self, name, value)


@dataclass
class ProviderState:
    faults: Faults = field(default_factory=Faults)
    calls: int = 0
    errors: int = 0
    completed: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    last_model: str | None = None
    last_key_digest: str | None = None
    last_request_id: str | None = None  # the x-request-id header a gateway sent
    last_body: str | None = None  # the last request body received (chat or moderation), as text
    moderation_calls: int = 0
    _error_accumulator: float = 0.0

    def should_fail(self) -> bool:
        """Deterministic error spacing: rate 0.25 fails exactly every 4th call."""
        rate = self.faults.error_rate
        if rate <= 0:
            return False
        if rate >= 1:
            return True
        self._error_accumulator += rate
        if self._error_accumulator >= 1.0:
            self._error_accumulator -= 1.0
            return True
        return False

    def stats(self) -> dict:
        return {
            "calls": self.calls,
            "errors": self.errors,
            "completed": self.completed,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "last_model": self.last_model,
            "last_key_digest": self.last_key_digest,
            "last_request_id": self.last_request_id,
            "last_body": self.last_body,
            "moderation_calls": self.moderation_calls,
            "faults": asdict(self.faults),
        }


def prompt_of(messages: list) -> str:
    """The text the answer is derived from: the last user message's text."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def answer_tokens(prompt: str, n_tokens: int, *, refuses: bool = True) -> list[str]:
    """The answer to `prompt` as a list of tokens; the first names the prompt's digest."""
    digest = hashlib.sha256(prompt.encode()).digest()
    if refuses and REFUSAL_TRIGGER in prompt:
        words = REFUSAL_TEXT.split()
        return [words[0]] + [" " + w for w in words[1:]]
    if ECHO_TRIGGER in prompt:
        return re.findall(r"\s*\S+", prompt.split(ECHO_TRIGGER, 1)[1].strip())[:n_tokens]
    tokens = [f"mock-{digest[:4].hex()}"]
    stream = digest
    while len(tokens) < n_tokens:
        stream = hashlib.sha256(stream).digest()
        tokens.extend(" " + _VOCAB[b % len(_VOCAB)] for b in stream)
    return tokens[:n_tokens]


def answer_text(prompt: str, n_tokens: int = 40, *, refuses: bool = True) -> str:
    """What the mock answers to `prompt` with an answer length of `n_tokens` (default 40)."""
    return "".join(answer_tokens(prompt, n_tokens, refuses=refuses))


# --- prompt usage, as OpenAI bills it --------------------------------------------------------------

# Per image, by model: (base tokens, tokens per 512-px tile) at high detail, from OpenAI's vision guide.
IMAGE_TILE_TOKENS = {"gpt-4o-mini": (2833, 5667), "gpt-4o": (85, 170), "gpt-4.1": (85, 170), "o1": (75, 150)}
DEFAULT_IMAGE_SIZE = (1024, 1024)  # an image only linked to: the mock cannot fetch it


def prompt_usage(body: dict) -> int:
    """Prompt tokens as OpenAI counts them for the model asked for (its tiktoken encoding, o200k_base
    when unknown): per message 3 tokens, its role, its content and its name (plus 1), 3 to prime the
    reply; tools rendered as the TypeScript namespace OpenAI puts in the system prompt; images by
    512-px tiles. So a test of Sentinel's reservations meets a realistic bill, in any script."""
    from gateway.tokens import encoding

    model = str(body.get("model") or "")
    try:
        import tiktoken

        name = tiktoken.encoding_name_for_model(model)
    except KeyError:
        name = "o200k_base"
    tokenizer = encoding(name if name in ("o200k_base", "cl100k_base") else "o200k_base")

    def count(text: str) -> int:
        return len(tokenizer.encode_ordinary(text))

    total = 3
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        total += 3 + count(str(message.get("role") or ""))
        content = message.get("content")
        if isinstance(content, str):
            total += count(content)
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                total += count(part.get("text") or "")
            elif part.get("type") == "image_url":
                total += _image_usage(model, part.get("image_url") or {})
        if message.get("name"):
            total += 1 + count(message["name"])
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            total += 3 + count(function.get("name") or "") + count(function.get("arguments") or "")
    if body.get("tools"):
        total += 9 + count(_tools_namespace(body["tools"]))
    return total


def _image_usage(model: str, image: dict) -> int:
    base, tile = next((v for k, v in IMAGE_TILE_TOKENS.items() if model.startswith(k)), (85, 170))
    if image.get("detail") == "low":
        return base
    width, height = _image_size(str(image.get("url") or ""))
    scale = min(1.0, 2048 / max(width, height))  # fit in 2048 x 2048, then the short side to 768
    width, height = width * scale, height * scale
    scale = min(1.0, 768 / min(width, height))
    return base + tile * math.ceil(width * scale / 512) * math.ceil(height * scale / 512)


def _image_size(url: str) -> tuple[int, int]:
    if not url.startswith("data:") or "," not in url:
        return DEFAULT_IMAGE_SIZE
    from PIL import Image

    try:
        with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as image:
            return image.size
    except (ValueError, OSError):
        return DEFAULT_IMAGE_SIZE


def _tools_namespace(tools: list) -> str:
    """Function tools as OpenAI renders them for the model (as reverse-engineered by the community's
    token counters, e.g. openai-chat-tokens)."""
    lines = ["# Tools", "", "## functions", "", "namespace functions {", ""]
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("description"):
            lines.append(f"// {function['description']}")
        parameters = function.get("parameters") or {}
        if parameters.get("properties"):
            lines += [f"type {function.get('name')} = (_: {{", _ts_properties(parameters, ""), "}) => any;", ""]
        else:
            lines += [f"type {function.get('name')} = () => any;", ""]
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _ts_properties(schema: dict, indent: str) -> str:
    required = set(schema.get("required") or ())
    lines = []
    for name, prop in (schema.get("properties") or {}).items():
        if prop.get("description"):
            lines.append(f"{indent}// {prop['description']}")
        lines.append(f"{indent}{name}{'' if name in required else '?'}: {_ts_type(prop, indent)},")
    return "\n".join(lines)


def _ts_type(prop: dict, indent: str) -> str:
    if "enum" in prop:
        return " | ".join(orjson.dumps(value).decode() for value in prop["enum"])
    kind = prop.get("type")
    if kind == "object" and prop.get("properties"):
        return "{\n" + _ts_properties(prop, indent + "  ") + f"\n{indent}}}"
    if kind == "array":
        return _ts_type(prop.get("items") or {}, indent) + "[]"
    if isinstance(kind, list):
        return " | ".join("number" if k == "integer" else str(k) for k in kind)
    return {"integer": "number", None: "any"}.get(kind, str(kind))


class MockProvider:
    def __init__(self, default_faults: Faults | None = None) -> None:
        self.default_faults = default_faults or Faults()
        self.providers: dict[str, ProviderState] = {}
        self.started = time.time()

    def state(self, name: str) -> ProviderState:
        state = self.providers.get(name)
        if state is None:
            state = ProviderState(faults=Faults(**asdict(self.default_faults)))
            self.providers[name] = state
        return state

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/p/{provider}/v1/chat/completions", self.chat)
        app.router.add_post("/v1/moderations", self.moderations)
        app.router.add_post("/p/{provider}/v1/moderations", self.moderations)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/p/{provider}/v1/models", self.models)
        app.router.add_get("/_control", self.control_get)
        app.router.add_get("/_control/{provider}", self.control_get)
        app.router.add_post("/_control", self.control_set)
        app.router.add_post("/_control/{provider}", self.control_set)
        app.router.add_post("/_reset", self.reset)
        app.router.add_get("/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "mock", "object": "model", "owned_by": "mock"}]})

    async def control_get(self, request: web.Request) -> web.Response:
        name = request.match_info.get("provider", DEFAULT_PROVIDER)
        return web.json_response(self.state(name).stats())

    async def control_set(self, request: web.Request) -> web.Response:
        name = request.match_info.get("provider", DEFAULT_PROVIDER)
        state = self.state(name)
        try:
            values = await request.json()
            if values.pop("reset_counters", False):
                state.calls = state.errors = state.completed = state.max_in_flight = state.moderation_calls = 0
            state.faults.update(values)
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(state.stats())

    async def reset(self, request: web.Request) -> web.Response:
        self.providers.clear()
        return web.json_response({"status": "reset"})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        state = self.state(request.match_info.get("provider", DEFAULT_PROVIDER))
        faults = state.faults
        state.calls += 1
        auth = request.headers.get("Authorization", "")
        state.last_key_digest = hashlib.sha256(auth.encode()).hexdigest()[:16] if auth else None
        state.last_request_id = request.headers.get("x-request-id")
        raw = await request.read()
        state.last_body = raw.decode(errors="replace")
        try:
            body = orjson.loads(raw)
            messages = body["messages"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _error(400, "invalid_request_error", "malformed request body")
        state.last_model = body.get("model")
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            if faults.stall_ms:
                await asyncio.sleep(faults.stall_ms / 1000)
            if state.should_fail():
                state.errors += 1
                headers = {}
                if faults.retry_after is not None:
                    headers["Retry-After"] = str(faults.retry_after)
                return _error(
                    faults.error_status,
                    "invalid_request_error" if faults.error_status < 500 else "server_error",
                    faults.error_message,
                    headers,
                    code=faults.error_code,
                )
            if faults.slow_ms:
                await asyncio.sleep(faults.slow_ms / 1000)
            n_tokens = faults.tokens
            finish_reason = "stop"
            max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
            if isinstance(max_tokens, int) and 0 < max_tokens < n_tokens:
                n_tokens, finish_reason = max_tokens, "length"
            tokens = answer_tokens(prompt_of(messages), n_tokens, refuses=faults.refuses)
            prompt_tokens = prompt_usage(body)
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(tokens),
                "total_tokens": prompt_tokens + len(tokens),
            }
            completion_id = "chatcmpl-mock-" + hashlib.sha256(orjson.dumps(body)).hexdigest()[:24]
            model = body.get("model") or "mock"
            tool_call = None
            tools = body.get("tools")
            if TOOL_TRIGGER in prompt_of(messages) and isinstance(tools, list) and tools:
                name = ((tools[0] or {}).get("function") or {}).get("name") or "tool"
                tool_call = {"id": "call_mock_1", "type": "function", "function": {"name": name, "arguments": "{}"}}
                tokens, finish_reason = [], "tool_calls"
                usage = {**usage, "completion_tokens": 5, "total_tokens": usage["prompt_tokens"] + 5}
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await self._stream(
                    request, state, completion_id, model, tokens, usage, finish_reason, include_usage, tool_call
                )
            if faults.ttft_ms or faults.tpt_ms:
                delay = faults.ttft_ms + faults.tpt_ms * max(0, len(tokens) - 1)
                await asyncio.sleep(delay / 1000)
            state.completed += 1
            return web.Response(
                body=orjson.dumps(
                    {
                        "id": completion_id,
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "message": (
                                    {"role": "assistant", "content": None, "tool_calls": [tool_call]}
                                    if tool_call
                                    else {"role": "assistant", "content": "".join(tokens)}
                                ),
                                "finish_reason": finish_reason,
                            }
                        ],
                        "usage": usage,
                    }
                ),
                content_type="application/json",
            )
        finally:
            state.in_flight -= 1

    async def moderations(self, request: web.Request) -> web.Response:
        """OpenAI's moderation endpoint, deterministic; the provider's fault switches apply (stall,
        error rate, slowness)."""
        state = self.state(request.match_info.get("provider", DEFAULT_PROVIDER))
        faults = state.faults
        state.moderation_calls += 1
        raw = await request.read()
        state.last_body = raw.decode(errors="replace")
        try:
            body = orjson.loads(raw)
            inputs = body["input"]
            inputs = [inputs] if isinstance(inputs, str) else [str(item) for item in inputs]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _error(400, "invalid_request_error", "malformed request body")
        if faults.stall_ms:
            await asyncio.sleep(faults.stall_ms / 1000)
        if state.should_fail():
            state.errors += 1
            return _error(faults.error_status, "server_error", faults.error_message, code=faults.error_code)
        if faults.slow_ms:
            await asyncio.sleep(faults.slow_ms / 1000)
        results = []
        for text in inputs:
            flagged = {m.group(1) for m in HARM_MARKER.finditer(text) if m.group(1) in MODERATION_CATEGORIES}
            lowered = text.lower()
            flagged |= {category for word, category in HARM_WORDS.items() if word in lowered}
            results.append(
                {
                    "flagged": bool(flagged),
                    "categories": {name: name in flagged for name in MODERATION_CATEGORIES},
                    "category_scores": {name: 0.99 if name in flagged else 0.001 for name in MODERATION_CATEGORIES},
                    "category_applied_input_types": {
                        name: ["text"] if name in flagged else [] for name in MODERATION_CATEGORIES
                    },
                }
            )
        model = body.get("model") or "omni-moderation-latest"
        return web.json_response(
            {"id": "modr-mock-" + hashlib.sha256(raw).hexdigest()[:20], "model": model, "results": results}
        )

    async def _stream(
        self,
        request: web.Request,
        state: ProviderState,
        completion_id: str,
        model: str,
        tokens: list[str],
        usage: dict,
        finish_reason: str,
        include_usage: bool,
        tool_call: dict | None = None,
    ) -> web.StreamResponse:
        faults = state.faults
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        created = int(time.time())

        def chunk(delta: dict, finish: str | None = None) -> bytes:
            return sse.chunk(completion_id, created, model, delta, finish)

        if faults.ttft_ms:
            await asyncio.sleep(faults.ttft_ms / 1000)
        await response.write(chunk({"role": "assistant", "content": ""}))
        if tool_call:  # as OpenAI streams one: the call's name first, then its arguments
            function = tool_call["function"]
            head = {**tool_call, "index": 0, "function": {"name": function["name"], "arguments": ""}}
            await response.write(chunk({"tool_calls": [head]}))
            await response.write(
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": function["arguments"]}}]})
            )
        for i, token in enumerate(tokens):
            if i and faults.tpt_ms:
                await asyncio.sleep(faults.tpt_ms / 1000)
            if faults.drop_after is not None and i >= faults.drop_after:
                # Abort the connection without the terminating chunk, as a crashed upstream would.
                request.transport.close()
                return response
            await response.write(chunk({"content": token}))
        await response.write(chunk({}, finish_reason))
        if include_usage:
            await response.write(sse.usage_chunk(completion_id, created, model, usage))
        await response.write(sse.DONE)
        await response.write_eof()
        state.completed += 1
        return response


def _error(status: int, kind: str, message: str, headers: dict | None = None, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": code or str(status)}}
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


PROFILES = {
    "zero": Faults(),
    "realistic": Faults(ttft_ms=120, tpt_ms=8, tokens=40),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="OpenAI-compatible mock provider")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="zero")
    parser.add_argument("--ttft-ms", type=float)
    parser.add_argument("--tpt-ms", type=float)
    parser.add_argument("--tokens", type=int)
    args = parser.parse_args(argv)
    faults = Faults(**asdict(PROFILES[args.profile]))
    from gateway.tokens import warm_up

    warm_up()  # the tokenizers prompt usage is counted with, loaded before the first request
    for name in ("ttft_ms", "tpt_ms", "tokens"):
        value = getattr(args, name)
        if value is not None:
            setattr(faults, name, value)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(
        MockProvider(faults).app(),
        host=args.host,
        port=args.port,
        access_log=None,
        print=lambda *_: print(f"mock provider on http://{args.host}:{args.port}", flush=True),
    )


if __name__ == "__main__":
    main()
