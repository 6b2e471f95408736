"""The request log: one line per finished chat completion, on the logger `gateway.requests` at INFO,
with the request id (sentinel.logs) and the ledger's facts: tenant, key, model, provider, outcome,
tokens, cost and timings. The messages and the answer only for a tenant that turned `log_prompts`
on, only for answered requests, and as screening left them (redacted spans masked)."""

from __future__ import annotations

import logging

from billing.ledger import LedgerRecord

log = logging.getLogger("gateway.requests")


def finished(record: LedgerRecord, *, messages: list | None = None, answer: str = "") -> None:
    """`messages` (and with them `answer`) only for a tenant that logs prompts."""
    if not log.isEnabledFor(logging.INFO):
        return
    content = {"messages": messages, "answer": answer} if messages is not None else {}
    log.info(
        "request finished",
        extra={
            **content,
            "tenant_id": record.tenant_id,
            "key_id": record.key_id,
            "model": record.model_requested,
            "provider": record.provider,
            "deployment": record.deployment,
            "status": record.status_code,
            "code": record.error_code,
            "stream": record.stream,
            "cache": record.cache_tier,
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "cost_usd": record.cost_usd,
            "latency_ms": record.latency_ms,
            "ttft_ms": record.ttft_ms,
            "fallbacks": record.fallbacks,
        },
    )
