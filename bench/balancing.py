"""Latency-aware balancing benchmark: two deployments sharing a chain position, one of which slows
down half-way, served by round-robin, by weighted choice (Sentinel's choice before #23) and by
gateway.upstream.balancing's power of two choices over peak-EWMA. No servers: a discrete-event
simulation in virtual time drives the real Balancer, so the split and the latencies are the
algorithm's alone, reproducible (seeded) and independent of the machine.

    python -m bench balancing [--requests 20000] [--rate 20] [--seed 1]

Each deployment answers in a lognormal time around its mean, stretched by its own load (a server
running n calls is (1 + n / capacity) times slower). Deployment A: 200 ms; B: 200 ms, then 1,000 ms
from the middle of the run. Writes bench/results/balancing.json.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
from dataclasses import dataclass

from bench.report import envelope, percentile, table, write_json
from bench.stack import RESULTS_DIR

CAPACITY = 16  # calls a deployment runs before it slows down in proportion


@dataclass(frozen=True)
class Peer:
    """What the balancer reads of a deployment (gateway.upstream.routing.Target has more, and Django)."""

    deployment_id: int
    deployment: str
    weight: int = 1


def targets() -> list:
    return [Peer(1, "a"), Peer(2, "b")]


def simulate(strategy: str, *, requests: int, rate: float, seed: int) -> dict:
    from gateway.upstream.balancing import Balancer

    rng = random.Random(seed)
    peers = targets()
    balancer = Balancer()
    in_flight = {t.deployment_id: 0 for t in peers}
    round_robin = itertools.cycle(peers)
    done: list[tuple[float, int, int, float]] = []  # (finish time, sequence, deployment id, started)
    latencies: dict[str, list[float]] = {"first half": [], "second half": []}
    served = {"first half": {"a": 0, "b": 0}, "second half": {"a": 0, "b": 0}}
    now = 0.0

    def finish_until(moment: float) -> None:
        while done and done[0][0] <= moment:
            at, _, deployment_id, started = heapq.heappop(done)
            in_flight[deployment_id] -= 1
            estimate = balancer._estimate(deployment_id)
            estimate.in_flight -= 1
            estimate.observe(at - started, at)

    for i in range(requests):
        now += rng.expovariate(rate)
        finish_until(now)
        half = "first half" if i < requests // 2 else "second half"
        if strategy == "round-robin":
            chosen = next(round_robin)
        elif strategy == "weighted":
            chosen = rng.choices(peers, weights=[t.weight for t in peers])[0]
        else:
            chosen = balancer.order(peers, rng, now=now)[0]
        mean = 0.2 if chosen.deployment == "a" or half == "first half" else 1.0
        took = mean * math.exp(rng.gauss(0, 0.25)) * (1 + in_flight[chosen.deployment_id] / CAPACITY)
        in_flight[chosen.deployment_id] += 1
        balancer._estimate(chosen.deployment_id).in_flight += 1
        heapq.heappush(done, (now + took, i, chosen.deployment_id, now))
        latencies[half].append(took)
        served[half][chosen.deployment] += 1
    return {
        half: {
            "share_a": served[half]["a"] / sum(served[half].values()),
            "p50_ms": percentile(latencies[half], 0.5) * 1000,
            "p99_ms": percentile(latencies[half], 0.99) * 1000,
        }
        for half in latencies
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=20.0, help="arrivals per (virtual) second")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    results = {
        strategy: simulate(strategy, requests=args.requests, rate=args.rate, seed=args.seed)
        for strategy in ("round-robin", "weighted", "p2c-peak-ewma")
    }
    rows = [
        [strategy, half, f"{r['share_a']:.0%}", f"{r['p50_ms']:.0f}", f"{r['p99_ms']:.0f}"]
        for strategy, halves in results.items()
        for half, r in halves.items()
    ]
    print(table(["strategy", "phase (B slow in the second)", "share to A", "p50 ms", "p99 ms"], rows))
    write_json(RESULTS_DIR, "balancing", {**envelope("balancing", quick=False), "args": vars(args), "results": results})
    return 0
