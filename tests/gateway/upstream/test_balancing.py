"""Latency-aware balancing (gateway.upstream.balancing) among deployments sharing a chain position:
the mock slows one down, then the other, and traffic follows the faster (counts, never timings)."""

from __future__ import annotations

import random
import time

import httpx

from gateway.models import ChainEntry
from gateway.upstream.balancing import Balancer, Estimate
from gateway.upstream.routing import Target
from sentinel.localstate import announce_change
from tests.gateway.upstream.targets import target as plain_target


def served_by(gateway, key: str, model: str, count: int, prompt: str) -> list[str]:
    return [
        httpx.post(
            f"{gateway.base_url}/chat/completions",
            headers={"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"},
            json={"model": model, "messages": [{"role": "user", "content": f"{prompt} {i}"}]},
            timeout=30,
        ).headers["x-sentinel-provider"]
        for i in range(count)
    ]


def test_traffic_follows_the_faster_deployment(gateway, api_key, make_model, mock_provider):
    model, (a, b) = make_model(chain_length=2)
    ChainEntry.objects.filter(alias__name=model).update(position=0)
    announce_change()
    mock_provider.control(a, slow_ms=500)
    first = served_by(gateway, api_key, model, 12, "a slow")
    # At most the one call that measured it: from then on the fast one is clearly cheaper.
    assert first.count(a) <= 1
    assert first.count(b) >= 11

    mock_provider.control(a, slow_ms=0)
    mock_provider.control(b, slow_ms=500)
    then = served_by(gateway, api_key, model, 40, "b slow")
    assert then.count(a) >= 25  # B is tried until its slowness is seen, A until its speed is
    assert then[-10:] == [a] * 10
    assert mock_provider.stats(a)["calls"] + mock_provider.stats(b)["calls"] == 52  # no failover


def target(deployment_id: int, weight: int = 1) -> Target:
    return plain_target(deployment_id=deployment_id, deployment=f"d{deployment_id}", weight=weight)


def test_weights_stay_the_priors_among_equally_fast_deployments():
    """Equally fast (or never measured) peers are drawn by weight; a clearly slower one loses its turn;
    calls in flight count against a deployment."""
    balancer, rng = Balancer(), random.Random(7)
    heavy, light = target(1, weight=3), target(2, weight=1)
    firsts = [balancer.order([heavy, light], rng)[0].deployment_id for _ in range(400)]
    assert 250 <= firsts.count(1) <= 350  # 300 expected
    now = time.monotonic()
    balancer.estimates[1] = Estimate(latency=0.5, at=now)  # measured slow just now
    balancer.estimates[2] = Estimate(latency=0.01, at=now)
    assert balancer.cost(heavy, now=now) > 2 * balancer.cost(light, now=now)
    assert {balancer.order([heavy, light], rng)[0].deployment_id for _ in range(50)} == {2}
    balancer.estimates[2].in_flight = 20  # fast, but busy: 20 calls of this process in flight
    assert balancer.cost(light, now=now) > balancer.cost(heavy, now=now)
