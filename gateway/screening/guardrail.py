"""A tenant's own guardrail: an HTTP endpoint that sees each request's text and answers allow, block
or redact.

Request: POST <url>, JSON `{"request_id", "tenant", "stage", "texts": [{"id", "role", "text"}]}` (the
text of every message, after Sentinel's own redactions; `stage` "input"), signed like webhooks:
`X-Sentinel-Timestamp` and `X-Sentinel-Signature: sha256=HMAC-SHA256(secret, "<timestamp>.<body>")`.
Generated images are shown to it too, once made (`stage` "output"): the prompt the provider got, each
revised prompt (role "revised_prompt") and `images`: `[{"index", "url"}]` for an image at a URL,
`[{"index", "format", "bytes", "sha256"}]` for one returned inline (base64 or a data URL).
Answer: `{"action": "allow"}`, `{"action": "block"}`, or
`{"action": "redact", "redactions": [{"id": <text id>, "start": <int>, "end": <int>}]}` (character
offsets into that text). Anything else, an error status, or no answer within the timeout is a
failure, and the tenant's outage setting decides. So is a URL the egress guard refuses (an internal
address, at the time of the call): the request goes through sentinel.egress, which follows no
redirect and caps the answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson

from gateway import metrics
from sentinel import egress
from tenants.webhooks import sign

MAX_ANSWER_BYTES = 256 * 1024  # a verdict, even with a redaction per word of a long prompt


class GuardrailUnavailable(Exception):
    """No usable answer (the reason's kind only: timeout, status, malformed)."""


@dataclass(frozen=True)
class Verdict:
    action: str  # allow | block | redact
    redactions: tuple[tuple[int, int, int], ...] = ()  # (text id, start, end)


def _verdict(raw: bytes, lengths: list[int]) -> Verdict:
    try:
        data = orjson.loads(raw)
        action = data["action"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise GuardrailUnavailable("malformed") from None
    if action in ("allow", "block"):
        return Verdict(action)
    if action != "redact" or not isinstance(data.get("redactions"), list):
        raise GuardrailUnavailable("malformed")
    spans = []
    for item in data["redactions"]:
        try:
            text_id, start, end = int(item["id"]), int(item["start"]), int(item["end"])
        except (KeyError, TypeError, ValueError):
            raise GuardrailUnavailable("malformed") from None
        if not (0 <= text_id < len(lengths) and 0 <= start < end <= lengths[text_id]):
            raise GuardrailUnavailable("malformed")
        spans.append((text_id, start, end))
    return Verdict("redact", tuple(spans))


async def consult(
    *,
    url: str,
    secret: str,
    timeout: float,
    request_id: str,
    tenant: str,
    texts: list[tuple[str, str]],
    stage: str = "input",
    images: list[dict] | None = None,
) -> tuple[Verdict, float]:
    """Ask the guardrail about `texts` ([(role, text)]) and, at the output stage, `images`; returns
    its verdict and how long it took."""
    request = {
        "request_id": request_id,
        "tenant": tenant,
        "stage": stage,
        "texts": [{"id": i, "role": role, "text": text} for i, (role, text) in enumerate(texts)],
    }
    if images is not None:
        request["images"] = images
    body = orjson.dumps(request)
    timestamp = str(int(time.time()))
    headers = {
        "content-type": "application/json",
        "x-sentinel-timestamp": timestamp,
        "x-sentinel-signature": sign(secret, timestamp, body),
        "x-sentinel-request-id": request_id,
    }
    started = time.perf_counter()
    outcome = "ok"
    try:
        reply = await egress.post(url, data=body, headers=headers, timeout=timeout, max_bytes=MAX_ANSWER_BYTES)
        if reply.status != 200:
            outcome = "status"
            raise GuardrailUnavailable(f"status {reply.status}")
        verdict = _verdict(reply.body, [len(text) for _, text in texts])
    except egress.EgressRefused as refused:
        outcome = "refused"
        raise GuardrailUnavailable(f"refused by the egress guard: {refused.reason}") from None
    except TimeoutError:
        outcome = "timeout"
        raise GuardrailUnavailable("timeout") from None
    except GuardrailUnavailable:
        outcome = "malformed" if outcome == "ok" else outcome
        raise
    except Exception as exc:  # noqa: BLE001 - connection refused, a bad URL, ...: all are outages, by policy
        outcome = "error"
        raise GuardrailUnavailable(type(exc).__name__) from None
    finally:
        elapsed = time.perf_counter() - started
        metrics.guardrail_call(outcome, elapsed)
    return verdict, elapsed
