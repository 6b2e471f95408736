"""POST /v1/chat/completions, top to bottom.

    authenticate → validate → pick the model ("auto": the classifier) → allowlist → route
    → admit (limits, budgets, blocks, breakers, spend caps, a deployment slot: one Redis step)
    → screen input → cache (exact, then semantic) → call the chain (stream or not) → screen output
    → escalate a refusal → respond
    → finish (settle the admission, hand off the ledger) → store the answer in the cache

Each stage is a small function; the view only turns the Reply into an HTTP response. Batch items
come the same way (`queued`), with their key already known and waiting for capacity instead of
being refused.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Protocol

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings

from billing.ledger import LedgerRecord, hand_off
from billing.money import ZERO, Bill, Tokens, bill, format_usd
from billing.prices import UNPRICED, aprice_at
from gateway import metrics, requestlog, sse
from gateway.audience import Audience, audience_of
from gateway.auth import KeyInfo, authenticate, authenticate_digest, ensure_not_blocked
from gateway.cache import engine as cache
from gateway.cache import shadow
from gateway.cache.keys import CacheKey, cache_key
from gateway.cache.replay import REFUSAL, answer_from_response, completion_body, storable, stream_chunks
from gateway.errors import GatewayError, database_required
from gateway.limits import admission
from gateway.limits import tokens as prompt_tokens
from gateway.limits.admission import Ticket
from gateway.schemas import ChatRequest, parse_chat_request
from gateway.screening import engine as screening
from gateway.screening.streaming import screen_stream
from gateway.upstream import autoroute, breakers, load, providers
from gateway.upstream.balancing import balancer
from gateway.upstream.breakers import Attempt
from gateway.upstream.failures import UpstreamError, failure_kind
from gateway.upstream.routing import ModelRoute, Target, available_models, order_for_request, route_for
from gateway.upstream.transport import Event

log = logging.getLogger(__name__)
INTERNAL_ERROR = GatewayError(500, "internal_error", "Sentinel failed to handle this request; it has been logged.")
BATCH_CANCELLED = GatewayError(409, "batch_cancelled", "The batch was cancelled before this request ran.")
MAX_RETRY_WAIT_SECONDS = 5.0  # a longer Retry-After sends the request to the next deployment instead
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
SHED_POLL_SECONDS = 0.025  # how often a request waiting for a deployment slot asks again
QUEUED_RECORDS = uuid.UUID("6f1c2a57-5b0e-4f51-9d3a-1b7c2e8f4a90")  # namespace of batch items' record ids
_background: set[asyncio.Task] = set()


@dataclass(frozen=True)
class Queued:
    """A batch item on the request path: its key known by digest (a batch never holds the secret),
    its request id the item's, and capacity waited for instead of refused. Its ledger record id is
    fixed by the item and the run, so a run repeated after its worker lost the lease (and raced the
    next one to the end) is billed once. `start` is asked right before the request goes upstream
    (False: the batch was cancelled meanwhile, and nothing is sent)."""

    key_digest: str
    request_id: str
    run: int = 0
    start: Callable[[], Awaitable[bool]] | None = field(default=None, compare=False)

    @property
    def record_id(self) -> str:
        return str(uuid.uuid5(QUEUED_RECORDS, f"{self.request_id}/{self.run}"))


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None


@dataclass
class Call:
    """What the pipeline learns about one request as it goes."""

    request_id: str
    started: float = field(default_factory=time.perf_counter)
    queued: Queued | None = None
    key: KeyInfo | None = None
    request: ChatRequest | None = None
    body: dict = field(default_factory=dict)
    model: str = ""  # the alias routed: the one asked for, or what "auto" chose
    route: autoroute.Choice | None = None  # "auto"'s choice and reason
    escalation: ModelRoute | None = None  # the smart model a refusal would be asked again (reserved for)
    policy_alternative: ModelRoute | None = None  # asked after providers' content-policy refusals (reserved for)
    ticket: Ticket | None = None
    attempts: list[Attempt] = field(default_factory=list)  # every provider call, for the breakers
    target: Target | None = None
    fallbacks: int = 0
    ttft_ms: int | None = None
    cache_controls: cache.Controls = field(default_factory=cache.Controls)
    cache_key: CacheKey | None = None
    cache_tier: str = "bypass"
    cache_embedding: object = None
    upstream_seconds: float = 0.0  # waiting on providers (calls, backoff); the rest is the gateway's
    paid: dict[int, Decimal] = field(default_factory=dict)  # provider id → cost, for its daily spend cap
    escalated_from: Target | None = None  # the deployment whose refusal went to the smart model
    screening: screening.Screening | None = None  # what the tenant's safety screening did
    answer_text: str | None = None  # what the client was answered (for a tenant that logs prompts)
    fallback_reasons: list[str] = field(default_factory=list)  # "<deployment>=<why it was passed over>"
    queued_ms: int = 0  # waiting for saturated deployments to recover
    audience: Audience = field(default_factory=Audience)  # the end user and session the app named

    def passed_over(self, target: Target, why: str) -> None:
        self.fallback_reasons.append(f"{target.deployment}={why}")

    def elapsed_ms(self) -> int:
        return int((time.perf_counter() - self.started) * 1000)

    @contextmanager
    def waiting_on(self, target: Target) -> Iterator[None]:
        """Around each provider call: times it and counts its outcome by provider."""
        started = time.perf_counter()
        code = ""
        try:
            yield
        except UpstreamError as error:
            code = error.code
            raise
        except BaseException:
            code = "interrupted"
            raise
        finally:
            self.upstream_seconds += time.perf_counter() - started
            metrics.upstream_attempt(target.provider, code)


def request_id_from(header: str | None) -> str:
    """The client's id when it is a sane token, else a fresh one."""
    if header and REQUEST_ID_PATTERN.match(header):
        return header
    return "req_" + uuid.uuid4().hex


