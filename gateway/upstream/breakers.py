"""Circuit breakers, one per deployment, shared by every gateway process through Redis.

The state machine lives in breakers.lua (closed → open on a failure rate or a slow-call rate over a
sliding window with a minimum volume; open for a time that grows with repeated openings; half-open
with a bounded number of probes). The request path reads every chain deployment's state in the
admission step, asks for a probe permit only when a breaker's open time is over, and records each
attempt's outcome in the settle step. Client-caused failures are never recorded.

When Redis cannot be reached, each process keeps its own breakers (LocalBreakers, same rules), so
provider calls are never blocked by the breaker store. Every transition, automatic or manual, goes
through `breaker_transition`, which records it, pushes it to the console's live view and to webhooks.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway import metrics
from gateway.lua import scripts
from sentinel import redis_keys
from sentinel.redis_clients import UNREACHABLE

if TYPE_CHECKING:
    from gateway.upstream.routing import Target

log = logging.getLogger(__name__)

CIRCUITS_GROUP = "circuits"


@dataclass(frozen=True)
class Policy:
    window_seconds: int = 60
    minimum_calls: int = 20
    failure_rate_percent: int = 50
    slow_call_seconds: float = 20.0
    slow_rate_percent: int = 80
    open_seconds: float = 30.0
    max_open_seconds: float = 600.0
    half_open_probes: int = 3

    def script_args(self) -> list:
        return [
            self.window_seconds,
            self.minimum_calls,
            self.failure_rate_percent,
            self.slow_rate_percent,
            int(self.open_seconds * 1000),
            int(self.max_open_seconds * 1000),
            self.half_open_probes,
        ]

    @classmethod
    def from_model(cls, policy) -> Policy:
        if policy is None:
            return DEFAULT_POLICY
        return cls(
            window_seconds=policy.window_seconds,
            minimum_calls=policy.minimum_calls,
            failure_rate_percent=policy.failure_rate_percent,
            slow_call_seconds=policy.slow_call_seconds,
            slow_rate_percent=policy.slow_rate_percent,
            open_seconds=policy.open_seconds,
            max_open_seconds=policy.max_open_seconds,
            half_open_probes=policy.half_open_probes,
        )


DEFAULT_POLICY = Policy()


def keys_for(deployment_id: int) -> tuple[str, str]:
    base = redis_keys.breaker(deployment_id)
    return base, base + ":w"


# Forced states count as what they force.
BREAKER_VALUES = {"closed": 0, "forced_closed": 0, "half_open": 1, "open": 2, "forced_open": 2}


class BreakerStates(Collector):
    """sentinel_breaker_state, read from Redis at scrape time for every deployment."""

    def describe(self):
        return [self._family()]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "sentinel_breaker_state",
            "Circuit breaker state per deployment, as shared in Redis: 0 closed, 1 half-open, 2 open.",
            labels=("deployment",),
        )

    def collect(self):
        import redis

        from gateway.models import Deployment
        from sentinel.redis_clients import sync_redis

        family = self._family()
        deployments = list(Deployment.objects.values_list("pk", "name"))
        pipe = sync_redis().pipeline(transaction=False)
        for pk, _ in deployments:
            pipe.hmget(keys_for(pk)[0], "state", "forced")
        try:
            states = pipe.execute()
        except redis.RedisError:
            return [family]  # no word from Redis is no state, not "closed"
        for (_, name), (state, forced) in zip(deployments, states, strict=True):
            value = "forced_" + forced.decode() if forced else (state or b"closed").decode()
            family.add_metric([name], BREAKER_VALUES.get(value, 0))
        return [family]


# /metrics serves it (gateway.views): the breakers own their state and how it is read, so the metrics
# module below them does not import them.
STATE_REGISTRY = CollectorRegistry(auto_describe=False)
STATE_REGISTRY.register(BreakerStates())


@dataclass
class Attempt:
    """One call to one deployment, as the breaker will count it."""

    target: Target
    outcome: str  # ok | fail | slow
    probe: bool


# --- permits -----------------------------------------------------------------------------------


async def permit(target: Target, state: str, *, local: bool) -> tuple[bool, bool]:
    """(may call it, as a half-open probe) for a deployment whose state admission read."""
    if target.forced_state == "open":
        return False, False
    if target.forced_state == "closed":
        return True, False
    if local:
        return _local.permit(target)
    if state in ("closed", "forced_closed"):
        return True, False
    if state in ("open", "forced_open"):
        return False, False
    try:
        allowed, probe, transition = await scripts.probe(
            keys=[keys_for(target.deployment_id)[0]],
            args=[target.policy.half_open_probes, int(settings.CHAIN_DEADLINE_SECONDS * 1000)],
        )
    except UNREACHABLE:
        return _local.permit(target)
    if transition:
        announce(target, transition.decode(), "open time over; probing")
    return bool(allowed), bool(probe)


def record_arguments(attempts: list[Attempt]) -> tuple[list[str], list]:
    keys, args = [], [len(attempts)]
    for attempt in attempts:
        keys.extend(keys_for(attempt.target.deployment_id))
        args.extend([attempt.outcome, 1 if attempt.probe else 0, *attempt.target.policy.script_args()])
    return keys, args


def after_record(attempts: list[Attempt], transitions: list, details: list) -> None:
    for attempt, transition, detail in zip(attempts, transitions, details, strict=True):
        if transition:
            announce(attempt.target, transition.decode(), detail.decode())


def record_locally(attempts: list[Attempt]) -> None:
    for attempt in attempts:
        transition = _local.record(attempt)
        if transition:
            announce(attempt.target, transition, "recorded by this process (Redis unreachable)")


# --- transitions -------------------------------------------------------------------------------

_pending: set = set()


def announce(target: Target, transition: str, detail: str) -> None:
    """Hand a transition the request path observed to `breaker_transition`, off the request path."""
    import asyncio

    old, new = transition.split(">")
    task = asyncio.get_running_loop().create_task(
        sync_to_async(breaker_transition)(deployment_id=target.deployment_id, old=old, new=new, reason=detail)
    )
    _pending.add(task)
    task.add_done_callback(_pending.discard)


def breaker_transition(*, deployment_id: int, old: str, new: str, reason: str, actor=None) -> None:
    """The one place a breaker state change is recorded and told: an audit row, the metric, the
    console's live circuit view (Channels group "circuits"), and webhooks."""
    from channels.layers import get_channel_layer

    from gateway.models import BreakerTransition, Deployment
    from tenants.webhooks import webhook_publish

    deployment = Deployment.objects.select_related("provider").filter(pk=deployment_id).first()
    if deployment is None:
        return
    row = BreakerTransition.objects.create(
        deployment=deployment, from_state=old, to_state=new, reason=reason[:300], actor=actor
    )
    metrics.breaker_transition(deployment.name, new)
    event = {
        "deployment": deployment.name,
        "provider": deployment.provider.name,
        "from": old,
        "to": new,
        "reason": reason,
        "actor": actor.get_username() if actor else None,
        "at": row.created_at.isoformat(),
    }
    log.warning("breaker %s: %s → %s (%s)", deployment.name, old, new, reason)
    try:
        async_to_sync(get_channel_layer().group_send)(CIRCUITS_GROUP, {"type": "circuit.transition", **event})
    except Exception:  # the live view is best effort; the audit row and webhooks are not
        log.exception("could not publish breaker transition to the live view")
    webhook_publish(event="breaker.transition", payload=event)


