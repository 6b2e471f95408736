"""The provider chain: its deployments tried in order, with retries, breakers, saturation and the
chain's fallback settings (try_chain), and the tenant's content-policy alternative (call_chain)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from django.conf import settings

from gateway.call import Call
from gateway.errors import GatewayError
from gateway.limits import admission
from gateway.upstream import breakers, load, providers
from gateway.upstream.balancing import balancer
from gateway.upstream.breakers import Attempt
from gateway.upstream.failures import UpstreamError, failure_kind
from gateway.upstream.routing import ModelRoute, Target, order_for_request, route_for

log = logging.getLogger(__name__)
MAX_RETRY_WAIT_SECONDS = 5.0  # a longer Retry-After sends the request to the next deployment instead
CALLABLE = frozenset({"closed", "probe", "forced_closed"})
SKIPPED = {
    "capped": ("spend_cap_reached", "the provider's daily spend cap is reached"),
    "full": ("overloaded", "the deployment is at its concurrency limit"),
}
CONTENT_POLICY = "content_policy_violation"


async def policy_alternative_route(call: Call) -> ModelRoute | None:
    """The tenant's model for requests the providers refuse under their content policy, when it names
    one the key may use (reserved for at admission, as escalation is: budgets stay exact)."""
    key = call.key
    alternative = key.content_policy_model
    if not alternative or alternative == call.model or not key.may_use(alternative):
        return None
    try:
        return await route_for(alternative, key.tenant_id)
    except GatewayError:
        log.warning("tenant %s: its content-policy model %r has no route", key.tenant_slug, alternative)
        return None


async def call_chain(call: Call, chain: list[Target], *, stream: bool, complete: Callable | None = None):
    """The chain's answer (try_chain); when its providers refuse the request under their content
    policy, the tenant's alternative model's, if it names one (policy_alternative_route): asked once,
    its chain failing over as usual, the reason `<model>=content_policy` on the record."""
    try:
        return await try_chain(call, chain, stream=stream, complete=complete)
    except GatewayError as refused:
        alternative = call.policy_alternative
        if refused.code != CONTENT_POLICY or alternative is None:
            raise
        call.policy_alternative = None  # once: the alternative's own refusal stands
        call.fallback_reasons.append(f"{call.model}=content_policy")
        tried = {target.deployment_id for target in chain}
        others = [target for target in order_for_request(alternative.targets) if target.deployment_id not in tried]
        if not others:
            raise
        await admission.reserve(call.ticket, others)
        return await try_chain(call, others, stream=stream, complete=complete)


async def try_chain(call: Call, chain: list[Target], *, stream: bool, complete: Callable | None = None):
    """Try the chain in order until a deployment answers; returns what it answered (a response
    dict, or a stream's first event and the rest). `complete` calls a deployment instead of
    providers.complete (embeddings: gateway.embeddings.embed).

    A deployment whose breaker is open is skipped without a call, and so is a saturated self-hosted
    one, unless the tenant queues for it (gateway.upstream.load). What retrying can fix (429, 5xx,
    connection errors) is retried on the same deployment with backoff, honoring Retry-After; a
    timeout is not retried, so a dead provider's timeout is waited out once. Then the chain's
    fallback settings say, by kind of failure, whether the next deployment is tried or the error
    goes back to the client; a prompt over a deployment's context window goes on only to a larger
    one. A 429 or a client's error counts against no breaker. The chain deadline bounds everything;
    streams fail over only before the first token.
    """
    deadline = call.started + settings.CHAIN_DEADLINE_SECONDS
    last_error: UpstreamError | None = None
    states = call.ticket.breaker_states
    saturated = await load.saturated(t.deployment_id for t in chain if t.self_hosted)
    window_exceeded = 0  # the context window a prompt was too long for: only larger ones are tried
    for index, target in enumerate(chain):
        state = states.get(target.deployment_id, "closed")
        if target.max_concurrent is not None and state in CALLABLE and target.deployment_id not in call.ticket.slots:
            # Failing over to a deployment with a concurrency limit: it needs a slot first.
            await admission.reserve(call.ticket, [target])
            state = states.get(target.deployment_id, "closed")
        if state in SKIPPED:
            # Like an open breaker: its provider's spend cap is reached, or it is saturated.
            code, why = SKIPPED[state]
            last_error = last_error or UpstreamError(503, code, f"{target.deployment}: {why}", True, False)
            call.passed_over(target, code)
            continue
        if window_exceeded and target.context_window is not None and target.context_window <= window_exceeded:
            call.passed_over(target, "context_window")
            continue
        if target.deployment_id in saturated and not await wait_while_saturated(call, target, deadline):
            last_error = last_error or UpstreamError(
                503, "deployment_saturated", f"{target.deployment}: saturated", True, False
            )
            call.passed_over(target, "saturated")
            continue
        allowed, probe = await breakers.permit(target, state, local=call.ticket.local)
        if not allowed:
            last_error = last_error or UpstreamError(
                503, "circuit_open", f"{target.deployment}: circuit open", True, False
            )
            call.passed_over(target, "circuit_open")
            continue
        for retry in range(target.max_retries + 1):
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise all_failed(last_error, deadline_hit=True)
            call.target, call.fallbacks = target, index
            started = time.perf_counter()
            try:
                with call.waiting_on(target), balancer.measuring(target):
                    if stream:
                        result = await providers.open_stream(
                            target,
                            call.body,
                            first_token_timeout=min(target.first_token_timeout, remaining),
                            timeout=min(target.timeout, remaining),
                            request_id=call.request_id,
                        )
                    else:
                        result = await (complete or providers.complete)(
                            target, call.body, timeout=min(target.timeout, remaining), request_id=call.request_id
                        )
            except UpstreamError as error:
                kind = failure_kind(error)
                if error.client_fault or not error.retryable:
                    if kind not in target.fallback_on:
                        raise as_client_error(error) from None
                    # Another deployment may take it (a larger window, another provider's policy);
                    # the request's fault, not this deployment's: nothing for its breaker.
                    if kind == "context_window":
                        window_exceeded = max(window_exceeded, target.context_window or 0)
                    last_error = error
                    break
                if kind != "rate_limited" or probe:  # a provider's 429 is its pacing, not its failure
                    call.attempts.append(Attempt(target, "fail", probe))
                last_error = error
                if error.code == "upstream_timeout" and remaining <= (
                    target.first_token_timeout if stream else target.timeout
                ):
                    # This attempt was given what was left of the deadline, and used it up (timers
                    # may fire a hair early, so the clock alone cannot be trusted to say so).
                    raise all_failed(last_error, deadline_hit=True) from None
                if probe or error.code == "upstream_timeout" or retry == target.max_retries:
                    break
                delay = breakers.backoff_seconds(retry, error.retry_after)
                if delay > MAX_RETRY_WAIT_SECONDS or time.perf_counter() + delay >= deadline:
                    break  # asked to wait longer than it is worth: the next deployment
                call.upstream_seconds += delay  # the provider's doing, not the gateway's overhead
                await asyncio.sleep(delay)
                continue
            elapsed = time.perf_counter() - started
            call.attempts.append(Attempt(target, "slow" if elapsed >= target.policy.slow_call_seconds else "ok", probe))
            return result
        assert last_error is not None  # the retries end only on a failure
        kind = failure_kind(last_error)
        if kind not in target.fallback_on:
            raise returned_to_client(last_error)
        call.passed_over(target, kind)
    if last_error is not None and last_error.code == CONTENT_POLICY:
        raise returned_to_client(last_error)  # every provider tried declined it: their answer, not an outage
    raise all_failed(last_error, deadline_hit=time.perf_counter() >= deadline)


async def wait_while_saturated(call: Call, target: Target, deadline: float) -> bool:
    """A saturated self-hosted deployment: True when the request may call it after all. A tenant
    that rejects fast goes on at once; one that queues waits for it to recover, in its bounded
    queue, up to its wait and the chain deadline."""
    if call.key.on_saturation != "queue":
        return False
    wait = min(call.key.saturation_wait_ms / 1000, deadline - time.perf_counter())
    if wait <= 0:
        return False
    started = time.perf_counter()
    try:
        return await load.queue_for(
            target.deployment_id, request_id=call.request_id, limit=target.saturation_queue_limit, wait_seconds=wait
        )
    finally:
        call.queued_ms += int((time.perf_counter() - started) * 1000)


def as_client_error(error: UpstreamError) -> GatewayError:
    """An error retrying cannot fix goes back to the client as it is (and trips nothing)."""
    return GatewayError(error.status, error.code, error.message, param=error.param)


def returned_to_client(error: UpstreamError) -> GatewayError:
    """A failure the chain does not fail over on (its fallback settings), as the provider gave it."""
    headers = {"retry-after": str(math.ceil(error.retry_after))} if error.retry_after is not None else None
    return GatewayError(error.status, error.code, error.message, param=error.param, headers=headers)


def all_failed(last_error: UpstreamError | None, *, deadline_hit: bool = False) -> GatewayError:
    detail = f" Last error: {last_error}." if last_error else ""
    if deadline_hit:
        detail = f" The chain deadline ({settings.CHAIN_DEADLINE_SECONDS:g} s) passed." + detail
    return GatewayError(
        503,
        "all_providers_unavailable",
        "No provider could serve this request." + detail,
        headers={"retry-after": "1"},
    )