def spawn(coro) -> None:
    """Run follow-up work after the response without letting the task be garbage-collected."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def follow_ups_done() -> None:
    """Wait for the follow-up work spawned so far (cache stores): for callers about to close their
    event loop, such as batch workers."""
    while _background:
        await asyncio.gather(*_background, return_exceptions=True)


# --- the request path --------------------------------------------------------------------------


async def chat_completions(headers, raw_body: bytes, *, queued: Queued | None = None) -> Reply:
    request_id = queued.request_id if queued else request_id_from(headers.get("x-sentinel-request-id"))
    call = Call(request_id=request_id, queued=queued)
    return await answered(call, lambda: _chat_completion(call, headers, raw_body, queued))


async def _chat_completion(call: Call, headers, raw_body: bytes, queued: Queued | None) -> Reply:
    call.key = await identify(headers, queued)
    call.request, call.body = parse_chat_request(raw_body)
    call.cache_controls = cache.controls_from(call.body, headers)
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
    )
    call.cache_tier = "miss"
    call.cache_embedding = found.embedding
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
    return replace(key, escalate_refusals=False, budgets=tuple((*budget[:5], True) for budget in key.budgets))


def remember(call: Call, answer: dict | None, cost: Decimal) -> None:
    """Store a fresh answer for next time, after the response (never errors, refusals, tool calls,
    broken streams, or what the client asked not to store)."""
    if call.cache_key is None or call.cache_controls.no_store or answer is None or not storable(answer):
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
            embedding=call.cache_embedding,
            semantic=semantic,
        )
    )


def authorize_model(key: KeyInfo, model: str) -> None:
    if not key.may_use(model):
        raise GatewayError(
            403,
            "model_not_allowed",
            f"This key is not allowed to use the model '{model}'.",
            param="model",
        )


CALLABLE = frozenset({"closed", "probe", "forced_closed"})
SKIPPED = {
    "capped": ("spend_cap_reached", "the provider's daily spend cap is reached"),
    "full": ("overloaded", "the deployment is at its concurrency limit"),
}


CONTENT_POLICY = "content_policy_violation"


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


async def complete_from_chain(call: Call, chain: list[Target]) -> Reply:
    response, headers = await answer_from_chain(call, chain)
    return Reply(200, headers, orjson.dumps(response))


async def answer_from_chain(call: Call, chain: list[Target]) -> tuple[dict, dict[str, str]]:
    """A non-streamed answer from the chain, screened, escalated if it was a refusal, billed and
    cached: OpenAI's chat completion and the response headers, for the dialect to render."""
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
    await finish(call, ledger_record(call, 200, charged=charged))
    if call.escalated_from is None:  # an escalated answer is not the asked-for model's to cache
        remember(call, answer, charged.cost)
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


