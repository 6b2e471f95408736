"""What a failed provider call means for the caller, whichever path made the call.

Every failure becomes an UpstreamError with a verdict: is it the client's fault (give it back and
count nothing against the provider), can retrying help, did the provider say when to retry. litellm's
exceptions go through `classify`; raw HTTP answers of the fast path through `status_error`, which
mirrors litellm's mapping so both paths behave the same.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import orjson


@dataclass
class UpstreamError(Exception):
    status: int
    code: str
    message: str
    retryable: bool  # retrying (this deployment or another) can help
    client_fault: bool  # the request itself is wrong: give it back, count nothing against the provider
    retry_after: float | None = None
    param: str | None = None  # the request field at fault, for the client's error

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


PROVIDER_AUTH_MESSAGE = "The provider rejected Sentinel's credentials for this deployment."


def timeout_error() -> UpstreamError:
    return UpstreamError(504, "upstream_timeout", "The provider did not answer in time.", True, False)


_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|\n\s*File \"")
_PATH = re.compile(r"(?:/[\w.+-]+){2,}\.py\b")


def client_text(text: str) -> str:
    """An exception's text as a client may read it: no traceback, no server paths, one line, bounded
    (litellm puts whole tracebacks into some of its exceptions' messages)."""
    found = _TRACEBACK.search(text)
    if found:
        text = text[: found.start()]
    text = _PATH.sub("<path>", " ".join(text.split()))
    return text[:500] or "The provider's answer could not be read."


def connection_error(detail: str) -> UpstreamError:
    return UpstreamError(502, "provider_unreachable", f"Connection error: {client_text(detail)}"[:500], True, False)


def _parse_retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def status_error(status: int, message: str, code: str = "", retry_after: str | None = None) -> UpstreamError:
    """The verdict for a provider's HTTP error answer."""
    lowered = f"{message} {code}".lower()
    if status == 400 and ("content_policy" in lowered or "content management policy" in lowered):
        return UpstreamError(400, "content_policy_violation", message, False, True)
    if status == 400 and ("context_length_exceeded" in lowered or "maximum context length" in lowered):
        return UpstreamError(400, "context_length_exceeded", message, False, True)
    if status in (401, 403):
        return UpstreamError(502, "provider_authentication_failed", PROVIDER_AUTH_MESSAGE, False, False)
    if status == 429:
        return UpstreamError(429, "provider_rate_limited", message, True, False, _parse_retry_after(retry_after))
    if status in (400, 422):
        return UpstreamError(400, "invalid_request", message, False, True)
    if status == 404:
        return UpstreamError(502, "provider_model_not_found", message, False, False)
    retryable = status >= 500 or status == 408
    return UpstreamError(502, f"provider_error_{status}", message, retryable, False, _parse_retry_after(retry_after))


def error_body(raw: bytes) -> tuple[str, str]:
    """(message, code) from an OpenAI-style error body, tolerating anything else."""
    try:
        error = orjson.loads(raw).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return raw[:500].decode(errors="replace"), ""
    if isinstance(error, dict):
        return str(error.get("message") or "")[:500], str(error.get("code") or "")
    return str(error)[:500], ""


_UNSUPPORTED = re.compile(r"does not support parameters: \[([^\]]*)\]")


def unsupported_parameter(exc: BaseException) -> UpstreamError | None:
    """litellm refusing an OpenAI parameter that the deployment's provider has no equivalent for
    (`verbosity` for Anthropic, ...): the client's to fix, named as OpenAI names it. None for any
    other exception."""
    import litellm

    if not isinstance(exc, litellm.UnsupportedParamsError):
        return None
    found = _UNSUPPORTED.search(str(exc))
    names = re.findall(r"'([^']+)'", found.group(1)) if found else []
    if not names:
        return UpstreamError(400, "unsupported_parameter", "A parameter is not supported with this model.", False, True)
    message = f"Unsupported parameter: '{names[0]}' is not supported with this model."
    return UpstreamError(400, "unsupported_parameter", message, False, True, param=names[0])


def classify(exc: BaseException) -> UpstreamError:
    """The verdict for an exception raised by litellm (or anything else a call raised)."""
    import litellm
    import openai

    if isinstance(exc, UpstreamError):
        return exc
    unsupported = unsupported_parameter(exc)
    if unsupported is not None:
        return unsupported
    if isinstance(exc, litellm.ContentPolicyViolationError):
        return UpstreamError(400, "content_policy_violation", client_text(str(exc)), False, True)
    if isinstance(exc, litellm.ContextWindowExceededError):
        return UpstreamError(400, "context_length_exceeded", client_text(str(exc)), False, True)
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, openai.APITimeoutError)):
        return timeout_error()
    if isinstance(exc, litellm.InternalServerError) and "connection error" in str(exc).lower():
        # litellm reports a connection that never got an answer as a 500 from the provider.
        return connection_error(str(exc))
    if isinstance(exc, openai.APIStatusError):
        headers = getattr(getattr(exc, "response", None), "headers", None) or {}
        message = client_text(str(getattr(exc, "message", None) or exc))
        return status_error(exc.status_code, message, str(getattr(exc, "code", "") or ""), headers.get("retry-after"))
    if isinstance(exc, openai.APIConnectionError):
        return connection_error(str(exc))
    return UpstreamError(502, "provider_error", client_text(str(exc)), True, False)


def failure_kind(error: UpstreamError) -> str:
    """The kind of failure a chain's fallback settings speak of (gateway.models.ModelAlias):
    timeout, rate_limited, context_window, content_policy, server_error (5xx, connection and
    malformed answers), or client (the request's own fault: never failed over)."""
    if error.code == "upstream_timeout":
        return "timeout"
    if error.code == "provider_rate_limited":
        return "rate_limited"
    if error.code == "context_length_exceeded":
        return "context_window"
    if error.code == "content_policy_violation":
        return "content_policy"
    if error.client_fault or not error.retryable:
        return "client"
    return "server_error"
