"""Admission control: every rate limit and budget that applies to a request, checked and taken in one
atomic Redis step (admission.lua), and settled to what really happened after the call (settle.lua).

Rate limits are sliding logs (exact: a key limited to 100 requests a minute gets exactly 100 in any
60 s, across every gateway process, with no doubling at window boundaries). Budgets reserve the
request's worst-case cost at admission and settle to the real cost afterwards, so concurrency cannot
overspend them. The bound (docs/budgets.md): while Redis answers, settled spend stays within a hard
budget as long as each reservation is at least what its request is billed (gateway.limits.tokens counts
prompts with the model's tokenizer, or with a documented margin where that is not public); a request
that outlives its lease, or whose settlement Redis never receives, can overspend it by at most its own
worst case. Holds go by a name Sentinel makes unique (hold_id), never by one a client chose.

When Redis cannot be reached, or does not answer within SENTINEL_REDIS_TIMEOUT_MS
(sentinel.redis_clients), each tenant's setting decides: admit and count in this process only (fail
open, the default), or refuse with 503 (fail closed). The first request after Redis answers again is
admitted through it, and the admission steps given up on meanwhile are voided (void.lua).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings

from billing import ledger
from billing.money import quantize_cost
from gateway import metrics
from gateway.auth import KeyInfo, block_markers
from gateway.errors import GatewayError, database_required
from gateway.lua import scripts
from gateway.upstream import breakers
from gateway.upstream.breakers import Attempt
from sentinel import redis_keys
from sentinel.localstate import GENERATION_KEY, current_generation, from_database, observe_generation
from sentinel.redis_clients import UNREACHABLE, NotWaiting, checking_allowed, is_cluster
from tenants.periods import period_bounds

if TYPE_CHECKING:
    from gateway.upstream.routing import Target

log = logging.getLogger(__name__)

WINDOW_MS = settings.RATE_WINDOW_SECONDS * 1000
UNITS_PER_USD = 10**10  # Redis counts money in integer units of 1e-10 USD (the ledger's precision)
LEASE_MARGIN_MS = 30_000
SPEND_TTL_SECONDS = 2 * 86400  # a provider's spend counter outlives its UTC day


def to_units(amount: Decimal) -> int:
    return int(quantize_cost(amount) * UNITS_PER_USD)


def from_units(units: int) -> Decimal:
    return quantize_cost(Decimal(units) / UNITS_PER_USD)


# --- what applies to a request -----------------------------------------------------------------


@dataclass(frozen=True)
class Limit:
    policy: str  # name in the RateLimit headers: key-rpm, tenant-tpm, model-concurrency, ...
    kind: str  # rpm | tpm | concurrency
    limit: int
    keys: tuple[str, ...]  # the Redis log (and running sum, for tpm)
    tag: str = ""  # the keys' hash tag: the tenant's (key and tenant limits) or the model's

    @property
    def shared(self) -> bool:
        """A model's limit, counted across tenants (on a cluster, in the model's slot)."""
        return self.policy.startswith("model-")

    @property
    def script_kind(self) -> str:
        return {"rpm": "r", "tpm": "t", "concurrency": "c"}[self.kind]


@dataclass(frozen=True)
class BudgetHold:
    budget_id: int | None  # None: an end user's or session's limit (tenants.EndUserLimit)
    tenant_id: int
    key_id: int | None
    team_id: int | None
    limit_units: int  # cost units, or tokens for a token cap
    alert_units: int | None
    hard: bool
    period_start: date
    period_end: datetime
    keys: tuple[str, str, str]  # spent, reservations log, reserved sum
    period: str = ""  # daily | monthly
    tokens: bool = False  # a token cap: counts prompt and completion tokens, not money
    scope: str = ""  # end_user | session, for an end user's or session's limit
    subject: str = ""  # ... the end user or session, as the client named it

    def reserves(self, ticket: Ticket) -> int:
        return ticket.tokens if self.tokens else ticket.cost_units

    @property
    def policy(self) -> str:
        """Its name in errors and RateLimit headers: end-user-daily-budget, session-monthly-tokens, ..."""
        return f"{self.scope.replace('_', '-')}-{self.period}-{'tokens' if self.tokens else 'budget'}"


def limits_for(key: KeyInfo, model: str, model_limits: dict[str, int]) -> list[Limit]:
    tenant = redis_keys.tenant_tag(key.tenant_id)
    # The tenant's (its keys', teams' and own) first, the model's last (a cluster's admission relies on
    # the order): a team's logs carry the tenant's tag, so they are taken in the tenant's step.
    scopes = (
        ("key", f"key:{key.key_id}", dict(key.key_limits), tenant),
        ("team", f"team:{key.team_id}", dict(key.team_limits), tenant),
        ("tenant", f"tenant:{key.tenant_id}", dict(key.tenant_limits), tenant),
        ("model", f"model:{model}", model_limits, redis_keys.model_tag(model)),
    )
    limits = []
    for scope, ident, values, tag in scopes:
        for kind in ("rpm", "tpm", "concurrency"):
            if kind in values:
                base = redis_keys.rate_log(ident, kind, tag=tag)
                keys = (base, base + ":sum") if kind == "tpm" else (base,)
                limits.append(Limit(f"{scope}-{kind}", kind, values[kind], keys, tag))
    return limits


def counts_tokens(key: KeyInfo, model_limits: dict[str, int]) -> bool:
    """Whether a request's exact token count can change what admission decides: a hard budget
    (through its cost) or a tokens-per-minute limit applies. Otherwise a cheap bound serves."""
    limits = (dict(key.key_limits), dict(key.team_limits), dict(key.tenant_limits), model_limits)
    hard_budget = bool(key.end_user_limits) or any(budget[5] for budget in key.budgets)
    return hard_budget or any("tpm" in scope for scope in limits)


def budgets_for(key: KeyInfo, now: datetime) -> list[BudgetHold]:
    holds = []
    for budget_id, key_id, period, limit_usd, alert_percent, hard, team_id in key.budgets:
        start, end = period_bounds(period, now)
        limit = to_units(Decimal(limit_usd))
        base = redis_keys.budget_period(budget_id, start, tenant_id=key.tenant_id)
        holds.append(
            BudgetHold(
                budget_id=budget_id,
                tenant_id=key.tenant_id,
                key_id=key_id,
                team_id=team_id,
                limit_units=limit,
                alert_units=limit * alert_percent // 100 if alert_percent else None,
                hard=hard,
                period_start=start,
                period_end=end,
                keys=(base + ":spent", base + ":res", base + ":res:sum"),
                period=period,
            )
        )
    return holds


def audience_holds(key: KeyInfo, now: datetime, *, end_user: str, session: str) -> list[BudgetHold]:
    """The key's end-user limits that apply to the end user and session a request names (none for
    what it does not name): the same limits for every end user, the unknown ones included, whose
    counters start from the ledger at their first request (admission.lua's init)."""
    holds = []
    for limit_id, key_id, scope, period, limit_usd, token_cap in key.end_user_limits:
        subject = end_user if scope == "end_user" else session
        if not subject:
            continue
        start, end = period_bounds(period, now)
        for tokens, limit in ((False, limit_usd), (True, token_cap)):
            if limit is None:
                continue
            base = redis_keys.audience_period(
                limit_id, subject, period, start, "tok" if tokens else "usd", tenant_id=key.tenant_id
            )
            holds.append(
                BudgetHold(
                    budget_id=None,
                    tenant_id=key.tenant_id,
                    key_id=key_id,
                    team_id=None,
                    limit_units=int(limit) if tokens else to_units(Decimal(limit)),
                    alert_units=None,
                    hard=True,
                    period_start=start,
                    period_end=end,
                    keys=(base + ":spent", base + ":res", base + ":res:sum"),
                    period=period,
                    tokens=tokens,
                    scope=scope,
                    subject=subject,
                )
            )
    return holds


def provider_spend_key(provider_id: int, day: date) -> str:
    """A provider's spend on one UTC day, in units (settled requests add to it)."""
    return redis_keys.provider_spend(provider_id, day)


def in_flight_key(deployment_id: int) -> str:
    """The requests holding one of a deployment's concurrency slots (scored by lease end)."""
    return redis_keys.deployment_slots(deployment_id)


def _deployment_keys_and_args(targets, day: date) -> tuple[list[str], list]:
    """What deployments.lua reads of each deployment: only what is configured costs a key."""
    keys, args = [], []
    for target in targets:
        keys.append(breakers.keys_for(target.deployment_id)[0])
        if target.spend_cap is not None:
            keys.append(provider_spend_key(target.provider_id, day))
        if target.max_concurrent is not None:
            keys.append(in_flight_key(target.deployment_id))
        args.extend(
            (
                "" if target.spend_cap is None else to_units(target.spend_cap),
                "" if target.max_concurrent is None else target.max_concurrent,
            )
        )
    return keys, args


def provider_spend_today(provider_id: int) -> Decimal | None:
    """What the provider was paid today (UTC) as Redis counts it, for the admin; None if unreachable."""
    from sentinel.redis_clients import sync_redis

    try:
        units = sync_redis().get(provider_spend_key(provider_id, datetime.now(UTC).date()))
    except UNREACHABLE:
        return None
    return from_units(int(units or 0))


def deployment_in_flight(deployment_id: int) -> int | None:
    """Requests holding one of the deployment's concurrency slots now, for the admin."""
    from sentinel.redis_clients import sync_redis

    try:
        return sync_redis().zcount(in_flight_key(deployment_id), int(time.time() * 1000), "+inf")
    except UNREACHABLE:
        return None


# --- the ticket an admitted request holds ------------------------------------------------------


def hold_id(request_id: str) -> str:
    """The name an interactive request's holds go by in Redis: its id, made unique. Clients may name
    their requests (x-sentinel-request-id) and repeat a name: requests sharing one would share one
    place in every rate limit and one budget reservation. (A batch item keeps its own id, which
    Sentinel makes, so a run repeated after its worker died is counted once.)"""
    return f"{request_id}/{uuid.uuid4().hex[:16]}"


@dataclass
class Ticket:
    request_id: str  # its holds' name in Redis (hold_id)
    tokens: int
    cost_units: int
    limits: list[Limit]
    budgets: list[BudgetHold]
    used: list[int] = field(default_factory=list)
    resets_ms: list[int] = field(default_factory=list)
    # deployment id → state at admission: a breaker state, or capped (its provider's daily spend cap is
    # reached) or full (no concurrency slot free)
    breaker_states: dict[int, str] = field(default_factory=dict)
    slots: dict[int, str] = field(default_factory=dict)  # deployment id → in-flight log holding this request
    local: bool = False  # counted in this process only (Redis unreachable, failing open)
    tenant_id: int = 0
    settled: bool = False
    step: str = field(default_factory=lambda: uuid.uuid4().hex)  # names its admission step, for void.lua

    def headers(self) -> dict[str, str]:
        return ratelimit_headers(self.limits, self.used, self.resets_ms, self.tokens, admitted=True)


def ratelimit_headers(
    limits: list[Limit], used: list[int], resets_ms: list[int], tokens: int, *, admitted: bool
) -> dict[str, str]:
    """RateLimit-Policy and RateLimit as in draft-ietf-httpapi-ratelimit-headers (structured-field
    lists). `t` is the number of seconds until capacity starts to come back (the oldest entry in the
    sliding window leaves it); tokens use the quota unit "tokens"."""
    if not limits:
        return {}
    policies, states = [], []
    for i, limit in enumerate(limits):
        taken = (tokens if limit.kind == "tpm" else 1) if admitted else 0
        remaining = max(0, limit.limit - (used[i] if i < len(used) else 0) - taken)
        if limit.kind == "concurrency":
            policies.append(f'"{limit.policy}";q={limit.limit};qu="concurrent-requests"')
            states.append(f'"{limit.policy}";r={remaining}')
            continue
        unit = ';qu="tokens"' if limit.kind == "tpm" else ""
        policies.append(f'"{limit.policy}";q={limit.limit};w={WINDOW_MS // 1000}{unit}')
        reset = math.ceil(resets_ms[i] / 1000) if i < len(resets_ms) else WINDOW_MS // 1000
        states.append(f'"{limit.policy}";r={remaining};t={max(0, reset)}')
    return {"ratelimit-policy": ", ".join(policies), "ratelimit": ", ".join(states)}


# --- admit -------------------------------------------------------------------------------------


class StaleConfiguration(Exception):
    """The configuration changed since this process cached it; nothing was admitted or taken.
    Its caches are now dropped: re-read the key and the route, and admit again."""


async def admit(
    *,
    key: KeyInfo,
    model: str,
    model_limits: dict[str, int],
    deployments: list[Target],
    request_id: str,
    tokens: int,
    worst_cost: Decimal,
    lease_seconds: float,
    end_user: str = "",
    session: str = "",
) -> Ticket:
    """Admit the request against everything that applies, or raise the GatewayError saying why.
    The same step reads the state of the chain's deployments (`deployments`, in the order the request
    will try them: breakers, spend caps) and takes a concurrency slot on the first that may be called
    and has one free; when none has, the request is refused with 503 overloaded. `end_user` and
    `session` (gateway.audience) bring the key's end-user limits in."""
    now = datetime.now(UTC)
    ticket = Ticket(
        tenant_id=key.tenant_id,
        request_id=request_id,
        tokens=tokens,
        cost_units=to_units(worst_cost),
        limits=limits_for(key, model, model_limits),
        budgets=budgets_for(key, now) + audience_holds(key, now, end_user=end_user, session=session),
    )
    lease_ms = int(lease_seconds * 1000) + LEASE_MARGIN_MS
    initial: dict[int, int] = {}
    deployment_keys, deployment_args = _deployment_keys_and_args(deployments, now.date())
    try:
        for _ in range(3):
            try:
                # While Redis is unreachable, each request's admission finds out whether it answers again.
                with checking_allowed():
                    if is_cluster():
                        result = await _admit_on_cluster(key, ticket, lease_ms, initial, deployments, now.date())
                    else:
                        result = await scripts.admission(
                            keys=_admit_keys(key, ticket) + deployment_keys,
                            args=_admit_args(ticket, lease_ms, initial, len(deployments), deployment_args),
                        )
            except NotWaiting:
                raise
            except UNREACHABLE:
                # Sent, but no answer: the step may have run, or run when Redis resumes. Once Redis
                # answers again, whatever it took is given back (void.lua).
                _voids.extend(_void_of(ticket, deployments))
                raise
            if _voids:
                await _void_given_up()
            outcome = result[0].decode()
            if outcome != "init":
                break
            # Budget periods Redis has no counter for (a new period, a new end user, or Redis lost
            # it): start them from the ledger, then try again.
            missing = [int(i) - 1 for i in result[1]]
            spent = await settled_spend([ticket.budgets[i] for i in missing])
            initial.update(zip(missing, spent, strict=True))
    except UNREACHABLE as exc:
        log.debug("admission without Redis (%s): the tenant's policy decides", exc)
        return _admit_without_redis(key, ticket)

    observe_generation(result[3] or None)
    if outcome == "init":  # counters that kept expiring as they were started: nothing was taken
        raise GatewayError(
            503, "admission_unavailable", "Budget periods are starting; retry.", headers={"retry-after": "1"}
        )
    if outcome == "stale":
        raise StaleConfiguration
    if outcome == "blocked":
        if result[1] == b"key":
            raise GatewayError(401, "invalid_api_key", "This API key has been revoked.")
        raise GatewayError(403, "tenant_suspended", "This key's tenant is suspended.")
    ticket.used = [int(v) for v in result[4]]
    ticket.resets_ms = [int(v) for v in result[5]]
    # Every refusal from here on says where the rate limits stand (nothing was taken).
    refused_headers = ratelimit_headers(ticket.limits, ticket.used, ticket.resets_ms, tokens, admitted=False)
    if outcome == "budget":
        hold = ticket.budgets[int(result[1]) - 1]
        if hold.scope:
            raise audience_refusal(hold, ticket, int(result[2]), now, refused_headers)
        raise budget_refusal(hold, key, ticket, refused_headers)
    if outcome == "ok":
        ticket.breaker_states = {
            t.deployment_id: state.decode() for t, state in zip(deployments, result[6], strict=True)
        }
        if result[7]:
            slot = deployments[int(result[7]) - 1].deployment_id
            ticket.slots[slot] = in_flight_key(slot)
    if outcome == "overloaded":
        raise GatewayError(
            503,
            "overloaded",
            f"Every deployment of '{model}' is at its concurrency limit. Retry shortly.",
            headers={**refused_headers, "retry-after": "1"},
        )
    if outcome == "limit":
        limit = ticket.limits[int(result[1]) - 1]
        metrics.admission_rejected(limit.policy)
        retry_after = max(1, math.ceil(int(result[2]) / 1000))
        headers = {**refused_headers, "retry-after": str(retry_after)}
        raise GatewayError(
            429,
            "rate_limit_exceeded",
            f"Rate limit reached: {limit.policy} allows {limit.limit}"
            f"{' tokens' if limit.kind == 'tpm' else ''}"
            f"{' concurrent requests' if limit.kind == 'concurrency' else ' per minute'}. "
            f"Retry after {retry_after} s.",
            headers=headers,
        )
    return ticket


def _admit_keys(
    key: KeyInfo, ticket: Ticket, limits: list[Limit] | None = None, *, generation: bool = True
) -> list[str]:
    keys = [void_key(ticket.step, redis_keys.tenant_tag(key.tenant_id)), *block_markers(key)]
    if generation:
        keys.append(GENERATION_KEY)
    for limit in ticket.limits if limits is None else limits:
        keys.extend(limit.keys)
    for hold in ticket.budgets:
        keys.extend(hold.keys)
    return keys


def _admit_args(
    ticket: Ticket,
    lease_ms: int,
    initial: dict[int, int],
    deployments: int,
    deployment_args: list,
    limits: list[Limit] | None = None,
    budgets: list[BudgetHold] | None = None,
    mode: bytes | str | None = None,
) -> list:
    limits = ticket.limits if limits is None else limits
    budgets = ticket.budgets if budgets is None else budgets
    args: list = [ticket.request_id, ticket.tokens, ticket.cost_units, lease_ms, len(limits)]
    for limit in limits:
        args.extend((limit.script_kind, limit.limit, WINDOW_MS))
    args.append(len(budgets))
    for i, hold in enumerate(budgets):
        ttl = int((hold.period_end - datetime.now(UTC)).total_seconds()) + 2 * 86400
        args.extend((hold.limit_units, initial.get(i, ""), ttl, 1 if hold.hard else 0, hold.reserves(ticket)))
    args.append(deployments)
    args.extend(deployment_args)
    args.append(current_generation() if mode is None else mode)
    return args


def void_key(step: str, tag: str) -> str:
    """Set when an admission step was given up on: if it runs after that, it takes nothing (one per
    slot the step touches: `tag`)."""
    return redis_keys.void(step, tag=tag)


# --- admission on a cluster --------------------------------------------------------------------

# On a Valkey/Redis Cluster (docs/cluster.md) one script cannot touch keys in several slots. A
# tenant's keys share its slot, so everything of one tenant is checked and taken in one atomic step,
# as on a single node; a model's global limits, each deployment's breaker and concurrency slots, and
# each provider's spend are each in their own slot. Admission then runs as steps, each atomic in its
# slot, in a fixed order: the tenant's, then the model's (with the configuration generation and the
# chain's breakers and spend read meanwhile), then a slot on the first deployment that may be called.
# A step that refuses, or a generation that moved, gives back what the earlier steps took (void.lua)
# before the refusal is answered. Every counter is checked and taken atomically in its own step, so
# no limit is ever exceeded (a cap of N never admits N + 1); what a later refusal gives back was held
# for a moment, which can only refuse another request in that moment, never admit one too many.


async def _admit_on_cluster(
    key: KeyInfo, ticket: Ticket, lease_ms: int, initial: dict[int, int], deployments: list[Target], day: date
) -> list:
    """The admission, as steps per slot; answers as admission.lua does."""
    from sentinel.redis_clients import async_redis

    own = [limit for limit in ticket.limits if not limit.shared]
    shared = [limit for limit in ticket.limits if limit.shared]
    result = await scripts.admission(
        keys=_admit_keys(key, ticket, own, generation=False),
        args=_admit_args(ticket, lease_ms, initial, 0, [], limits=own, mode="*"),
    )
    if result[0] != b"ok":
        return list(result)
    used, resets = list(result[4]), list(result[5])
    client = async_redis()
    reads: list = [client.get(GENERATION_KEY)]  # after the tenant's step: see below
    capped_at = [t for t in deployments if t.spend_cap is not None]
    reads += [client.get(provider_spend_key(t.provider_id, day)) for t in capped_at]
    reads += [_claim(ticket, t, lease_ms, capped=False, take=False) for t in deployments]
    if shared:
        model_tag = shared[0].tag
        reads.append(
            scripts.admission(
                keys=[void_key(ticket.step, model_tag), *(k for limit in shared for k in limit.keys)],
                args=_admit_args(ticket, lease_ms, {}, 0, [], limits=shared, budgets=[], mode="-"),
            )
        )
    answers = await asyncio.gather(*reads, return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            if not isinstance(answer, UNREACHABLE):  # (unreachable: the caller voids every step)
                await _give_back(ticket, own, shared, deployments)
            raise answer
    generation, answers = answers[0], answers[1:]
    spent, answers = answers[: len(capped_at)], answers[len(capped_at) :]
    states, answers = [state for state, _ in answers[: len(deployments)]], answers[len(deployments) :]
    if shared:
        model = answers[0]
        used += list(model[4])
        resets += list(model[5])
        if model[0] != b"ok":
            await _give_back(ticket, own, [], [])
            index = int(model[1]) + len(own) if model[0] == b"limit" else model[1]
            return [model[0], index, model[2], generation or b"", used, resets]
    # The generation is read after the tenant's step took its holds, and only grows: the same value
    # as the caller's caches reflect means no configuration changed before that step ran, so the
    # step checked what is configured, as the single script's check does.
    if (generation or b"") != current_generation():
        await _give_back(ticket, own, shared, [])
        return [b"stale", 0, b"0", generation or b"", [], []]
    capped = _over_cap(capped_at, spent)
    final, slot, overloaded = await _first_slot(ticket, deployments, states, capped, lease_ms)
    if overloaded:
        await _give_back(ticket, own, shared, [])
        return [b"overloaded", 0, b"1000", generation or b"", used, resets]
    return [b"ok", 0, b"0", generation or b"", used, resets, final, slot]


CALLABLE = (b"closed", b"probe", b"forced_closed")  # as deployments.lua says


def _over_cap(capped_at: list[Target], spent: list) -> set[int]:
    """The deployments whose provider spent its daily cap (`spent`: each one's counter, as read)."""
    return {
        t.deployment_id
        for t, units in zip(capped_at, spent, strict=True)
        if t.spend_cap is not None and int(units or 0) >= to_units(t.spend_cap)
    }


async def _first_slot(
    ticket: Ticket, targets: list[Target], states: list[bytes], capped: set[int], lease_ms: int
) -> tuple[list[bytes], int, bool]:
    """The chain's states (capped ones as such) with a slot taken on the first callable deployment
    (1-based; 0: one without a concurrency limit, or none), and whether every callable one was full."""
    final: list[bytes] = []
    slot = 0
    chosen = full = False
    for index, (target, state) in enumerate(zip(targets, states, strict=True), 1):
        if target.deployment_id in capped:
            state = b"capped"
        if not chosen and state in CALLABLE:
            if target.max_concurrent is None:
                chosen = True
            else:
                # The state is read again with the slot, atomically (it may have moved since).
                state, took = await _claim(ticket, target, lease_ms, capped=False, take=True)
                if took:
                    chosen, slot = True, index
                elif state == b"full":
                    full = True
        final.append(state)
    return final, slot, full and not chosen


async def _claim(ticket: Ticket, target: Target, lease_ms: int, *, capped: bool, take: bool) -> tuple[bytes, int]:
    """claim.lua on the deployment's slot: its breaker state and, if `take`, a concurrency slot."""
    tag = redis_keys.deployment_tag(target.deployment_id)
    keys = [void_key(ticket.step, tag), breakers.keys_for(target.deployment_id)[0]]
    limit: object = ""
    if take and target.max_concurrent is not None:
        keys.append(in_flight_key(target.deployment_id))
        limit = target.max_concurrent
    state, took = await scripts.claim(keys=keys, args=[ticket.request_id, lease_ms, 1 if capped else 0, "", limit])
    return state, int(took)


async def _give_back(ticket: Ticket, own: list[Limit], shared: list[Limit], deployments: list[Target]) -> None:
    """Void the steps of an admission a later step refused (or that could not finish): what they
    took is given back, and a step that has not run yet takes nothing when it does."""
    voids = _voids_for(ticket, own, shared, deployments)
    for index, (keys, args) in enumerate(voids):
        try:
            await scripts.void(keys=keys, args=args)
        except UNREACHABLE:
            _voids.extend(voids[index:])  # given back once Redis answers again
            return


# --- admission steps given up on ---------------------------------------------------------------

# Redis that stalls may run a step after its caller stopped waiting (held in its socket buffers), or
# have run it with the answer lost. The request was decided without Redis, so whatever the step took
# must not stay held until its leases end: the first admission Redis answers again voids them all
# (void.lua) before it goes on, so recovery is complete when that request is.
_voids: list[tuple[list[str], list]] = []
_voiding = False
VOID_TTL_SECONDS = 2 * 86400  # outlives any step a stall can hold
VOIDS_PER_REQUEST = 50  # a long stall's backlog is worked off over the first requests after it


def _void_of(ticket: Ticket, deployments: list[Target]) -> list[tuple[list[str], list]]:
    """What voids an admission step given up on: one void.lua call on a single node, one per slot
    the steps touch on a cluster."""
    if not is_cluster():
        return [_void_step(ticket, ticket.limits, ticket.budgets, _tenant_of(ticket), deployments)]
    own = [limit for limit in ticket.limits if not limit.shared]
    shared = [limit for limit in ticket.limits if limit.shared]
    return _voids_for(ticket, own, shared, deployments)


def _tenant_of(ticket: Ticket) -> str:
    return redis_keys.tenant_tag(ticket.tenant_id)


def _voids_for(
    ticket: Ticket, own: list[Limit], shared: list[Limit], deployments: list[Target]
) -> list[tuple[list[str], list]]:
    voids = [_void_step(ticket, own, ticket.budgets, _tenant_of(ticket), [])]
    if shared:
        voids.append(_void_step(ticket, shared, [], shared[0].tag, []))
    for target in deployments:  # every deployment's marker: a claim sent but unanswered takes nothing later
        tag = redis_keys.deployment_tag(target.deployment_id)
        voids.append(_void_step(ticket, [], [], tag, [target] if target.max_concurrent is not None else []))
    return voids


def _void_step(
    ticket: Ticket, limits: list[Limit], budgets: list[BudgetHold], tag: str, deployments: list[Target]
) -> tuple[list[str], list]:
    keys = [void_key(ticket.step, tag)]
    args: list = [ticket.request_id, ticket.tokens, ticket.cost_units, VOID_TTL_SECONDS, len(limits)]
    for limit in limits:
        keys.extend(limit.keys)
        args.append(limit.script_kind)
    args.append(len(budgets))
    for hold in budgets:
        keys.extend(hold.keys[1:])
        args.append(hold.reserves(ticket))
    keys.extend(in_flight_key(t.deployment_id) for t in deployments if t.max_concurrent is not None)
    return keys, args


async def _void_given_up() -> None:
    global _voiding
    if _voiding:
        return  # another request of this process is at it
    _voiding = True
    try:
        for _ in range(min(len(_voids), VOIDS_PER_REQUEST)):
            keys, args = _voids[0]
            await scripts.void(keys=keys, args=args)
            _voids.pop(0)
            log.info("voided the admission step of %s, given up on while Redis did not answer", args[0])
    except UNREACHABLE:
        pass  # unreachable again: the next answer goes on
    finally:
        _voiding = False


async def reserve(ticket: Ticket, targets: list[Target]) -> None:
    """Read the state of deployments admission did not (a refusal's escalation chain), or take a slot
    on a limited deployment the request fails over to: one round trip, only when that happens. The
    states join the ticket's; a full deployment is marked full (the caller skips it)."""
    if ticket.local:
        return
    keys, args = _deployment_keys_and_args(targets, datetime.now(UTC).date())
    lease_ms = int(settings.CHAIN_DEADLINE_SECONDS * 1000) + LEASE_MARGIN_MS
    try:
        if is_cluster():
            states, slot = await _reserve_on_cluster(ticket, targets, lease_ms)
        else:
            states, slot = await scripts.reserve(keys=keys, args=[ticket.request_id, lease_ms, len(targets), *args])
    except UNREACHABLE:
        return  # unreachable: nothing is limited, as admission without Redis limits nothing
    for target, state in zip(targets, states, strict=True):
        ticket.breaker_states[target.deployment_id] = state.decode()
    if slot:
        taken = targets[int(slot) - 1].deployment_id
        ticket.slots[taken] = in_flight_key(taken)


async def _reserve_on_cluster(ticket: Ticket, targets: list[Target], lease_ms: int) -> tuple[list[bytes], int]:
    """reserve.lua's answer, on a cluster: the states read at once, then a slot on the first that
    may be called (claim.lua, one deployment's slot at a time)."""
    from sentinel.redis_clients import async_redis

    day = datetime.now(UTC).date()
    capped_at = [t for t in targets if t.spend_cap is not None]
    client = async_redis()
    answers = await asyncio.gather(
        *(client.get(provider_spend_key(t.provider_id, day)) for t in capped_at),
        *(_claim(ticket, t, lease_ms, capped=False, take=False) for t in targets),
    )
    spent, read = answers[: len(capped_at)], answers[len(capped_at) :]
    capped = _over_cap(capped_at, spent)
    states, slot, _ = await _first_slot(ticket, targets, [state for state, _ in read], capped, lease_ms)
    return states, slot


def _settled_sync(holds: list[BudgetHold]) -> list[int]:
    from billing.selectors import audience_usage, spend_in_period

    spent = []
    for hold in holds:
        start = datetime.combine(hold.period_start, datetime.min.time(), UTC)
        if hold.scope:
            used = audience_usage(
                key_id=hold.key_id, scope=hold.scope, subject=hold.subject, start=start, end=hold.period_end
            )
            spent.append(used.tokens if hold.tokens else to_units(used.cost_usd))
        else:
            amount = spend_in_period(
                tenant_id=hold.tenant_id, key_id=hold.key_id, team_id=hold.team_id, start=start, end=hold.period_end
            )
            spent.append(to_units(amount))
    return spent


async def settled_spend(holds: list[BudgetHold]) -> list[int]:
    """What the ledger holds for budgets' periods, in units (tokens for a token cap): needed once per
    period (and end user or session) when Redis has no counter for it; while the database is away,
    a clear 503."""
    with database_required():
        return await from_database(_settled_sync, holds)


def budget_refusal(hold: BudgetHold, key: KeyInfo, ticket: Ticket, headers: dict[str, str]) -> GatewayError:
    """402 for a key's, team's or tenant's budget, naming it and when its period resets."""
    scope = "key" if hold.key_id else "team" if hold.team_id else "tenant"
    owner = {"key": "this key", "team": f"team '{key.team_name}'", "tenant": "the tenant"}[scope]
    resets = hold.period_end.strftime("%Y-%m-%dT%H:%M:%SZ")
    metrics.admission_rejected(f"{scope}-budget")
    return GatewayError(
        402,
        "budget_exceeded",
        f"This request could exceed the {hold.period} budget of ${from_units(hold.limit_units)} set on {owner} "
        f"for the period starting {hold.period_start.isoformat()}; it resets at {resets}. Until it is answered it "
        f"holds up to ${from_units(ticket.cost_units)}, its prompt and the most output it may produce. Without "
        "max_tokens that is the model's largest output: set max_tokens to hold less, or raise the budget.",
        headers={**headers, "x-sentinel-limit": f"{scope}-{hold.period}-budget", "x-sentinel-limit-reset": resets},
    )


def audience_refusal(
    hold: BudgetHold, ticket: Ticket, taken: int, now: datetime, headers: dict[str, str]
) -> GatewayError:
    """402 for an end user's or session's budget, 429 for its token cap: naming the limit, when its
    period resets, and (for the cap) where it stands in RateLimit headers."""
    who = "end user" if hold.scope == "end_user" else "session"
    resets = hold.period_end.strftime("%Y-%m-%dT%H:%M:%SZ")
    seconds = max(1, math.ceil((hold.period_end - now).total_seconds()))
    headers = {**headers, "x-sentinel-limit": hold.policy, "x-sentinel-limit-reset": resets}
    metrics.admission_rejected(hold.policy)
    if not hold.tokens:
        return GatewayError(
            402,
            "budget_exceeded",
            f"This request could exceed the {hold.period} budget of ${from_units(hold.limit_units)} each {who} "
            f"of this key has ({hold.policy}); it resets at {resets}. Until it is answered it holds up to "
            f"${from_units(ticket.cost_units)}, its prompt and the most output it may produce: set max_tokens "
            "to hold less.",
            headers=headers,
        )
    window = int((hold.period_end - datetime.combine(hold.period_start, datetime.min.time(), UTC)).total_seconds())
    remaining = max(0, hold.limit_units - taken)
    policy = f'"{hold.policy}";q={hold.limit_units};w={window};qu="tokens"'
    state = f'"{hold.policy}";r={remaining};t={seconds}'
    return GatewayError(
        429,
        "rate_limit_exceeded",
        f"Token cap reached: each {who} of this key may use {hold.limit_units} tokens {hold.period} "
        f"({hold.policy}); {taken} are used or held, and this request could take "
        f"{ticket.tokens}. It resets at {resets}.",
        headers={
            **headers,
            "ratelimit-policy": ", ".join(filter(None, (headers.get("ratelimit-policy"), policy))),
            "ratelimit": ", ".join(filter(None, (headers.get("ratelimit"), state))),
            "retry-after": str(seconds),
        },
    )


async def nearly_spent(key: KeyInfo, percent: int) -> BudgetHold | None:
    """The first of the hard budgets a key's requests count against whose spend, with what requests
    in flight hold, has reached `percent` of its limit (one Redis round trip); None when none has,
    or when Redis cannot say (admission then decides as always)."""
    from sentinel.redis_clients import async_redis

    holds = [hold for hold in budgets_for(key, datetime.now(UTC)) if hold.hard]
    if not holds:
        return None
    pipe = async_redis().pipeline(transaction=False)
    for hold in holds:
        pipe.get(hold.keys[0])
        pipe.get(hold.keys[2])
    try:
        values = await pipe.execute()
    except UNREACHABLE:
        return None
    for index, hold in enumerate(holds):
        spent, reserved = values[2 * index], values[2 * index + 1]
        # A period Redis holds no counter for yet: what the ledger holds (admission starts it so too).
        spent_units = int(spent) if spent is not None else (await settled_spend([hold]))[0]
        if (spent_units + int(reserved or 0)) * 100 >= hold.limit_units * percent:
            return hold
    return None


# --- settle ------------------------------------------------------------------------------------

# Budget id -> the period this process queued its threshold alert for.
_alerts_queued: dict[int, date] = {}


async def settle(
    ticket: Ticket,
    *,
    attempts: list[Attempt],
    tokens_used: int,
    cost: Decimal,
    ledger_record: bytes,
    paid: dict[int, Decimal] | None = None,
) -> None:
    """Turn the ticket's holds into what happened (zero tokens and cost: release everything), record
    the request's provider attempts in their circuit breakers and what each provider was paid (`paid`:
    provider id → cost) against its daily spend cap, and queue its ledger record, in one atomic step.
    Only the first call counts. Without Redis, the record goes straight to Postgres."""
    if ticket.settled:
        return
    ticket.settled = True
    if ticket.local:
        _local.settle(ticket, tokens_used)
        breakers.record_locally(attempts)
        await ledger.hand_off_encoded(ledger_record)
        return
    tpm = [limit for limit in ticket.limits if limit.kind == "tpm"]
    concurrency = [limit for limit in ticket.limits if limit.kind == "concurrency"]
    keys = [k for limit in tpm for k in limit.keys]
    keys += [limit.keys[0] for limit in concurrency] + list(ticket.slots.values())
    keys += [k for hold in ticket.budgets for k in hold.keys]
    breaker_keys, breaker_args = breakers.record_arguments(attempts)
    spent_units = to_units(cost)
    budget_args = []
    for hold in ticket.budgets:
        budget_args.extend((hold.reserves(ticket), tokens_used if hold.tokens else spent_units))
    paid = {provider: units for provider, amount in (paid or {}).items() if (units := to_units(amount)) > 0}
    today = datetime.now(UTC).date() if paid else None
    spend_keys = [provider_spend_key(provider, today) for provider in paid]
    spend_args = [len(paid)]
    for units in paid.values():
        spend_args.extend((units, SPEND_TTL_SECONDS))
    try:
        if is_cluster():
            totals, transitions, details = await _settle_on_cluster(
                ticket, attempts, tokens_used, budget_args, paid, today, ledger_record
            )
        else:
            totals, transitions, details = await scripts.settle(
                keys=[*keys, *breaker_keys, *spend_keys, ledger.STREAM],
                args=[
                    ticket.request_id,
                    ticket.tokens,
                    tokens_used,
                    len(tpm),
                    len(concurrency) + len(ticket.slots),
                    len(ticket.budgets),
                    *budget_args,
                    *breaker_args,
                    *spend_args,
                    ledger_record,
                ],
            )
    except UNREACHABLE as exc:
        # The holds expire on their own (leases); the ledger keeps the spend either way.
        log.warning("admission: could not settle %s (%s)", ticket.request_id, exc)
        breakers.record_locally(attempts)
        await ledger.write_directly(ledger_record)
        return
    breakers.after_record(attempts, transitions, details)
    for hold, total in zip(ticket.budgets, totals, strict=True):
        total = int(total)
        # At or past the threshold, not "this request crossed it": a budget created (or its threshold
        # lowered) after the period's spend had passed it alerts too. Queued once per process and
        # period; the task keeps one alert per budget and period, whoever else queued it.
        if (
            hold.alert_units is not None
            and total >= hold.alert_units
            and _alerts_queued.get(hold.budget_id) != hold.period_start
        ):
            from tenants.tasks import budget_alert

            _alerts_queued[hold.budget_id] = hold.period_start
            await sync_to_async(budget_alert.delay)(
                hold.budget_id, hold.period_start.isoformat(), str(from_units(total))
            )


async def _settle_on_cluster(
    ticket: Ticket,
    attempts: list[Attempt],
    tokens_used: int,
    budget_args: list,
    paid: dict[int, int],
    today: date | None,
    ledger_record: bytes,
) -> tuple[list, list, list]:
    """settle.lua's work on a cluster, one call per slot: the ledger record first (its stream is a
    slot of its own; raises when Redis did not take it, and the caller writes it to Postgres), then
    at once the tenant's holds, the model's, each deployment's slot and breaker, each provider's
    spend. Once the record is queued nothing raises: a part Redis did not take is logged (its holds
    end with their leases; its breakers are recorded in this process)."""
    from sentinel.redis_clients import async_redis

    await async_redis().xadd(ledger.STREAM, {"r": ledger_record})
    rid = ticket.request_id
    calls: list = []

    def part(limits: list[Limit], budgets: list[BudgetHold], budget_args: list, slots: list[str], records: list):
        tpm = [limit for limit in limits if limit.kind == "tpm"]
        concurrency = [limit for limit in limits if limit.kind == "concurrency"]
        keys = [k for limit in tpm for k in limit.keys] + [limit.keys[0] for limit in concurrency] + slots
        keys += [k for hold in budgets for k in hold.keys]
        breaker_keys, breaker_args = breakers.record_arguments(records)
        args = [rid, ticket.tokens, tokens_used, len(tpm), len(concurrency) + len(slots), len(budgets), *budget_args]
        return scripts.settle(keys=[*keys, *breaker_keys], args=[*args, *breaker_args, 0, ""])

    own = [limit for limit in ticket.limits if not limit.shared]
    shared = [limit for limit in ticket.limits if limit.shared and limit.kind != "rpm"]
    calls.append(part(own, ticket.budgets, budget_args, [], []))
    if shared:
        calls.append(part(shared, [], [], [], []))
    by_deployment: dict[int, list[Attempt]] = {}
    for attempt in attempts:
        by_deployment.setdefault(attempt.target.deployment_id, []).append(attempt)
    deployments = sorted(set(by_deployment) | set(ticket.slots))
    for deployment in deployments:
        slot = [ticket.slots[deployment]] if deployment in ticket.slots else []
        calls.append(part([], [], [], slot, by_deployment.get(deployment, [])))
    for provider, units in paid.items():
        assert today is not None
        spend = provider_spend_key(provider, today)
        calls.append(scripts.settle(keys=[spend], args=[rid, 0, 0, 0, 0, 0, 0, 1, units, SPEND_TTL_SECONDS, ""]))
    answers = await asyncio.gather(*calls, return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException) and not isinstance(answer, UNREACHABLE):
            raise answer
    tenant = answers[0]
    if isinstance(tenant, BaseException):
        log.warning("admission: could not settle %s's holds (%s)", rid, tenant)
        totals: list = [-1] * len(ticket.budgets)
    else:
        totals = list(tenant[0])
    found: dict[int, tuple[list, list]] = {}
    for deployment, answer in zip(deployments, answers[1 + bool(shared) :], strict=False):
        if isinstance(answer, BaseException):
            breakers.record_locally(by_deployment.get(deployment, []))
            found[deployment] = ([b""] * len(by_deployment.get(deployment, [])), [])
        else:
            found[deployment] = (list(answer[1]), list(answer[2]))
    transitions, details = [], []
    seen: dict[int, int] = {}
    for attempt in attempts:
        deployment = attempt.target.deployment_id
        i = seen.get(deployment, 0)
        seen[deployment] = i + 1
        got_transitions, got_details = found[deployment]
        transitions.append(got_transitions[i] if i < len(got_transitions) else b"")
        details.append(got_details[i] if i < len(got_details) else b"")
    return totals, transitions, details


# --- without Redis -----------------------------------------------------------------------------


class LocalCounters:
    """This process's own sliding logs, used only while Redis is unreachable for fail-open tenants.
    With N gateway processes a limit can then admit up to N times its value: the documented price
    of staying available."""

    def __init__(self) -> None:
        self.logs: dict[str, deque] = {}
        self.in_flight: dict[str, set[str]] = {}

    def admit(self, ticket: Ticket) -> bool:
        now = time.monotonic()
        for limit in ticket.limits:
            if limit.kind == "concurrency":
                if len(self.in_flight.get(limit.keys[0], ())) + 1 > limit.limit:
                    return False
                continue
            entries = self.logs.setdefault(limit.keys[0], deque())
            while entries and entries[0][0] <= now - WINDOW_MS / 1000:
                entries.popleft()
            weight = ticket.tokens if limit.kind == "tpm" else 1
            if sum(w for _, w, _ in entries) + weight > limit.limit:
                return False
        for limit in ticket.limits:
            if limit.kind == "concurrency":
                self.in_flight.setdefault(limit.keys[0], set()).add(ticket.request_id)
            else:
                weight = ticket.tokens if limit.kind == "tpm" else 1
                self.logs[limit.keys[0]].append((now, weight, ticket.request_id))
        return True

    def settle(self, ticket: Ticket, tokens_used: int) -> None:
        for limit in ticket.limits:
            if limit.kind == "concurrency":
                self.in_flight.get(limit.keys[0], set()).discard(ticket.request_id)
            elif limit.kind == "tpm":
                entries = self.logs.get(limit.keys[0], deque())
                for i, (when, _, rid) in enumerate(entries):
                    if rid == ticket.request_id:
                        entries[i] = (when, tokens_used, rid)
                        break


_local = LocalCounters()


def _admit_without_redis(key: KeyInfo, ticket: Ticket) -> Ticket:
    if not key.fail_open:
        raise GatewayError(
            503,
            "admission_unavailable",
            "Sentinel cannot reach its rate-limit store and this tenant fails closed. Retry shortly.",
            headers={"retry-after": "1"},  # it is let back in as soon as Redis answers
        )
    ticket.local = True
    if not _local.admit(ticket):
        metrics.admission_rejected("local")
        raise GatewayError(
            429,
            "rate_limit_exceeded",
            "Rate limit reached (counted by this gateway process while the shared store is unreachable).",
            headers={"retry-after": "1"},
        )
    return ticket
