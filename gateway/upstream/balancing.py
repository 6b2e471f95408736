"""Latency-aware choice among deployments that share a chain position: power of two choices over a
peak-EWMA latency estimate and the calls in flight (after Finagle's and Linkerd's PeakEWMA, as
Helicone balances).

Two peers are drawn by weight, as before; the second takes the request only when it is clearly
cheaper than the first (PREFERENCE_MARGIN times, latencies counted from LATENCY_FLOOR_SECONDS). So
the weights stay the priors: deployments about as fast as each other share traffic by weight, and a
clearly slower one loses it. A deployment's cost is (its estimate + the floor) times (its calls in
flight + 1); the floor keeps a few milliseconds of jitter between fast deployments from deciding.

The estimate jumps to a slower observation at once (the "peak"), moves toward faster ones by DECAY
per call, and decays toward zero while the deployment is not called (DECAY_SECONDS), so a deployment
that was slow is tried again after a while and its recovery is seen. Latency is the time to the
first token for streams, the whole call otherwise; a failed call counts as at least
FAILURE_PENALTY_SECONDS; a call the client abandoned, or a bad request, is not counted.

Kept per process, on purpose: every process measures the same upstreams, so their estimates agree
without coordination, and in-flight counts are what this process adds to a deployment's load (the
deployments' own concurrency limits and saturation, shared through Redis, bound the total). Sharing
the estimate would cost a Redis round trip per call for little better choice. Written by hand: the
algorithm is a few lines, and the balancing libraries (gRPC's, Finagle's) do not fit litellm's calls.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.upstream.failures import UpstreamError

if TYPE_CHECKING:
    from gateway.upstream.routing import Target

DECAY_SECONDS = 5.0  # an unobserved estimate falls to 1/e in this time
DECAY = 0.3  # the share of a faster observation in the new estimate
LATENCY_FLOOR_SECONDS = 0.05
PREFERENCE_MARGIN = 2.0
FAILURE_PENALTY_SECONDS = 1.0


@dataclass
class Estimate:
    latency: float = 0.0  # seconds; 0: never observed, so tried first
    at: float = 0.0  # monotonic time of the last update
    in_flight: int = 0

    def decayed(self, now: float) -> float:
        if not self.latency:
            return 0.0
        return self.latency * math.exp(-max(now - self.at, 0.0) / DECAY_SECONDS)

    def observe(self, seconds: float, now: float) -> None:
        current = self.decayed(now)
        # A slower call counts at once; faster ones (and the first) bring it down call by call.
        self.latency = seconds if seconds > current or not current else current * (1 - DECAY) + seconds * DECAY
        self.at = now


class Balancer:
    def __init__(self) -> None:
        self.estimates: dict[int, Estimate] = {}

    def _estimate(self, deployment_id: int) -> Estimate:
        return self.estimates.setdefault(deployment_id, Estimate())

    def cost(self, target: Target, now: float | None = None) -> float:
        estimate = self._estimate(target.deployment_id)
        now = time.monotonic() if now is None else now
        return (estimate.decayed(now) + LATENCY_FLOOR_SECONDS) * (estimate.in_flight + 1)

    def order(self, peers: Sequence[Target], rng: random.Random, now: float | None = None) -> list[Target]:
        """Peers in the order to try them: two drawn by weight, the first unless the second is
        clearly cheaper; then the rest, cheapest first (the fallbacks within the position)."""
        if len(peers) < 2:
            return list(peers)
        now = time.monotonic() if now is None else now
        first, second = _two_by_weight(peers, rng)
        costs = {t.deployment_id: self.cost(t, now) for t in peers}
        clearly_cheaper = costs[second.deployment_id] * PREFERENCE_MARGIN < costs[first.deployment_id]
        chosen = second if clearly_cheaper else first
        rest = sorted((t for t in peers if t is not chosen), key=lambda t: costs[t.deployment_id])
        return [chosen, *rest]

    @contextmanager
    def measuring(self, target: Target) -> Iterator[None]:
        """Around one call: counts it in flight, and observes how long it took (a call the client
        abandoned is not observed)."""
        estimate = self._estimate(target.deployment_id)
        estimate.in_flight += 1
        started = time.monotonic()
        try:
            yield
        except UpstreamError as error:
            if not error.client_fault:  # a bad request says nothing about the deployment
                now = time.monotonic()
                estimate.observe(max(now - started, FAILURE_PENALTY_SECONDS), now)
            raise
        else:
            now = time.monotonic()
            estimate.observe(now - started, now)
        finally:
            estimate.in_flight -= 1


def _two_by_weight(peers: Sequence[Target], rng: random.Random) -> tuple[Target, Target]:
    first = rng.choices(peers, weights=[max(t.weight, 0) or 1e-9 for t in peers])[0]
    others = [t for t in peers if t is not first]
    second = rng.choices(others, weights=[max(t.weight, 0) or 1e-9 for t in others])[0]
    return first, second


balancer = Balancer()
