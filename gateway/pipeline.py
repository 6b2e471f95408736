"""POST /v1/chat/completions, top to bottom.

    authenticate → validate → pick the model ("auto": the classifier) → allowlist → route
    → admit (limits, budgets, blocks, breakers, spend caps, a deployment slot: one Redis step)
    → screen input → cache (exact, then semantic) → call the chain (stream or not) → screen output
    → escalate a refusal → respond
    → finish (settle the admission, hand off the ledger) → store the answer in the cache

Each stage is a small function; the view only turns the Reply into an HTTP response. Batch items
come the same way (`queued`), with their key already known and waiting for capacity instead of
being refused.

The stages it calls live beside it: the request's state (gateway/call.py), the provider chain
(gateway/chain.py), the relay of a streamed answer (gateway/relay.py), and how every request ends,
billed, recorded and settled (gateway/settlement.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from decimal import Decimal

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings

from billing.money import ZERO
from gateway import metrics
from gateway.audience import audience_of
from gateway.auth import KeyInfo, authenticate, authenticate_digest, ensure_not_blocked
from gateway.cache import engine as cache
from gateway.cache import shadow
from gateway.cache.keys import cache_key
from gateway.cache.replay import REFUSAL, answer_from_response, completion_body, stream_chunks
from gateway.call import Call, Queued, Reply, both, request_id_from, response_headers, spawn
from gateway.chain import call_chain, policy_alternative_route
from gateway.errors import GatewayError
from gateway.knowledge import grounding
from gateway.limits import admission
from gateway.limits import tokens as prompt_tokens
from gateway.limits.admission import Ticket
from gateway.relay import stream_from_chain
from gateway.schemas import parse_chat_request
from gateway.screening import engine as screening
from gateway.settlement import charge, finish, ledger_record, remember, settle_and_hand_off
from gateway.upstream import autoroute
from gateway.upstream.routing import ModelRoute, Target, available_models, order_for_request, route_for

log = logging.getLogger(__name__)
INTERNAL_ERROR = GatewayError(500, "internal_error", "Sentinel failed to handle this request; it has been logged.")
BATCH_CANCELLED = GatewayError(409, "batch_cancelled", "The batch was cancelled before this request ran.")
SHED_POLL_SECONDS = 0.025  # how often a request waiting for a deployment slot asks again


# --- the request path --------------------------------------------------------------------------


async def chat_completions(headers, raw_body: bytes, *, queued: Queued | None = None) -> Reply:
    request_id = queued.request_id if queued else request_id_from(headers.get("x-sentinel-request-id"))
    call = Call(request_id=request_id, queued=queued)
    return await answered(call, lambda: _chat_completion(call, headers, raw_body, queued))


async def _chat_completion(call: Call, headers, raw_body: bytes, queued: Queued | None) -> Reply:
    call.key = await identify(headers, queued)
    call.request, call.body = parse_chat_request(raw_body)
    call.cache_controls = cache.controls_from(call.body, headers)
    if "file_search" in call.body:  # passages of the tenant's documents, before the prompt is counted
        await grounding.ground(call)
    route, chain = await route_and_admit(call, headers, queued, model_of=pick_model, admit_with=admit)
    await screening.screen_input(call)  # may block, or redact call.body before the cache sees it
    hit = await consult_cache(call, route)
    if hit is not None:
        return await serve_from_cache(call, hit, route)
    if queued is not None and queued.start is not None and not await queued.start():
        raise BATCH_CANCELLED
    if call.request.stream:
        return await stream_from_chain(call, chain)
    return await complete_from_chain(call, chain)


async def answered(
    call: Call, handle: Callable[[], Awaitable[Reply]], error_shape: Callable[[Reply], Reply] = lambda reply: reply
) -> Reply:
    """Run an endpoint's stages for `call`: a refusal answers through error_reply (in the endpoint's
    error shape), as does a bug (logged), and a client that goes away is recorded."""
    try:
        return await handle()
    except GatewayError as error:
        return error_shape(await error_reply(call, error))
    except Exception:
        # A bug must still answer in the endpoint's shape and release what the request held.
        log.exception("request %s failed unexpectedly", call.request_id)
        return error_shape(await error_reply(call, INTERNAL_ERROR))
    except asyncio.CancelledError:
        # The client went away before an answer: release what it held, record it, off this task.
        if call.key is not None:
            spawn(finish(call, ledger_record(call, 499, error_code="client_disconnected")))
        raise


async def list_models(headers) -> Reply:
    """GET /v1/models: the models the key may use."""
    request_id = request_id_from(headers.get("x-sentinel-request-id"))
    try:
        key = await authenticate(headers.get("authorization"), headers.get("x-api-key"))
        await ensure_not_blocked(key)
    except GatewayError as error:
        return Reply(error.status, {"x-sentinel-request-id": request_id, **error.headers}, error.body())
    names = [name for name in await available_models() if key.may_use(name)]
    body = {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "sentinel"} for name in sorted(names)],
    }
    return Reply(200, {"x-sentinel-request-id": request_id}, orjson.dumps(body))


async def identify(headers, queued: Queued | None) -> KeyInfo:
    if queued is not None:
        return await authenticate_digest(queued.key_digest)
    return await authenticate(headers.get("authorization"), headers.get("x-api-key"))


async def route_and_admit(
    call: Call,
    headers,
    queued: Queued | None,
    *,
    model_of: Callable[[Call], str],
    admit_with: Callable[[Call, ModelRoute, list[Target]], Awaitable[Ticket]],
    budget_fallback: bool = True,
) -> tuple[ModelRoute, list[Target]]:
    """Authorize the model, route it and admit the request (call.ticket), for every endpoint. A
    configuration that changed meanwhile drops the caches: the key and the route are read again
    under the new one, three times at most. A tenant's cheaper alias takes the request when a hard
    budget is nearly spent (not for embeddings: `budget_fallback`)."""
    call.audience = audience_of(call.body, headers)
    for _ in range(3):
        call.model = model_of(call)
        authorize_model(call.key, call.model)
        call.fallback_reasons.clear()  # asked again under a new configuration: decided again
        if budget_fallback:
            await cheaper_when_budget_nearly_spent(call)
        route = await route_for(call.model, call.key.tenant_id)
        chain = order_for_request(route.targets)
        try:
            call.ticket = await admit_with(call, route, chain)
            return route, chain
        except admission.StaleConfiguration:
            call.key = await identify(headers, queued)
    raise GatewayError(503, "configuration_changing", "Configuration is changing; retry.", headers={"retry-after": "1"})


def pick_model(call: Call) -> str:
    """The alias to route: the one asked for, or for "auto" the tenant's fast or smart model, as the
    local classifier judges the prompt (its choice and reason go to a header and the ledger)."""
    if call.request.model != autoroute.AUTO_MODEL:
        return call.request.model
    call.route = autoroute.classify(call.body["messages"])
    return call.key.auto_smart_model if call.route.route == autoroute.SMART else call.key.auto_fast_model


async def cheaper_when_budget_nearly_spent(call: Call) -> None:
    """The tenant's cheaper alias instead of the one asked for, when the tenant names one, the key
    may use it, and a hard budget the request counts against is nearly spent. Decided before
    admission, so the reservation is made for the model actually called and budgets stay exact."""
    key = call.key
    cheaper = key.budget_fallback_model
    if not cheaper or cheaper == call.model or not key.may_use(cheaper):
        return
    if await admission.nearly_spent(key, key.budget_fallback_percent) is None:
        return
    try:
        await route_for(cheaper, key.tenant_id)
    except GatewayError:
        log.warning("tenant %s: its budget fallback model %r has no route", key.tenant_slug, cheaper)
        return
    call.fallback_reasons.append(f"{call.model}=budget")
    call.model = cheaper


async def admit(call: Call, route: ModelRoute, chain: list[Target]) -> Ticket:
    tokens, worst_cost = await worst_case(call, route)
    return await admit_at(call, route, chain, tokens=tokens, worst_cost=worst_cost)


async def admit_at(call: Call, route: ModelRoute, chain: list[Target], *, tokens: int, worst_cost: Decimal) -> Ticket:
    """Admit the request at its worst case, asking again while capacity_wait says to wait."""
    waited = 0.0
    while True:
        try:
            return await admission.admit(
                key=call.key,
                model=call.model,
                model_limits=dict(route.limits),
                deployments=chain,
                request_id=call.request_id if call.queued else admission.hold_id(call.request_id),
                tokens=tokens,
                worst_cost=worst_cost,
                lease_seconds=settings.CHAIN_DEADLINE_SECONDS,
                end_user=call.audience.end_user,
                session=call.audience.session,
            )
        except GatewayError as refused:
            pause = capacity_wait(call, refused, waited)
            if pause is None:
                raise
            waited += pause
            await asyncio.sleep(pause)


async def worst_case(call: Call, route: ModelRoute) -> tuple[int, Decimal]:
    """(tokens, USD) the request can at most consume, and so reserves (docs/budgets.md): its prompt
    counted with the tokenizer of every deployment that may serve it, its longest answer, and, when a
    refusal would be asked again of the tenant's smart model, that call's worst case too."""
    request, key = call.request, call.key
    call.escalation = await escalation_route(call)
    call.policy_alternative = await policy_alternative_route(call)
    routes = [route, *(r for r in (call.escalation, call.policy_alternative) if r is not None)]
    models = [target.litellm_model for r in routes for target in r.targets]
    exact = admission.counts_tokens(key, dict(route.limits))
    prompt = await prompt_tokens.aprompt_bound(call.body, models, exact=exact)
    predicted = prompt_tokens.prediction_bound(call.body, models, exact=exact)
    tokens, cost = 0, ZERO
    for r in routes:
        completion = request.max_completion_tokens or request.max_tokens
        if predicted:  # a prediction's rejected tokens are billed as completion tokens on top
            completion = (completion or r.max_output_tokens) + predicted
        more_tokens, more_cost = r.worst_case(prompt, completion, request.n or 1)
        tokens, cost = tokens + more_tokens, cost + more_cost
    return tokens, cost


async def escalation_route(call: Call) -> ModelRoute | None:
    """The tenant's smart model, when a refusal of this request would be asked again of it."""
    key = call.key
    smart = key.auto_smart_model
    if not key.escalate_refusals or call.request.stream or call.model == smart or not key.may_use(smart):
        return None
    try:
        return await route_for(smart, key.tenant_id)
    except GatewayError:
        return None