# --- what an operator sees and does ------------------------------------------------------------


def breaker_snapshot(deployment_id: int) -> dict:
    """The shared state as stored (for the admin and the live view)."""
    from sentinel.redis_clients import sync_redis

    key, _window = keys_for(deployment_id)
    try:
        state, forced, open_until, openings = sync_redis().hmget(key, "state", "forced", "open_until", "openings")
    except UNREACHABLE:
        return {"state": "unknown", "open_for_seconds": None, "openings": None}
    state = (state or b"closed").decode()
    if forced:
        state = "forced_" + forced.decode()
    remaining = None
    if state == "open" and open_until:
        remaining = max(0.0, int(open_until) / 1000 - time.time())
    return {"state": state, "open_for_seconds": remaining, "openings": int(openings or 0)}


def breaker_force(*, deployment, state: str, actor, reason: str) -> None:
    """Force a breaker open or closed (state "open" / "closed"), or give it back to automatic ("")."""
    from django.db import transaction

    from gateway.models import ControlAction
    from sentinel.localstate import announce_change
    from sentinel.redis_clients import sync_redis

    old = breaker_snapshot(deployment.pk)["state"]
    key, window = keys_for(deployment.pk)
    with transaction.atomic():
        type(deployment).objects.filter(pk=deployment.pk).update(forced_state=state)
        deployment.forced_state = state
        ControlAction.objects.create(
            action=f"force_{state}" if state else "release",
            subject=f"deployment {deployment.name}",
            reason=reason,
            actor=actor,
        )
        if state:
            sync_redis().hset(key, "forced", state)
            new = f"forced_{state}"
        else:
            # Back to automatic, from a clean slate.
            pipe = sync_redis().pipeline(transaction=True)  # the breaker and its window: one slot
            pipe.hset(key, mapping={"forced": "", "state": "closed", "openings": 0, "probes": 0, "probe_ok": 0})
            pipe.delete(window)
            pipe.execute()
            new = "closed"
        announce_change()
        breaker_transition(deployment_id=deployment.pk, old=old, new=new, reason=reason, actor=actor)


