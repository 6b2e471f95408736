"""How every request ends: what it is charged, its ledger record, its admission settled and the record
handed off (finish), and a fresh answer stored in the cache for next time (remember)."""

from __future__ import annotations

import time
from decimal import Decimal

from billing.ledger import LedgerRecord, hand_off
from billing.money import ZERO, Bill, Tokens, bill, format_usd
from billing.prices import UNPRICED, aprice_at
from gateway import metrics, requestlog
from gateway.cache import engine as cache
from gateway.cache.replay import storable
from gateway.call import Call, spawn
from gateway.errors import database_required
from gateway.limits import admission
from gateway.screening import engine as screening
from gateway.upstream.routing import Target


async def finish(call: Call, record: LedgerRecord) -> None:
    """Every authenticated request ends here, once: its record goes to the durable ledger queue and
    its admission settles to what it really used (nothing, if it failed); then the metrics and the
    request log hear of it (one line; the prompt and the answer only if the tenant logs them)."""
    if record.status_code != 200 or record.cache_tier.startswith("hit"):
        # No answer of its own to store (an answer is let go with its store: remember()).
        cache.release(call.cache_key, call.cache_lookup)
    await settle_and_hand_off(call, record)
    metrics.request_finished(
        record,
        tenant=call.key.tenant_slug,
        elapsed_seconds=time.perf_counter() - call.started,
        upstream_seconds=call.upstream_seconds,
    )
    logged = call.key.log_prompts and record.status_code == 200
    # An embeddings request has no messages: its input is not logged.
    messages = call.body.get("messages") if logged else None
    requestlog.finished(record, messages=messages, answer=call.answer_text or "")


async def settle_and_hand_off(call: Call, record: LedgerRecord) -> None:
    """The record to the ledger queue, and the admission settled: what finish() does for a client's
    request, and all a shadow verification does (it is no client request: no request metrics, no
    request log line)."""
    if call.ticket is None:
        await hand_off(record)
    else:
        hit = record.cache_tier.startswith("hit")  # a cache hit consumed no provider tokens
        await admission.settle(
            call.ticket,
            attempts=call.attempts,
            tokens_used=0 if hit else record.prompt_tokens + record.completion_tokens,
            cost=Decimal(record.cost_usd),
            ledger_record=record.encode(),
            paid=call.paid,
        )


async def charge(call: Call, usage: dict) -> Bill:
    """What the deployment that answered used, billed by kind of token (a batch item at batch
    rates), also counted against its provider's daily spend cap (at settle)."""
    charged = await bill_for(call.target, usage, batch=call.queued is not None)
    if charged.cost:
        provider = call.target.provider_id
        call.paid[provider] = call.paid.get(provider, ZERO) + charged.cost
    return charged


async def bill_for(target: Target, usage: dict, *, batch: bool = False) -> Bill:
    """The provider's usage priced at the deployment's prices: its own where it has them, over the
    price table's version in force (billing.prices.PriceOverrides)."""
    overrides = target.price_overrides
    if overrides.complete:
        version = UNPRICED
    else:
        with database_required():
            version = await aprice_at(target.litellm_model)
    priced = overrides.over(version)
    return bill(Tokens.from_usage(usage), priced.rates(batch=batch), priced.id)


def ledger_record(
    call: Call,
    status: int,
    *,
    error_code: str = "",
    usage: dict | None = None,
    charged: Bill | None = None,
    saved: Decimal = ZERO,
) -> LedgerRecord:
    """The request's ledger record: billed (`charged`), or only its `usage` noted at no cost (a
    cache hit's tokens), or neither (a request that used nothing)."""
    charged = charged or Bill(Tokens.from_usage(usage or {}))
    tokens = charged.tokens
    target = call.target
    retrieval = call.retrieval
    record = LedgerRecord(
        request_id=call.request_id,
        tenant_id=call.key.tenant_id,
        key_id=call.key.key_id,
        team_id=call.key.team_id,
        model_requested=call.request.model if call.request else "",
        status_code=status,
        model_served=target.litellm_model if target and status == 200 else "",
        deployment=target.deployment if target else "",
        provider=target.provider if target else ("cache" if call.cache_tier.startswith("hit") else ""),
        stream=bool(call.request and call.request.stream),
        error_code=error_code,
        prompt_tokens=tokens.prompt,
        completion_tokens=tokens.completion,
        cache_read_tokens=tokens.cache_read,
        cache_write_tokens=tokens.cache_write,
        reasoning_tokens=tokens.reasoning,
        cost_usd=format_usd(charged.cost + retrieval.cost if retrieval else charged.cost),
        cache_read_cost_usd=format_usd(charged.cache_read_cost),
        cache_write_cost_usd=format_usd(charged.cache_write_cost),
        reasoning_cost_usd=format_usd(charged.reasoning_cost),
        batch=call.queued is not None,
        price_id=charged.price_id,
        cache_tier=call.cache_tier,
        saved_cost_usd=format_usd(saved),
        latency_ms=call.elapsed_ms(),
        ttft_ms=call.ttft_ms,
        fallbacks=call.fallbacks,
        fallback_reasons=", ".join(call.fallback_reasons)[:500],
        route=call.route.route if call.route else "",
        route_reason=call.route.reason if call.route else "",
        escalated_from=call.escalated_from.deployment if call.escalated_from else "",
        screening=screening.summary(call),
        end_user=call.audience.end_user,
        session_id=call.audience.session,
        retrieval_tokens=retrieval.tokens if retrieval else 0,
        retrieval_cost_usd=format_usd(retrieval.cost) if retrieval else "0",
    )
    if call.queued is not None:
        record.id = call.queued.record_id
    return record


def remember(call: Call, answer: dict | None, cost: Decimal) -> None:
    """Store a fresh answer for next time, after the response (never errors, refusals, tool calls,
    broken streams, or what the client asked not to store)."""
    if call.cache_key is None or call.cache_controls.no_store or answer is None or not storable(answer):
        cache.release(call.cache_key, call.cache_lookup)  # identical requests waiting for it ask themselves
        return
    stored = {k: v for k, v in answer.items() if k != "tool_calls"}
    store_answer(call, stored, cost, semantic=call.key.semantic_cache_enabled)


def store_answer(call: Call, answer: dict, cost: Decimal, *, semantic: bool) -> None:
    """File the answer under call.cache_key, off this task, for the key's cache settings."""
    key = call.key
    spawn(
        cache.store(
            call.cache_key,
            tenant_id=key.tenant_id,
            model=call.model,
            answer=answer,
            cost_usd=cost,
            ttl=call.cache_controls.ttl or key.cache_ttl_seconds,
            max_entries=key.cache_max_entries,
            embedding=call.cache_lookup.embedding,
            semantic=semantic,
            static=call.cache_lookup.static,
            deferred=call.cache_lookup.deferred,
            asked_at=call.received_at,
        )
    )
