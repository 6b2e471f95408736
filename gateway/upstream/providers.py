"""Calls to upstream deployments. litellm is the provider layer for every provider: for those that
answer in OpenAI's format it builds the request and the fast path relays the answer
(gateway.upstream.transport); for the others litellm.acompletion does the whole call and translation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import litellm

from gateway.schemas import forwarded
from gateway.upstream import transport
from gateway.upstream.failures import UpstreamError, classify
from gateway.upstream.routing import Target
from gateway.upstream.transport import Event
from sentinel import logs

litellm.suppress_debug_info = True
litellm.telemetry = False
litellm.drop_params = False
# litellm logs through handlers of its own, and whole requests at DEBUG: route it through Sentinel's
# (JSON, request id) and hold it at WARNING.
logs.adopt_loggers(logs.LITELLM_LOGGERS)


async def complete(target: Target, body: dict, *, timeout: float, request_id: str) -> dict:
    """A non-streamed completion as an OpenAI response dict."""
    if target.fast is not None:
        return await transport.complete(target.fast, body, timeout=timeout, request_id=request_id)
    args = _arguments(target, body, stream=False, request_id=request_id)
    response = await through_litellm(litellm.acompletion, args, timeout=timeout)
    return _clean(response.model_dump(exclude_none=True))


async def through_litellm(function, args: dict, *, timeout: float):
    """One litellm call (acompletion, aembedding, aimage_generation) bounded by `timeout`; every
    provider failure is classified, none escapes raw."""
    try:
        async with asyncio.timeout(timeout):
            return await function(**args, timeout=timeout)
    except Exception as exc:
        raise classify(exc) from exc


def deployment_arguments(target: Target, *, request_id: str, **call) -> dict:
    """litellm's keywords for one deployment: its settings, then its model and `call`'s own keywords,
    then where and with which key it is called (never from the client's body)."""
    args = dict(target.litellm_params)
    # litellm's own metadata (its logging reads settings from it): the client's OpenAI metadata is replaced.
    args.update(model=target.litellm_model, metadata={"sentinel_request_id": request_id}, **call)
    if target.api_base:
        args["api_base"] = target.api_base
    if target.api_key:
        args["api_key"] = target.api_key
    return args


async def open_stream(
    target: Target, body: dict, *, first_token_timeout: float, timeout: float, request_id: str
) -> tuple[Event, AsyncIterator[Event]]:
    """Start a stream and wait for its first chunk; returns it and the rest.

    Failing here is failing before the first token: the caller may still fail over.
    """
    if target.fast is not None:
        return await transport.open_stream(
            target.fast, body, first_token_timeout=first_token_timeout, timeout=timeout, request_id=request_id
        )
    try:
        async with asyncio.timeout(first_token_timeout):
            response = await litellm.acompletion(
                **_arguments(target, body, stream=True, request_id=request_id), timeout=timeout
            )
            iterator = response.__aiter__()
            first = await iterator.__anext__()
    except StopAsyncIteration:
        raise UpstreamError(502, "provider_empty_stream", "The provider sent an empty stream.", True, False) from None
    except Exception as exc:
        raise classify(exc) from exc

    async def rest() -> AsyncIterator[Event]:
        try:
            async for chunk in iterator:
                yield Event(_clean(chunk.model_dump(exclude_none=True)))
        except Exception as exc:
            raise classify(exc) from exc

    return Event(_clean(first.model_dump(exclude_none=True))), rest()


def _arguments(target: Target, body: dict, *, stream: bool, request_id: str) -> dict:
    """litellm's keywords: OpenAI's parameters from the client's body (the allowlist, so nothing
    the body holds besides can set where or how the call is made), then the deployment's settings."""
    args = forwarded(body)
    args.update(
        deployment_arguments(target, request_id=request_id, messages=body["messages"], stream=stream, num_retries=0)
    )
    if stream:
        args["stream_options"] = {"include_usage": True}
    return args


def _clean(payload: dict) -> dict:
    """Drop what litellm adds to OpenAI's format: its own float `cost` in usage (Sentinel's cost is
    the ledger's Decimal) and empty `provider_specific_fields`."""
    usage = payload.get("usage")
    if isinstance(usage, dict):
        usage.pop("cost", None)
    for choice in payload.get("choices") or ():
        if not choice.get("provider_specific_fields"):
            choice.pop("provider_specific_fields", None)
    return payload