def capacity_wait(call: Call, refused: GatewayError, waited: float) -> float | None:
    """How long to wait before asking admission again, or None to give up. An interactive request
    waits a bounded moment for a deployment slot, then is shed (503 overloaded): nothing queues in
    the web process. A batch item waits for whatever capacity it needs, as long as Retry-After says."""
    if call.queued is not None:
        if refused.code in ("rate_limit_exceeded", "overloaded"):
            return float(refused.headers.get("retry-after", 1))
        return None
    if refused.code != "overloaded":
        return None
    if waited < settings.SHED_WAIT_MS / 1000:
        return SHED_POLL_SECONDS
    metrics.admission_rejected("overloaded")
    return None


async def consult_cache(call: Call, route: ModelRoute) -> cache.Hit | None:
    """The tenant's cache, unless it is off, the request opted out, or it asks for several choices."""
    key, request = call.key, call.request
    if not key.cache_enabled or (request.n or 1) != 1:
        return None
    call.cache_key = cache_key(
        tenant_id=key.tenant_id, namespace=call.cache_controls.namespace, model_identity=route.identity, body=call.body
    )
    if call.cache_controls.no_cache:
        return None
    found = await cache.lookup(
        call.cache_key,
        tenant_id=key.tenant_id,
        semantic=key.semantic_cache_enabled,
        threshold=key.semantic_threshold,
        # A request whose answer will be stored leads its identical ones in flight (they wait for it).
        lead=None if call.cache_controls.no_store else call.request_id,
    )
    call.cache_tier = "miss"
    call.cache_lookup = found
    return found.hit


