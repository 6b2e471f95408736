"""Redis stall benchmark: what a Valkey that stops answering costs a request, and how soon it stops.

    python -m bench redis_stall [--requests 40] [--quick] [--out DIR]

Starts the stack (bench/stack.py) and one more Sentinel web process whose Redis is reached through a
proxy that can stop forwarding (tests/proxy.py): Valkey stalls for that process only, as a frozen
server would, while the stack's own processes keep theirs. Two tenants with a hard budget and rate
limits (so admission does its whole step), one failing open and one failing closed, send requests
one at a time: before the stall, during it, and right after it (the first requests after Valkey
answers again); then 16 at once during a second stall. Latency at the client (ms): median, p99 and
max per phase, and the median added by the stall. Prints a table; writes
bench/results/redis_stall.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import urllib.parse
import uuid
from decimal import Decimal

import httpx

from bench import report
from bench.stack import (
    MODEL_ALIAS,
    add_stack_arguments,
    running_stack,
    wait_ready,
)
from bench.stack import _python_child as python_child
from sentinel.startup import free_port

SCENARIO = "redis_stall"
LIMITS = {"requests_per_minute": 1_000_000, "tokens_per_minute": 1_000_000_000, "max_concurrent": 10_000}


def prepare() -> dict[str, str]:
    """A fail-open and a fail-closed tenant, each with a key, limits and a hard budget far above reach."""
    from sentinel.localstate import announce_change
    from tenants.models import Budget, Tenant
    from tenants.services import key_create

    run = uuid.uuid4().hex[:8]
    keys = {}
    for name, policy in (("fail_open", Tenant.RedisOutage.FAIL_OPEN), ("fail_closed", Tenant.RedisOutage.FAIL_CLOSED)):
        slug = f"stall-{policy}-{run}"
        tenant = Tenant.objects.create(name=f"stall {name}", slug=slug, on_redis_outage=policy, **LIMITS)
        Budget.objects.create(tenant=tenant, period="monthly", limit_usd=Decimal(1_000_000))
        keys[name] = key_create(tenant=tenant, name="stall", **LIMITS)[1]
    announce_change()
    return keys


def body(i: int) -> dict:
    return {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": f"stall {i} {uuid.uuid4().hex}"}]}


def one_by_one(client: httpx.Client, url: str, key: str, count: int) -> list[tuple[int, float]]:
    headers = {"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"}
    found = []
    for i in range(count):
        started = time.perf_counter()
        status = client.post(url, headers=headers, json=body(i)).status_code
        found.append((status, (time.perf_counter() - started) * 1000))
    return found


async def at_once(url: str, key: str, count: int) -> list[tuple[int, float]]:
    headers = {"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"}
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> tuple[int, float]:
            started = time.perf_counter()
            status = (await client.post(url, headers=headers, json=body(i))).status_code
            return status, (time.perf_counter() - started) * 1000

        return await asyncio.gather(*(one(i) for i in range(count)))


def summary(results: list[tuple[int, float]]) -> dict:
    times = sorted(ms for _, ms in results)
    statuses: dict[int, int] = {}
    for status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    return {
        "requests": len(results),
        "statuses": statuses,
        "p50_ms": round(times[len(times) // 2], 2),
        "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 2),
        "max_ms": round(times[-1], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench redis_stall", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=40, help="requests per tenant and phase")
    parser.add_argument("--quick", action="store_true", help="8 requests per tenant and phase: a smoke test")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    count = 8 if args.quick else args.requests
    from tests.proxy import StallingProxy

    result = report.envelope(SCENARIO, quick=args.quick)
    with running_stack(out_dir=args.out, data_dir=args.data_dir, workers=1, mock_profile="zero") as stack:
        from django.conf import settings

        valkey = urllib.parse.urlsplit(settings.REDIS_URL)
        with StallingProxy(valkey.port, valkey.hostname) as proxy:
            port = free_port()
            child = python_child("web-stall", "-m", "sentinel.web", "--host", "127.0.0.1", "--port", str(port))
            stack.children.append(child)
            # The same Valkey and database as the stack's, through the proxy.
            through_proxy = valkey._replace(netloc=valkey.netloc.replace(f":{valkey.port}", f":{proxy.port}"))
            child.start(stack.log_dir, {**os.environ, "REDIS_URL": through_proxy.geturl()})
            gateway = f"http://127.0.0.1:{port}"
            wait_ready(f"{gateway}/health/ready", stack.children, 120)
            keys = prepare()
            url = f"{gateway}/v1/chat/completions"
            phases: dict[str, dict] = {}
            with httpx.Client(timeout=60) as client:
                for key in keys.values():
                    one_by_one(client, url, key, 20)  # warm: key, route and connections cached
                for policy, key in keys.items():
                    phases[f"before/{policy}"] = summary(one_by_one(client, url, key, count))
                proxy.stall()
                for policy, key in keys.items():
                    phases[f"during/{policy}"] = summary(one_by_one(client, url, key, count))
                proxy.resume()
                for policy, key in keys.items():
                    phases[f"after/{policy}"] = summary(one_by_one(client, url, key, count))
                proxy.stall()
                phases["during, 16 at once/fail_open"] = summary(asyncio.run(at_once(url, keys["fail_open"], 16)))
                proxy.resume()
                phases["after, 16 at once/fail_open"] = summary(asyncio.run(at_once(url, keys["fail_open"], 16)))
    timeout_ms = int(os.environ.get("SENTINEL_REDIS_TIMEOUT_MS", 100))
    result["config"] = {"requests_per_phase": count, "redis_timeout_ms": timeout_ms}
    result["phases"] = phases
    for policy in ("fail_open", "fail_closed"):
        result[f"added_p50_ms/{policy}"] = round(
            phases[f"during/{policy}"]["p50_ms"] - phases[f"before/{policy}"]["p50_ms"], 2
        )
    rows = [
        [name, " ".join(f"{k}×{v}" for k, v in sorted(p["statuses"].items())), p["p50_ms"], p["p99_ms"], p["max_ms"]]
        for name, p in phases.items()
    ]
    print(report.table(["phase/tenant", "statuses", "p50 ms", "p99 ms", "max ms"], rows, title="Valkey stalls"))
    print(
        f"Added by the stall (median): fail open {result['added_p50_ms/fail_open']} ms, "
        f"fail closed {result['added_p50_ms/fail_closed']} ms"
    )
    path = report.write_json(args.out, SCENARIO, result)
    print(f"Results: {path}")
    return 0
