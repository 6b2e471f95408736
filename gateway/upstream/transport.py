"""The fast path for upstreams that answer in OpenAI's format.

litellm stays in charge of the request: its provider config maps the parameters (o-series and GPT-5
rules included), builds the body, the URL and the authentication headers. What this module skips is
litellm's response machinery (its CPU cost per call and per streamed chunk: docs/decisions.md #3):
an OpenAI-compatible upstream already answers in the shape the client expects, so the bytes are
relayed as they come, parsed only to read usage, content and errors. Failures get the same
verdicts as litellm's exceptions (gateway.upstream.failures; the contract tests hold both paths to that).

Providers whose answers need translation (Anthropic, Bedrock, Gemini, ...) use litellm.acompletion.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway import sse
from gateway.schemas import forwarded
from gateway.upstream.failures import (
    UpstreamError,
    connection_error,
    error_body,
    status_error,
    timeout_error,
    unsupported_parameter,
)

# litellm providers whose chat responses are OpenAI's format byte for byte.
OPENAI_SHAPED_PROVIDERS = frozenset({"openai", "hosted_vllm"})

_sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def http_session() -> aiohttp.ClientSession:
    """One connection pool per event loop, kept for the process's life."""
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
        session = aiohttp.ClientSession(connector=connector, json_serialize=lambda o: orjson.dumps(o).decode())
        _sessions[loop] = session
    return session


@dataclass(frozen=True)
class FastRoute:
    """What litellm resolved once for a deployment: the model as the provider names it, its
    provider config, the URL and the headers."""

    model: str
    config: Any
    url: str
    stream_url: str
    headers: tuple[tuple[str, str], ...]
    supported: frozenset[str]

    @property
    def embeddings_url(self) -> str | None:
        """The provider's embeddings endpoint beside its chat endpoint (OpenAI's layout), if it has one."""
        suffix = "/chat/completions"
        return self.url[: -len(suffix)] + "/embeddings" if self.url.endswith(suffix) else None

    @property
    def images_url(self) -> str | None:
        """The provider's image generation endpoint beside its chat endpoint (OpenAI's layout), if it has one."""
        suffix = "/chat/completions"
        return self.url[: -len(suffix)] + "/images/generations" if self.url.endswith(suffix) else None

    def body(self, client_body: dict, *, stream: bool) -> bytes:
        """The provider's body: OpenAI's parameters from the client's (the allowlist), mapped by
        litellm for this model; the URL and the headers are the deployment's alone."""
        params = forwarded(client_body)
        params["stream"] = stream
        if stream:
            params["stream_options"] = {"include_usage": True}
        mapped = {k: v for k, v in params.items() if k in self.supported}
        extra = {k: v for k, v in params.items() if k not in self.supported}
        optional = self.config.map_openai_params(
            non_default_params=mapped, optional_params={}, model=self.model, drop_params=False
        )
        body = self.config.transform_request(
            model=self.model,
            messages=client_body["messages"],
            optional_params=optional,
            litellm_params={},
            headers={},
        )
        body.update(extra)
        return orjson.dumps(body)


def prepare(litellm_model: str, api_base: str | None, api_key: str | None) -> FastRoute | None:
    """A FastRoute when the deployment's provider answers in OpenAI's format, else None."""
    import litellm
    from litellm.types.utils import LlmProviders
    from litellm.utils import ProviderConfigManager

    try:
        model, provider, _, resolved_base = litellm.get_llm_provider(litellm_model, api_base=api_base)
    except Exception:  # noqa: BLE001 - a model litellm cannot place goes through litellm itself
        return None
    if provider not in OPENAI_SHAPED_PROVIDERS:
        return None
    config = ProviderConfigManager.get_provider_chat_config(model=model, provider=LlmProviders(provider))
    base = resolved_base or api_base or "https://api.openai.com/v1"
    headers = config.validate_environment(
        headers={},
        model=model,
        messages=[],
        optional_params={},
        litellm_params={},
        api_key=api_key,
        api_base=base,
    )

    def url(stream: bool) -> str:
        return config.get_complete_url(
            api_base=base, api_key=api_key, model=model, optional_params={}, litellm_params={}, stream=stream
        )

    return FastRoute(
        model=model,
        config=config,
        url=url(False),
        stream_url=url(True),
        headers=tuple(headers.items()),
        supported=frozenset(config.get_supported_openai_params(model)),
    )


# --- calls -------------------------------------------------------------------------------------

_NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError)


def _network_failure(exc: BaseException) -> UpstreamError:
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return timeout_error()
    return connection_error(str(exc))


async def _http_failure(response: aiohttp.ClientResponse) -> UpstreamError:
    raw = await response.read()
    message, code = error_body(raw)
    return status_error(response.status, message, code, response.headers.get("retry-after"))


def _request_body(route: FastRoute, body: dict, *, stream: bool) -> bytes:
    """The provider's request body. litellm's translation failing on the client's parameters is the
    client's error (a 400 it can fix), not the provider's."""
    try:
        return route.body(body, stream=stream)
    except Exception as exc:
        unsupported = unsupported_parameter(exc)
        if unsupported is not None:
            raise unsupported from exc
        message = f"The request's parameters could not be translated for this model: {exc}"[:500]
        raise UpstreamError(400, "invalid_request", message, False, True) from exc