async def serve_from_cache(call: Call, hit: cache.Hit, route: ModelRoute) -> Reply:
    """A hit: the stored answer at zero upstream cost (replayed as a stream if one was asked for).
    A sampled share of semantic hits is asked of the provider too, once the client's request is
    done (verify_in_shadow)."""
    headers = await record_hit(call, hit)
    if hit.tier == "hit-semantic" and call.queued is None and shadow.sampled(call.key.shadow_share):
        spawn(verify_in_shadow(call, hit, route))
    if call.request.stream:
        headers["content-type"] = "text/event-stream"
        headers["cache-control"] = "no-cache"
        include_usage = bool(call.request.stream_options and call.request.stream_options.include_usage)
        return Reply(200, headers, stream=stream_chunks(hit.answer, include_usage=include_usage))
    return Reply(200, headers, completion_body(hit.answer))


async def record_hit(call: Call, hit: cache.Hit) -> dict[str, str]:
    """What a hit is, whichever dialect it is answered in: recorded with its tier and what it saved,
    at zero upstream cost. Returns the response headers."""
    call.cache_tier = hit.tier
    cache.note_hit(hit.entry_id)
    headers = response_headers(call, ZERO)
    headers["x-sentinel-provider"] = "cache"
    if hit.similarity is not None:
        headers["x-sentinel-cache-similarity"] = f"{hit.similarity:.4f}"
    usage = hit.answer.get("usage") or {}
    call.answer_text = hit.answer.get("content")
    await finish(call, ledger_record(call, 200, usage=usage, saved=hit.cost_usd))
    return headers