class StreamDialect(Protocol):
    """How a relayed stream is written in the client's dialect (chat chunks, Responses events)."""

    def chunk(self, event: Event) -> bytes: ...

    def usage(self, chunk: dict) -> None: ...

    async def end(self, cost: Decimal, answer: dict) -> bytes: ...

    def broken(self, error: GatewayError) -> bytes: ...


class ChatChunks:
    """Chat completions' dialect: the provider's chunks as they came (the fast path's bytes
    untouched). A client that asked for usage gets the request's cost in the final usage chunk too
    (`usage.cost_usd`, the ledger's exact figure as a string: a stream has no header to carry it)."""

    def __init__(self, call: Call) -> None:
        self.wants_usage = bool(call.request.stream_options and call.request.stream_options.include_usage)
        self.usage_chunk: dict | None = None

    def chunk(self, event: Event) -> bytes:
        return event.raw or sse.event(event.data)

    def usage(self, chunk: dict) -> None:
        if self.wants_usage:
            self.usage_chunk = chunk  # sent last, with the cost

    async def end(self, cost: Decimal, answer: dict) -> bytes:
        if self.usage_chunk is None:
            return sse.DONE
        usage = {**self.usage_chunk["usage"], "cost_usd": format_usd(cost)}
        return sse.event({**self.usage_chunk, "usage": usage}) + sse.DONE

    def broken(self, error: GatewayError) -> bytes:
        return sse.event(error.payload())


async def stream_from_chain(call: Call, chain: list[Target], dialect: StreamDialect | None = None) -> Reply:
    first, rest = await call_chain(call, chain, stream=True)
    first, rest = screen_stream(call, first, rest)
    call.ttft_ms = call.elapsed_ms()
    headers = response_headers(call, None)
    headers["content-type"] = "text/event-stream"
    headers["cache-control"] = "no-cache"
    return Reply(200, headers, stream=relay(call, first, rest, dialect or ChatChunks(call)))


async def relay(call: Call, first: Event, rest: AsyncIterator[Event], dialect: StreamDialect) -> AsyncIterator[bytes]:
    """Forward the provider's chunks as SSE in the client's dialect; on a failure after the first
    token, end with an error event (never a silently truncated stream). The ledger record is
    written however it ends, before the dialect's last events."""
    usage: dict = {}
    answer = Answer()
    recorded = False
    try:
        answer.add(first.data)
        yield dialect.chunk(first)
        async for event in rest:
            chunk = event.data
            if chunk.get("usage"):
                usage = chunk["usage"]
                if not chunk.get("choices"):
                    dialect.usage(chunk)
                    continue
            answer.add(chunk)
            yield dialect.chunk(event)
        recorded = True
        record, stored = await stream_completed(call, usage, answer, first.data.get("model", ""))
        yield await dialect.end(Decimal(record.cost_usd), stored)
        remember(call, stored, Decimal(record.cost_usd))
    except UpstreamError as error:
        yield dialect.broken(stream_broke(call, error))
        recorded = True
        await finish(call, await stream_record(call, 502, "stream_interrupted", usage))
    finally:
        if not recorded:
            # The client went away (this task is being cancelled): record what it got, separately.
            spawn(finish_disconnected(call, usage, answer))
        await rest.aclose()


async def stream_completed(call: Call, usage: dict, answer: Answer, model: str) -> tuple[LedgerRecord, dict]:
    """A relayed stream that ended well: its ledger record written, its answer put together to cache."""
    record = await stream_record(call, 200, "", usage)
    stored = answer.stored(usage, model)
    call.answer_text = stored["content"]
    await finish(call, record)
    return record, stored


