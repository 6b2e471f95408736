"""Provider calls through deployments litellm translates (litellm.acompletion does the whole call),
end to end, with a local listener as the upstream."""

from __future__ import annotations

import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import orjson
import pytest

from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
from tests.conftest import unique
from tests.servers import free_port

ANTHROPIC_MODEL = "anthropic/claude-3-5-haiku-20241022"
ANTHROPIC_ANSWER = {
    "id": "msg_listener",
    "type": "message",
    "role": "assistant",
    "model": "claude-3-5-haiku-20241022",
    "content": [{"type": "text", "text": "hello from the listener"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 5, "output_tokens": 4},
}
OLLAMA_ANSWER = {
    "model": "llama3",
    "created_at": "2026-12-01T00:00:00Z",
    "response": "hello from the listener",
    "done": True,
    "prompt_eval_count": 5,
    "eval_count": 4,
}


class Listener:
    """An HTTP server on 127.0.0.1 that records every request it gets and answers as a provider
    would (Anthropic's messages API, Ollama's generate API), so that a redirected call succeeds as
    it did in the attack."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                listener.requests.append((self.command, self.path, headers, body))
                answer = OLLAMA_ANSWER if "/api/" in self.path else ANTHROPIC_ANSWER
                payload = orjson.dumps(answer)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _record

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.timeout = 5
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def seen(self, text: str) -> bool:
        """Whether `text` appeared anywhere in what this listener received."""
        return any(
            text in path or text in body.decode(errors="replace") or any(text in v for v in headers.values())
            for _, path, headers, body in self.requests
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream():
    listener = Listener()
    yield listener
    listener.close()


def translated_model(litellm_model: str, kind: str, *, api_base: str = "") -> tuple[str, str]:
    """A model alias on a deployment litellm translates; returns (alias, the operator's key)."""
    secret = f"sk-operator-{uuid.uuid4().hex}"
    provider = Provider(name=unique("translated"), kind=kind, api_base=api_base)
    provider.set_api_key(secret)
    provider.save()
    alias = ModelAlias.objects.create(name=unique("translated"))
    deployment = Deployment.objects.create(name=provider.name, provider=provider, litellm_model=litellm_model)
    ChainEntry.objects.create(alias=alias, deployment=deployment)
    return alias.name, secret


def ask(gateway, key: str, body: dict) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body)


def refusal(response: httpx.Response) -> tuple:
    if response.status_code != 400:
        return (response.status_code,)
    error = response.json()["error"]
    return (400, error["type"], error["code"], error["param"], error["message"])


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_parameter_the_provider_lacks_is_the_clients_error(
    stream, gateway, tenant, make_key, upstream, live_db
):
    """litellm refuses an OpenAI parameter a translated provider has no equivalent for; that was a
    500 (its exception carries no HTTP response), and is the client's 400, naming the parameter."""
    alias, _ = translated_model(ANTHROPIC_MODEL, "anthropic", api_base=upstream.url)
    body = {"model": alias, "messages": [{"role": "user", "content": "hi"}], "verbosity": "low", "stream": stream}
    response = ask(gateway, make_key(tenant), body)

    assert refusal(response) == (
        400,
        "invalid_request_error",
        "unsupported_parameter",
        "verbosity",
        "Unsupported parameter: 'verbosity' is not supported with this model.",
    )
    assert upstream.requests == []