async def verify_in_shadow(served: Call, hit: cache.Hit, route: ModelRoute) -> None:
    """Ask the provider what the semantic hit `served` was answered from the cache, and compare
    (gateway/cache/shadow.py). It runs in this process after the client's request has finished: the
    prompt, the cached answer and the embedder are here, nothing waits on it, and a shadow call is as
    durable as the request it checks (its ledger record is handed off before the comparison).

    The call takes the hit's route (the alias the key was allowed, resolved by Sentinel; the chain in
    its own order), is admitted like any request (limits, slots) with every budget as a hard one (a
    soft budget lets clients past its limit; verification never goes there): refused, it is counted
    as skipped and nothing is sent. It is billed, with the hit's request id and the tier `shadow`."""
    key = shadow_key(served.key)
    body = {name: value for name, value in served.body.items() if name not in ("stream", "stream_options")}
    request = served.request.model_copy(update={"stream": False, "stream_options": None})
    call = Call(request_id=served.request_id, key=key, request=request, body=body, model=served.model)
    call.cache_tier = "shadow"
    check = {
        "tenant_id": key.tenant_id,
        "request_id": served.request_id,
        "entry_id": hit.entry_id,
        "prompt_similarity": hit.similarity or 0.0,
    }
    try:
        chain = order_for_request(route.targets)
        try:
            for _ in range(3):
                try:
                    call.ticket = await admit(call, route, chain)
                    break
                except admission.StaleConfiguration:  # the key's settings changed: read them again
                    call.key = shadow_key(await authenticate_digest(key.digest))
            else:
                raise GatewayError(503, "configuration_changing", "Configuration is changing.")
        except GatewayError as refused:
            await sync_to_async(shadow.check_record)(**check, outcome=shadow.Outcome.SKIPPED, reason=refused.code)
            return
        try:
            response = await call_chain(call, chain, stream=False)
        except GatewayError as error:
            await settle_and_hand_off(call, ledger_record(call, error.status, error_code=error.code))
            await sync_to_async(shadow.check_record)(**check, outcome=shadow.Outcome.FAILED, reason=error.code)
            return
        charged = await charge(call, response.get("usage") or {})
        await settle_and_hand_off(call, ledger_record(call, 200, charged=charged))
        if is_refusal(response):  # no answer to compare with: the provider's mood, not the cache's error
            await sync_to_async(shadow.check_record)(**check, outcome=shadow.Outcome.FAILED, reason="refusal")
            return
        fresh = (answer_from_response(response) or {}).get("content")
        compared = await shadow.compare(hit.answer.get("content") or "", fresh, embed_many=cache.embed_many)
        await sync_to_async(shadow.check_record)(
            **check, outcome=compared.outcome, answer_similarity=compared.similarity, reason=compared.reason
        )
    except Exception:
        log.exception("shadow verification of %s failed", served.request_id)


def shadow_key(key: KeyInfo) -> KeyInfo:
    """The key as a shadow call uses it: one call (a refusal is not escalated), every budget hard."""
    return replace(
        key, escalate_refusals=False, budgets=tuple((*budget[:5], True, *budget[6:]) for budget in key.budgets)
    )


