"""Scenario 7, durability: a steady load; mid-run a web worker is killed with SIGKILL, then the Celery
worker that moves the ledger to Postgres (it is started again, as a supervisor would). After the
queue drains: every answer a client received has exactly one ledger row, matched by request id.

Requests in flight on the killed worker get a connection error; if their record was handed off
before the kill, their row exists too (counted separately: billed work the client did not see).

    python -m bench durability [--quick] [--rate R] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
import uuid

import httpx
import psutil

from bench import report
from bench.stack import MODEL_ALIAS, add_stack_arguments, running_stack, web_server
from bench.stack import _python_child as python_child

SCENARIO = "durability"
CLAIM_IDLE_MS = 3000  # how soon another worker takes over a dead worker's unacknowledged records


async def steady(url: str, key: str, rate: float, seconds: float, run: str, outcomes: dict, events) -> None:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as client:

        async def one(i: int) -> None:
            request_id = f"{run}-{i}"
            body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": f"durable {run} {i}"}]}
            headers = {
                "authorization": f"Bearer {key}",
                "x-sentinel-request-id": request_id,
                "x-sentinel-cache-control": "no-cache, no-store",
            }
            try:
                response = await client.post(url, json=body, headers=headers)
                outcomes[request_id] = response.status_code
            except httpx.HTTPError:
                outcomes[request_id] = 0

        tasks = []
        started = time.monotonic()
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
            for at, action in list(events):
                if time.monotonic() - started >= at:
                    events.remove((at, action))
                    action()
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)


def ledger_rows(run: str) -> dict[str, list[int]]:
    from billing.models import LedgerEntry

    rows: dict[str, list[int]] = {}
    for request_id, status in LedgerEntry.objects.filter(request_id__startswith=f"{run}-").values_list(
        "request_id", "status_code"
    ):
        rows.setdefault(request_id, []).append(status)
    return rows


def wait_drained(timeout: float) -> bool:
    from billing.ledger import GROUP, STREAM
    from sentinel.redis_clients import sync_redis

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = sync_redis().xpending(STREAM, GROUP)["pending"]
        if sync_redis().xlen(STREAM) == 0 and pending == 0:
            return True
        time.sleep(0.5)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench durability", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run: a smoke test")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    rate, seconds = (30.0, 6.0) if args.quick else (args.rate, args.seconds)
    os.environ["SENTINEL_LEDGER_CLAIM_IDLE_MS"] = str(CLAIM_IDLE_MS)
    run = f"dur-{uuid.uuid4().hex[:8]}"
    result = report.envelope(SCENARIO, quick=args.quick)
    result["config"] = {
        "rate_rps": rate,
        "seconds": seconds,
        "claim_idle_ms": CLAIM_IDLE_MS,
        "web_server": web_server(args),
        "mock": "zero latency",
    }
    killed: dict[str, object] = {}
    with running_stack(out_dir=args.out, data_dir=args.data_dir, workers=args.workers, mock_profile="zero") as stack:

        def kill_web_worker() -> None:
            victim = psutil.Process(stack.child("web").process.pid).children()[0]
            killed["web_worker"] = victim.pid
            os.kill(victim.pid, signal.SIGKILL)

        def kill_ledger_worker() -> None:
            worker = stack.child("worker")
            killed["ledger_worker"] = worker.process.pid
            os.killpg(worker.process.pid, signal.SIGKILL)
            worker.process.wait()
            stack.children.remove(worker)
            replacement = python_child("worker", *worker.argv[1:])
            stack.children.append(replacement)
            replacement.start(stack.log_dir, dict(os.environ))

        outcomes: dict[str, int] = {}
        events = [(seconds * 0.35, kill_web_worker), (seconds * 0.6, kill_ledger_worker)]
        asyncio.run(steady(stack.sentinel_url, stack.key, rate, seconds, run, outcomes, events))
        drained = wait_drained(CLAIM_IDLE_MS / 1000 + 60)
        rows = ledger_rows(run)
    answered = {rid for rid, status in outcomes.items() if status == 200}
    failed = {rid for rid, status in outcomes.items() if status != 200}
    result["killed"] = killed
    result["figures"] = {
        "requests": len(outcomes),
        "answered_200": len(answered),
        "client_errors": len(failed),
        "queue_drained": drained,
        "answered_without_a_row": len([rid for rid in answered if rid not in rows]),
        "rows_duplicated": sum(1 for statuses in rows.values() if len(statuses) > 1),
        "rows_for_answers": sum(1 for rid in answered if rid in rows),
        "rows_for_failed_requests": len([rid for rid in failed if rid in rows]),
    }
    figures = result["figures"]
    print(
        report.table(
            ["figure", "value"],
            [[k.replace("_", " "), v] for k, v in figures.items()],
            title=f"Durability ({len(outcomes)} requests; web worker and ledger worker killed with SIGKILL; one run)",
        )
    )
    ok = figures["answered_without_a_row"] == 0 and figures["rows_duplicated"] == 0 and drained
    print("Every answer has exactly one ledger row." if ok else "LOST OR DUPLICATED LEDGER ROWS")
    path = report.write_json(args.out, SCENARIO, result)
    print(f"Results: {path}")
    return 0 if ok else 1