def _headers(route: FastRoute, request_id: str) -> dict[str, str]:
    """The provider's headers, plus the request id so its logs can be matched with Sentinel's."""
    return {**dict(route.headers), "x-request-id": request_id}


async def complete(route: FastRoute, body: dict, *, timeout: float, request_id: str) -> dict:
    return await _post_json(route, route.url, _request_body(route, body, stream=False), timeout, request_id)


async def embed(route: FastRoute, body: dict, *, timeout: float, request_id: str) -> dict:
    """One embeddings call to an OpenAI-format provider; its answer parsed, nothing else done to it.
    `body` is what the provider gets besides the model (input, dimensions, user)."""
    url = route.embeddings_url
    if url is None:
        raise ValueError("this deployment has no embeddings endpoint beside its chat endpoint")
    return await _post_json(route, url, orjson.dumps({**body, "model": route.model}), timeout, request_id)


async def generate_images(route: FastRoute, body: dict, *, timeout: float, request_id: str) -> dict:
    """One image generation call to an OpenAI-format provider; its answer parsed, nothing else done
    to it. `body` is what the provider gets besides the model (prompt, n, size, ...)."""
    url = route.images_url
    if url is None:
        raise ValueError("this deployment has no image endpoint beside its chat endpoint")
    return await _post_json(route, url, orjson.dumps({**body, "model": route.model}), timeout, request_id)


async def image_form(
    route: FastRoute,
    endpoint: str,
    fields: dict,
    files: list[tuple[str, str, bytes, str]],
    *,
    timeout: float,
    request_id: str,
) -> dict:
    """One image edit or variation (`endpoint` "edits" or "variations") to an OpenAI-format provider,
    as the multipart form OpenAI takes: the model, `fields` as text, `files` as (field, filename,
    content, media type); its answer parsed, nothing else done to it."""
    url = route.images_url
    if url is None:
        raise ValueError("this deployment has no image endpoint beside its chat endpoint")
    form = aiohttp.FormData()
    form.add_field("model", route.model)
    for name, value in fields.items():
        form.add_field(name, str(value))
    for field, filename, content, media_type in files:
        form.add_field(field, content, filename=filename, content_type=media_type)
    # The form sets its own content type (with its boundary).
    headers = {name: value for name, value in _headers(route, request_id).items() if name.lower() != "content-type"}
    return await _post_json(route, url.removesuffix("generations") + endpoint, form, timeout, request_id, headers)


async def _post_json(
    route: FastRoute,
    url: str,
    data: bytes | aiohttp.FormData,
    timeout: float,
    request_id: str,
    headers: dict[str, str] | None = None,
) -> dict:
    """One non-streamed call: the provider's JSON answer, or its failure as an UpstreamError."""
    try:
        async with http_session().post(
            url,
            data=data,
            headers=headers if headers is not None else _headers(route, request_id),
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            if response.status != 200:
                raise await _http_failure(response)
            raw = await response.read()
    except _NETWORK_ERRORS as exc:
        raise _network_failure(exc) from exc
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UpstreamError(502, "provider_bad_response", "The provider's answer is not JSON.", True, False) from None


@dataclass
class Event:
    """One streamed chunk: parsed, and (fast path) the exact bytes to relay, so nothing is re-encoded."""

    data: dict
    raw: bytes | None = None


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[Event]:
    """Split an SSE body into events, up to [DONE]. An error object inside the stream raises."""
    buffer = b""
    async for piece in response.content.iter_any():
        buffer += piece
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            for line in block.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                try:
                    data = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    raise UpstreamError(
                        502, "provider_bad_stream", "The provider sent a malformed chunk.", True, False
                    ) from None
                if "error" in data and not data.get("choices"):
                    message, _ = error_body(payload)
                    raise UpstreamError(502, "provider_stream_error", message, True, False)
                yield Event(data, sse.frame(payload))
    raise UpstreamError(502, "provider_stream_truncated", "The provider's stream ended without [DONE].", True, False)


async def open_stream(
    route: FastRoute, body: dict, *, first_token_timeout: float, timeout: float, request_id: str
) -> tuple[Event, AsyncIterator[Event]]:
    """Start a stream and wait for its first chunk (failing here is failing before the first token).
    `first_token_timeout` bounds the whole wait, connecting included (asyncio.timeout, unlike
    wait_for, costs no extra task)."""
    response = None
    try:
        async with asyncio.timeout(first_token_timeout):
            response = await http_session().post(
                route.stream_url,
                data=_request_body(route, body, stream=True),
                headers=_headers(route, request_id),
                timeout=aiohttp.ClientTimeout(total=timeout),
            )
            if response.status != 200:
                raise await _http_failure(response)
            events = _events(response)
            first = await events.__anext__()
    except StopAsyncIteration:
        response.close()
        raise UpstreamError(502, "provider_empty_stream", "The provider sent an empty stream.", True, False) from None
    except _NETWORK_ERRORS as exc:
        if response is not None:
            response.close()
        raise _network_failure(exc) from exc
    except UpstreamError:
        response.close()
        raise

    async def rest() -> AsyncIterator[Event]:
        try:
            async for event in events:
                yield event
        except _NETWORK_ERRORS as exc:
            raise _network_failure(exc) from exc
        finally:
            response.close()

    return first, rest()