def authorize_model(key: KeyInfo, model: str) -> None:
    if key.team_allowed_models is not None and model not in key.team_allowed_models:
        raise GatewayError(
            403,
            "model_not_allowed",
            f"This key's team '{key.team_name}' is not allowed to use the model '{model}'.",
            param="model",
        )
    if not key.may_use(model):
        raise GatewayError(
            403,
            "model_not_allowed",
            f"This key is not allowed to use the model '{model}'.",
            param="model",
        )


async def complete_from_chain(call: Call, chain: list[Target]) -> Reply:
    response, headers = await answer_from_chain(call, chain)
    return Reply(200, headers, orjson.dumps(response))


async def answer_from_chain(
    call: Call, chain: list[Target], *, alongside: Callable[[dict], Awaitable[None]] | None = None
) -> tuple[dict, dict[str, str]]:
    """A non-streamed answer from the chain, screened, escalated if it was a refusal, billed and
    cached: OpenAI's chat completion and the response headers, for the dialect to render.

    `alongside(response)` is what the dialect does with the final answer before the client may have
    it (the Responses API stores it): it runs while the ledger is handed off, so its round trip to
    PostgreSQL and the hand-off's to Redis overlap, and it is done when this returns."""
    response = await call_chain(call, chain, stream=False)
    await screening.screen_response(call, response)
    charged = await charge(call, response.get("usage") or {})
    if call.key.escalate_refusals and is_refusal(response):
        escalated = await escalate(call)
        if escalated is not None:
            # The refused answer was paid for too: the record bills both calls.
            response = escalated
            await screening.screen_response(call, response)
            charged += await charge(call, escalated.get("usage") or {})
    headers = response_headers(call, charged.cost)
    answer = answer_from_response(response)
    call.answer_text = (answer or {}).get("content")
    finished = finish(call, ledger_record(call, 200, charged=charged))
    await (both(finished, alongside(response)) if alongside is not None else finished)
    if call.escalated_from is None:  # an escalated answer is not the asked-for model's to cache
        remember(call, answer, charged.cost)
    else:
        cache.release(call.cache_key, call.cache_lookup)
    return response, headers


def is_refusal(response: dict) -> bool:
    choices = response.get("choices") or []
    message = (choices[0].get("message") or {}) if choices else {}
    content = message.get("content")
    return bool(message.get("refusal")) or (isinstance(content, str) and bool(REFUSAL.match(content)))


async def escalate(call: Call) -> dict | None:
    """A model refused or apologized instead of answering: ask the tenant's smart model once (its
    chain, failing over as usual, without the deployment that refused). None when there is nothing
    stronger to ask (the smart model refused, or the key may not use it) or it failed too: then the
    refusal stands. Non-streamed answers only: a stream's first tokens are the client's already."""
    route = call.escalation  # found, and its worst case reserved, at admission
    if route is None:
        return None
    refused, fallbacks = call.target, call.fallbacks
    chain = [target for target in order_for_request(route.targets) if target.deployment_id != refused.deployment_id]
    if not chain:
        return None
    await admission.reserve(call.ticket, chain)
    try:
        response = await call_chain(call, chain, stream=False)
    except GatewayError:
        call.target, call.fallbacks = refused, fallbacks
        return None
    call.escalated_from = refused
    return response


async def error_reply(call: Call, error: GatewayError) -> Reply:
    if call.key is not None and call.ticket is None and error.status in (400, 403, 404):
        # Refused before admission, which is where blocks are checked: a revoked key or suspended
        # tenant must hear that, not about its request's mistakes.
        try:
            await ensure_not_blocked(call.key)
        except GatewayError as blocked:
            error = blocked
    headers = {"x-sentinel-request-id": call.request_id, **error.headers}
    if call.ticket is not None:
        headers = {**call.ticket.headers(), **headers}
    if call.key is not None:
        # Authenticated requests are billed records even when refused (at zero cost).
        await finish(call, ledger_record(call, error.status, error_code=error.code))
    else:
        metrics.request_refused(error.status, error.code)
    return Reply(error.status, headers, error.body())