# --- without Redis -----------------------------------------------------------------------------


class LocalBreaker:
    def __init__(self) -> None:
        self.state = "closed"
        self.open_until = 0.0
        self.openings = 0
        self.probes = 0
        self.probe_ok = 0
        self.calls: list[tuple[float, str]] = []


class LocalBreakers:
    """This process's own breakers, with breakers.lua's rules, for while Redis is unreachable."""

    def __init__(self) -> None:
        self.breakers: dict[int, LocalBreaker] = {}

    def _get(self, target: Target) -> LocalBreaker:
        return self.breakers.setdefault(target.deployment_id, LocalBreaker())

    def permit(self, target: Target) -> tuple[bool, bool]:
        b = self._get(target)
        if b.state == "closed":
            return True, False
        if b.state == "open":
            if time.monotonic() < b.open_until:
                return False, False
            b.state, b.probes, b.probe_ok = "half_open", 0, 0
        if b.probes < target.policy.half_open_probes:
            b.probes += 1
            return True, True
        return False, False

    def _open(self, b: LocalBreaker, policy: Policy) -> None:
        b.openings += 1
        duration = min(policy.open_seconds * 2 ** (b.openings - 1), policy.max_open_seconds)
        b.state, b.open_until, b.calls = "open", time.monotonic() + duration, []

    def record(self, attempt: Attempt) -> str:
        b, policy = self._get(attempt.target), attempt.target.policy
        if b.state == "half_open":
            if not attempt.probe:
                return ""
            if attempt.outcome != "ok":
                self._open(b, policy)
                return "half_open>open"
            b.probe_ok += 1
            if b.probe_ok >= policy.half_open_probes:
                b.state, b.openings, b.calls = "closed", 0, []
                return "half_open>closed"
            return ""
        if b.state == "open":
            return ""
        now = time.monotonic()
        b.calls = [(t, o) for t, o in b.calls if t > now - policy.window_seconds] + [(now, attempt.outcome)]
        calls = len(b.calls)
        fails = sum(1 for _, o in b.calls if o == "fail")
        slows = sum(1 for _, o in b.calls if o == "slow")
        if calls >= policy.minimum_calls and (
            fails * 100 >= policy.failure_rate_percent * calls or slows * 100 >= policy.slow_rate_percent * calls
        ):
            self._open(b, policy)
            return "closed>open"
        return ""


_local = LocalBreakers()


def backoff_seconds(retry: int, retry_after: float | None) -> float:
    """Exponential backoff with full jitter (100 ms base, 2 s cap), or what the provider asked for."""
    import random

    if retry_after is not None:
        return retry_after
    return random.uniform(0, min(2.0, 0.1 * math.pow(2, retry)))
