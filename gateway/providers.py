"""Calls to upstream deployments through litellm, and what their failures mean for the caller.

litellm translates the request for every provider kind, authenticates and maps provider errors to
OpenAI's exception types; this module turns those into UpstreamError with a verdict: is it the
client's fault (give it back), can retrying help, did the provider say when to retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import litellm
import openai

from gateway.routing import Target

litellm.suppress_debug_info = True
litellm.telemetry = False
litellm.drop_params = False

# Fields of the client's body that are ours or that the provider layer sets itself.
_NOT_FORWARDED = frozenset({"model", "messages", "stream", "stream_options", "cache"})


@dataclass
class UpstreamError(Exception):
    status: int
    code: str
    message: str
    retryable: bool  # retrying (this deployment or another) can help
    client_fault: bool  # the request itself is wrong: give it back, count nothing against the provider
    retry_after: float | None = None

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def classify(exc: BaseException) -> UpstreamError:
    """What an exception raised by a provider call means."""
    if isinstance(exc, UpstreamError):
        return exc
    message = str(getattr(exc, "message", None) or exc)[:500]
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, openai.APITimeoutError)):
        return UpstreamError(504, "upstream_timeout", "The provider did not answer in time.", True, False)
    if isinstance(exc, litellm.ContentPolicyViolationError):
        return UpstreamError(400, "content_policy_violation", message, False, True)
    if isinstance(exc, litellm.ContextWindowExceededError):
        return UpstreamError(400, "context_length_exceeded", message, False, True)
    if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
        return UpstreamError(
            502,
            "provider_authentication_failed",
            "The provider rejected Sentinel's credentials for this deployment.",
            False,
            False,
        )
    if isinstance(exc, openai.RateLimitError):
        return UpstreamError(429, "provider_rate_limited", message, True, False, _retry_after(exc))
    if isinstance(exc, (openai.BadRequestError, openai.UnprocessableEntityError)):
        return UpstreamError(400, "invalid_request", message, False, True)
    if isinstance(exc, openai.NotFoundError):
        return UpstreamError(502, "provider_model_not_found", message, False, False)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        return UpstreamError(
            502, f"provider_error_{status}", message, status >= 500 or status == 408, False, _retry_after(exc)
        )
    if isinstance(exc, openai.APIConnectionError):
        return UpstreamError(502, "provider_unreachable", message, True, False)
    return UpstreamError(502, "provider_error", message, True, False)


def _arguments(target: Target, body: dict, *, stream: bool, request_id: str) -> dict:
    args = {k: v for k, v in body.items() if k not in _NOT_FORWARDED}
    args.update(dict(target.litellm_params))
    args.update(
        model=target.litellm_model,
        messages=body["messages"],
        stream=stream,
        num_retries=0,
        metadata={"sentinel_request_id": request_id},
    )
    if target.api_base:
        args["api_base"] = target.api_base
    if target.api_key:
        args["api_key"] = target.api_key
    if stream:
        args["stream_options"] = {"include_usage": True}
    return args


def _clean_usage(payload: dict) -> dict:
    """litellm adds its own float `cost` to usage; Sentinel's cost is the ledger's Decimal."""
    usage = payload.get("usage")
    if isinstance(usage, dict):
        usage.pop("cost", None)
    return payload


async def complete(target: Target, body: dict, *, timeout: float, request_id: str) -> dict:
    """A non-streamed completion as an OpenAI response dict."""
    try:
        response = await asyncio.wait_for(
            litellm.acompletion(
                **_arguments(target, body, stream=False, request_id=request_id), timeout=timeout
            ),
            timeout,
        )
    except Exception as exc:  # every provider failure is classified, none escapes raw
        raise classify(exc) from exc
    return _clean_usage(response.model_dump(exclude_none=True))


async def open_stream(
    target: Target, body: dict, *, first_token_timeout: float, timeout: float, request_id: str
) -> tuple[dict, AsyncIterator[dict]]:
    """Start a stream and wait for its first chunk; returns it and the rest as dicts.

    Failing here is failing before the first token: the caller may still fail over.
    """
    try:
        response = await asyncio.wait_for(
            litellm.acompletion(
                **_arguments(target, body, stream=True, request_id=request_id), timeout=timeout
            ),
            first_token_timeout,
        )
        iterator = response.__aiter__()
        first = await asyncio.wait_for(iterator.__anext__(), first_token_timeout)
    except StopAsyncIteration:
        raise UpstreamError(
            502, "provider_empty_stream", "The provider sent an empty stream.", True, False
        ) from None
    except Exception as exc:
        raise classify(exc) from exc

    async def rest() -> AsyncIterator[dict]:
        try:
            async for chunk in iterator:
                yield _clean_usage(chunk.model_dump(exclude_none=True))
        except Exception as exc:
            raise classify(exc) from exc

    return first.model_dump(exclude_none=True), rest()
