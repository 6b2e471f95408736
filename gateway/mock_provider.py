"""An OpenAI-compatible upstream for the demo, the tests and the benchmarks (and, through
gateway.mock_dialects, an Anthropic Messages and a Gemini one, and OpenAI embeddings).

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
import hashlib
import time
from dataclasses import asdict

import orjson
from aiohttp import web

from gateway import sse
from gateway.mock_answers import (
    DEFAULT_PROVIDER,
    HARM_MARKER,
    HARM_WORDS,
    MODERATION_CATEGORIES,
    TOOL_TRIGGER,
    Faults,
    ProviderState,
    answer_tokens,
    prompt_of,
    prompt_usage,
)

# Kept importable from here, where tests and benchmarks have always found them.
from gateway.mock_answers import REFUSAL_TEXT as REFUSAL_TEXT
from gateway.mock_answers import answer_text as answer_text


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
        for at in ("", "/p/{provider}"):  # one mock provider, or a virtual one per name
            app.router.add_post(f"{at}/v1/chat/completions", self.chat)
            app.router.add_post(f"{at}/v1/moderations", self.moderations)
            app.router.add_get(f"{at}/v1/models", self.models)
            app.router.add_get(f"{at}/metrics", self.load_metrics)
        from gateway import mock_dialects  # Anthropic, Gemini and embeddings: their own module

        mock_dialects.routes(self, app)
        app.router.add_get("/p/{provider}/api/ps", self.ollama_ps)
        app.router.add_get("/p/{provider}/load", self.queue_depth)
        for at in ("", "/{provider}"):
            app.router.add_get(f"/_control{at}", self.control_get)
            app.router.add_post(f"/_control{at}", self.control_set)
        app.router.add_post("/_reset", self.reset)
        app.router.add_get("/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def load_metrics(self, request: web.Request) -> web.Response:
        """vLLM's load gauges in Prometheus' text format, as a vLLM server exports them: the requests
        in flight plus the load set through /_control (load_running, load_waiting, load_kv_cache)."""
        state = self.state(request.match_info.get("provider", DEFAULT_PROVIDER))
        faults = state.faults
        labels = '{engine="0",model_name="mock"}'
        lines = []
        running = state.in_flight + faults.load_running
        for name, kind, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", faults.load_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", faults.load_kv_cache),
        ):
            lines += [f"# HELP {name} {kind}", f"# TYPE {name} gauge", f"{name}{labels} {float(value)}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")

    async def ollama_ps(self, request: web.Request) -> web.Response:
        """Ollama's GET /api/ps (the models it holds in memory), with load_models models loaded, each
        with load_offloaded of its memory outside VRAM (in system memory, run on the CPU)."""
        faults = self.state(request.match_info["provider"]).faults
        size = 6_591_830_464
        models = [
            {
                "name": f"mock-{i}:latest",
                "model": f"mock-{i}:latest",
                "size": size,
                "digest": hashlib.sha256(str(i).encode()).hexdigest(),
                "details": {"format": "gguf", "family": "mock", "parameter_size": "4.3B"},
                "expires_at": "2099-01-01T00:00:00Z",
                "size_vram": int(size * (1 - faults.load_offloaded)),
                "context_length": 4096,
            }
            for i in range(faults.load_models)
        ]
        return web.json_response({"models": models})

    async def queue_depth(self, request: web.Request) -> web.Response:
        """A generic queue-depth endpoint, as a server or a sidecar may answer one: the requests in
        flight plus load_running, and load_waiting queued (nested, to read by a dotted path)."""
        state = self.state(request.match_info["provider"])
        faults = state.faults
        return web.json_response(
            {"running": state.in_flight + faults.load_running, "queue": {"depth": faults.load_waiting}}
        )

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
        raw = await request.read()
        state.note(request.headers.get("Authorization", ""), request.headers.get("x-request-id"), raw)
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
            tokens = answer_tokens(prompt_of(messages), n_tokens, refuses=faults.refuses, answers=faults.answers)
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
            usage = _token_kinds(usage, faults)
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


def _token_kinds(usage: dict, faults: Faults) -> dict:
    """OpenAI's usage details, when the provider's switches ask for them: cached prompt tokens
    (part of prompt_tokens) and reasoning tokens (added to completion_tokens, of which they are part)."""
    if faults.cache_read_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": min(faults.cache_read_tokens, usage["prompt_tokens"])}
    if faults.reasoning_tokens:
        completion = usage["completion_tokens"] + faults.reasoning_tokens
        usage = {**usage, "completion_tokens": completion, "total_tokens": usage["prompt_tokens"] + completion}
        usage["completion_tokens_details"] = {"reasoning_tokens": faults.reasoning_tokens}
    return usage


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
    from gateway.limits.tokens import warm_up

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