def stream_broke(call: Call, error: UpstreamError) -> GatewayError:
    """After the first token there is no failing over: the stream ends with this error, and the
    breaker counts the broken stream against the deployment."""
    call.attempts[-1].outcome = "fail"
    return GatewayError(502, "stream_interrupted", f"The provider's stream broke off after it started: {error.message}")


class Answer:
    """A streamed answer put back together, to be cached once the stream completes."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.arguments: list[str] = []  # tool calls' names and arguments as relayed
        self.finish_reason: str | None = None
        self.tool_calls = False

    def add(self, chunk: dict) -> None:
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.parts.append(delta["content"])
            calls = delta.get("tool_calls") or ([delta["function_call"]] if delta.get("function_call") else [])
            for tool_call in calls:
                self.tool_calls = True
                function = (tool_call.get("function") if "function" in tool_call else tool_call) or {}
                self.arguments.extend(v for v in (function.get("name"), function.get("arguments")) if v)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def relayed(self) -> str:
        """All the answer text the client was sent, tool calls included."""
        return "".join(self.parts) + "".join(self.arguments)

    def stored(self, usage: dict, model: str) -> dict:
        return {
            "content": "".join(self.parts),
            "tool_calls": self.tool_calls,
            "finish_reason": self.finish_reason,
            "usage": usage,
            "model": model,
        }


async def finish_disconnected(call: Call, usage: dict, answer: Answer) -> None:
    """A client gone mid-stream is billed for what the provider produced: its own usage when it sent
    one (an explicit zero included), else the prompt as reserved for the deployment that answered
    and the text relayed, both by that deployment's tokenizer where it is public."""
    if not usage:
        model = call.target.litellm_model
        prompt = await prompt_tokens.aprompt_bound(call.body, [model])
        usage = {"prompt_tokens": prompt, "completion_tokens": prompt_tokens.completion_count(model, answer.relayed())}
    await finish(call, await stream_record(call, 499, "client_disconnected", usage))


async def stream_record(call: Call, status: int, error_code: str, usage: dict) -> LedgerRecord:
    return ledger_record(call, status, error_code=error_code, charged=await charge(call, usage))


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


# --- the end of every request ------------------------------------------------------------------


async def finish(call: Call, record: LedgerRecord) -> None:
    """Every authenticated request ends here, once: its record goes to the durable ledger queue and
    its admission settles to what it really used (nothing, if it failed); then the metrics and the
    request log hear of it (one line; the prompt and the answer only if the tenant logs them)."""
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


# --- money and records -------------------------------------------------------------------------


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


def response_headers(call: Call, cost: Decimal | None) -> dict[str, str]:
    headers = {
        "x-sentinel-request-id": call.request_id,
        "x-sentinel-cache": call.cache_tier,
        "x-sentinel-fallbacks": str(call.fallbacks),
        **(call.ticket.headers() if call.ticket else {}),
    }
    if call.fallback_reasons:
        headers["x-sentinel-fallback-reasons"] = ", ".join(call.fallback_reasons)
    if call.queued_ms:
        headers["x-sentinel-queued-ms"] = str(call.queued_ms)
    if call.target is not None:
        headers["x-sentinel-provider"] = call.target.provider
        headers["x-sentinel-deployment"] = call.target.deployment
    if cost is not None:
        headers["x-sentinel-cost-usd"] = format_usd(cost)
    if call.route is not None:
        headers["x-sentinel-route"] = f"{call.route.route}; reason={call.route.reason}"
    if call.escalated_from is not None:
        headers["x-sentinel-escalated"] = f"{call.escalated_from.deployment}->{call.target.deployment}"
    return headers


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
    record = LedgerRecord(
        request_id=call.request_id,
        tenant_id=call.key.tenant_id,
        key_id=call.key.key_id,
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
        cost_usd=format_usd(charged.cost),
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
    )
    if call.queued is not None:
        record.id = call.queued.record_id
    return record


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
