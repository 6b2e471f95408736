"""Latency-aware balancing benchmark: two deployments sharing a chain position, one of which slows
down half-way, served by round-robin, by weighted choice (Sentinel's choice before #23) and by
gateway.upstream.balancing's power of two choices over peak-EWMA. No servers: a discrete-event
simulation in virtual time drives the real Balancer, so the split and the latencies are the
algorithm's alone, reproducible (seeded) and independent of the machine.

    python -m bench balancing [--requests 20000] [--rate 20] [--seed 1]

Each deployment answers in a lognormal time around its mean, stretched by its own load (a server
running n calls is (1 + n / capacity) times slower). Deployment A: 200 ms; B: 200 ms, then 1,000 ms
from the middle of the run. Writes bench/results/balancing.json.

    python -m bench balancing --http [--quick] [--rate 20] [--phase 15] [--fast-ms 50] [--slow-ms 250]

The same question over real HTTP: a running stack (mock provider, Sentinel's web workers), two
virtual providers of the mock sharing one chain position, each adding --fast-ms to its answers; B
adds --slow-ms instead in the second phase. Requests arrive at --rate a second (open loop). P2C is
Sentinel's own choice (one alias, both deployments at position 0); round-robin and weighted choice
are made by the client between two aliases of one deployment each, so every strategy goes through
the same gateway and mock. The mock's latency does not grow with its load (unlike the simulation's
servers): the split and the percentiles show the choice alone. Writes bench/results/balancing_http.json.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import math
import random
import time
import uuid
from dataclasses import dataclass

import httpx

from bench.report import envelope, percentile, table, write_json

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


# --- over real HTTP -----------------------------------------------------------------------------

HTTP_PROVIDERS = ("balancing-a", "balancing-b")


def prepare_aliases(mock_url: str) -> dict[str, str]:
    """Three aliases: "both" (A and B at one chain position: Sentinel balances) and "a", "b" (one
    deployment each: the client chooses). Their names, by role."""
    from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
    from sentinel.localstate import announce_change

    suffix = uuid.uuid4().hex[:8]
    deployments = []
    for name in HTTP_PROVIDERS:
        provider, _ = Provider.objects.update_or_create(
            name=name, defaults={"kind": "openai", "api_base": f"{mock_url}/p/{name}/v1", "max_retries": 0}
        )
        provider.set_api_key("sk-mock-balancing")
        provider.save()
        deployments.append(
            Deployment.objects.create(
                name=f"{name}-{suffix}", provider=provider, litellm_model="openai/gpt-4o-mini", weight=1
            )
        )
    aliases = {"both": f"balancing-{suffix}", "a": f"balancing-a-{suffix}", "b": f"balancing-b-{suffix}"}
    for role, alias_name in aliases.items():
        alias = ModelAlias.objects.create(name=alias_name)
        chain = deployments if role == "both" else [deployments[role == "b"]]
        for deployment in chain:
            ChainEntry.objects.create(alias=alias, deployment=deployment, position=0)
    announce_change()
    return aliases


async def http_phase(url: str, key: str, aliases: dict[str, str], strategy: str, *, rate: float, seconds: float):
    """Send `rate` requests a second for `seconds`, each to the alias the strategy picks; returns
    (deployment letter or "" on failure, client latency in seconds) per request."""
    rng = random.Random(1)
    round_robin = itertools.cycle("ab")
    results: list[tuple[str, float]] = []
    headers = {"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"}

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=500)) as client:

        async def one(i: int) -> None:
            if strategy == "round-robin":
                alias = aliases[next(round_robin)]
            elif strategy == "weighted":
                alias = aliases[rng.choice("ab")]
            else:
                alias = aliases["both"]
            body = {"model": alias, "messages": [{"role": "user", "content": f"balancing {i}"}], "max_tokens": 5}
            sent = time.perf_counter()
            try:
                response = await client.post(url, json=body, headers=headers)
            except httpx.HTTPError:
                results.append(("", time.perf_counter() - sent))
                return
            took = time.perf_counter() - sent
            provider = response.headers.get("x-sentinel-provider", "") if response.status_code == 200 else ""
            results.append(({HTTP_PROVIDERS[0]: "a", HTTP_PROVIDERS[1]: "b"}.get(provider, ""), took))

        pending = []
        started = time.perf_counter()
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))
            pending.append(asyncio.create_task(one(i)))
        await asyncio.gather(*pending)
    return results


def summarize(results: list[tuple[str, float]]) -> dict:
    answered = [took for letter, took in results if letter]
    return {
        "requests": len(results),
        "failures": len(results) - len(answered),
        "share_a": sum(1 for letter, _ in results if letter == "a") / max(1, len(answered)),
        "p50_ms": percentile(answered, 0.5) * 1000 if answered else None,
        "p99_ms": percentile(answered, 0.99) * 1000 if answered else None,
    }


def over_http(args) -> int:
    from bench import report
    from bench.stack import running_stack

    rate, phase = (10.0, 4.0) if args.quick else (args.rate, args.phase)
    result = report.envelope("balancing_http", quick=args.quick)
    result["config"] = {
        "rate_rps": rate,
        "phase_seconds": phase,
        "fast_ms": args.fast_ms,
        "slow_ms": args.slow_ms,
        "web_workers": args.workers,
    }
    results: dict[str, dict] = {}
    with running_stack(out_dir=args.out, data_dir=args.data_dir, workers=args.workers, ledger_worker=False) as stack:
        aliases = prepare_aliases(stack.mock_url)
        for strategy in ("round-robin", "p2c-peak-ewma"):  # warm every worker's routes and connections up
            asyncio.run(http_phase(stack.sentinel_url, stack.key, aliases, strategy, rate=rate, seconds=2))
        time.sleep(6)

        def slow(provider: str, ms: float) -> None:
            httpx.post(f"{stack.mock_url}/_control/{provider}", json={"slow_ms": ms}, timeout=5).raise_for_status()

        for strategy in ("round-robin", "weighted", "p2c-peak-ewma"):
            results[strategy] = {}
            for half, b_ms in (("first half", args.fast_ms), ("second half", args.slow_ms)):
                slow(HTTP_PROVIDERS[0], args.fast_ms)
                slow(HTTP_PROVIDERS[1], b_ms)
                outcome = asyncio.run(
                    http_phase(stack.sentinel_url, stack.key, aliases, strategy, rate=rate, seconds=phase)
                )
                results[strategy][half] = summarize(outcome)
            slow(HTTP_PROVIDERS[1], args.fast_ms)
            time.sleep(6)  # the next strategy starts with B fast and forgotten as slow (the estimate decays in 5 s)
    rows = [
        [strategy, half, r["requests"], r["failures"], f"{r['share_a']:.0%}", r["p50_ms"], r["p99_ms"]]
        for strategy, halves in results.items()
        for half, r in halves.items()
    ]
    print(
        table(
            ["strategy", "phase (B slow in the second)", "requests", "failures", "share to A", "p50 ms", "p99 ms"],
            rows,
            title=f"Balancing over HTTP ({rate:g} requests/s, {phase:g} s phases, A {args.fast_ms:g} ms, "
            f"B {args.fast_ms:g} then {args.slow_ms:g} ms)",
        )
    )
    result["results"] = results
    path = write_json(args.out, "balancing_http", result)
    print(f"Results: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from bench.stack import add_stack_arguments

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=20.0, help="arrivals per (virtual or real) second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--http", action="store_true", help="over real HTTP: mock, gateway, real time")
    parser.add_argument("--quick", action="store_true", help="--http: 4-second phases at 10 requests/s")
    parser.add_argument("--phase", type=float, default=15.0, help="--http: seconds per phase")
    parser.add_argument("--fast-ms", type=float, default=50.0, help="--http: A's latency, and B's at first")
    parser.add_argument("--slow-ms", type=float, default=250.0, help="--http: B's latency in the second phase")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    if args.http:
        return over_http(args)
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
    write_json(
        args.out,
        "balancing",
        {
            **envelope("balancing", quick=False),
            "args": {k: getattr(args, k) for k in ("requests", "rate", "seed")},
            "results": results,
        },
    )
    return 0
