"""Ledger benchmark: what handing a record off costs the request path, and how fast workers move
queued records into Postgres.

    python -m bench.ledger [--handoffs 20000] [--concurrency 64] [--records 50000] [--batch-size 1000] [--quick]

(a) hand-off: `billing.ledger.hand_off` (encode + one XADD) awaited in an asyncio loop against the
    embedded Valkey, one at a time (latency) and `--concurrency` at once (a busy gateway process);
(b) drain: `billing.ledger.drain` moving `--records` queued records into Postgres, in rows/s.

Uses the embedded servers under SENTINEL_DATA_DIR (default `.data/bench`, so a `make run` is never
touched) unless DATABASE_URL / REDIS_URL are set. Prints a table; writes bench/results/ledger.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

from bench.report import percentile
from bench.stack import RESULTS_DIR, start_django


def bench_tenant():
    from tenants.models import Tenant, VirtualKey
    from tenants.services import key_create

    tenant, _ = Tenant.objects.get_or_create(slug="bench-ledger", defaults={"name": "Ledger benchmark"})
    key = VirtualKey.objects.filter(tenant=tenant).first() or key_create(tenant=tenant, name="bench")[0]
    return tenant, key


def make_record(tenant_id: int, key_id: int, i: int):
    from billing.ledger import LedgerRecord
    from billing.money import format_usd

    prompt, completion = 20 + i % 300, 40
    return LedgerRecord(
        request_id=f"req_bench{i:012d}",
        tenant_id=tenant_id,
        key_id=key_id,
        model_requested="gpt-4o-mini",
        status_code=200,
        model_served="openai/gpt-4o-mini",
        deployment="mock-primary-gpt-4o-mini",
        provider="mock-primary",
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_usd=format_usd(prompt * Decimal("0.00000015") + completion * Decimal("0.0000006")),
        latency_ms=3 + i % 50,
    )


async def measure_hand_off(records: list, concurrency: int) -> dict:
    from billing.ledger import hand_off

    half = len(records) // 2
    for record in records[:200]:  # warm the connection pool and the code path
        await hand_off(record)

    serial = []
    cpu = time.process_time()
    for record in records[200:half]:
        started = time.perf_counter()
        await hand_off(record)
        serial.append((time.perf_counter() - started) * 1e6)
    serial_cpu = (time.process_time() - cpu) / len(serial) * 1e6

    concurrent: list[float] = []
    queue = iter(records[half:])

    async def worker() -> None:
        for record in queue:
            started = time.perf_counter()
            await hand_off(record)
            concurrent.append((time.perf_counter() - started) * 1e6)

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, concurrent_cpu = time.perf_counter() - wall, (time.process_time() - cpu) / len(concurrent) * 1e6

    encode = []
    for record in records[:2000]:
        started = time.perf_counter()
        record.encode()
        encode.append((time.perf_counter() - started) * 1e6)
    return {
        "serial_count": len(serial),
        "serial_p50_us": round(statistics.median(serial), 1),
        "serial_p99_us": round(percentile(serial, 0.99), 1),
        # CPU this process spent per hand-off: what the request path pays, whatever the machine's load.
        "serial_cpu_us": round(serial_cpu, 1),
        "concurrency": concurrency,
        "concurrent_count": len(concurrent),
        "concurrent_p50_us": round(statistics.median(concurrent), 1),
        "concurrent_p99_us": round(percentile(concurrent, 0.99), 1),
        "concurrent_per_s": round(len(concurrent) / wall),
        "concurrent_cpu_us": round(concurrent_cpu, 1),
        "encode_p50_us": round(statistics.median(encode), 1),
    }


def fill_queue(records: list) -> None:
    from billing.ledger import STREAM
    from sentinel.redis_clients import sync_redis

    pipe = sync_redis().pipeline(transaction=False)
    for i, record in enumerate(records, 1):
        pipe.xadd(STREAM, {"r": record.encode()})
        if i % 5000 == 0:
            pipe.execute()
    pipe.execute()


def measure_drain(tenant, expected: int, batch_size: int) -> dict:
    from billing.ledger import drain, pending_count
    from billing.models import LedgerEntry

    before = LedgerEntry.objects.filter(tenant=tenant).count()
    queued = pending_count()
    moved, batches = 0, []
    wall = time.perf_counter()
    while True:
        started = time.perf_counter()
        count = drain(batch_size=batch_size, max_batches=1)
        if not count:
            break
        batches.append((time.perf_counter() - started) * 1000)
        moved += count
    wall = time.perf_counter() - wall
    in_postgres = LedgerEntry.objects.filter(tenant=tenant).count()
    return {
        "queued": queued,
        "moved": moved,
        "inserted_for_bench": in_postgres - before,
        # Every record of the run, however it got there: a hand-off that found Redis silent for the
        # request path's timeout wrote its record straight into Postgres (before the drain started).
        "written_directly": before,
        "in_postgres": in_postgres,
        "expected": expected,
        "batch_size": batch_size,
        "seconds": round(wall, 3),
        "rows_per_s": round(moved / wall) if wall else None,
        "batch_p50_ms": round(statistics.median(batches), 1) if batches else None,
        "batch_p99_ms": round(percentile(batches, 0.99), 1) if batches else None,
    }


def clean_up(tenant) -> None:
    from billing.models import DailyRollup, LedgerEntry, RollupDue

    LedgerEntry.objects.filter(tenant=tenant).delete()
    RollupDue.objects.filter(tenant=tenant).delete()
    DailyRollup.objects.filter(tenant=tenant).delete()


def print_table(result: dict) -> None:
    h, d = result["hand_off"], result["drain"]
    c = h["concurrency"]
    rows = [
        ("hand-off, one at a time, p50 / p99 (µs)", f"{h['serial_p50_us']} / {h['serial_p99_us']}"),
        (f"hand-off, {c} at once, p50 / p99 (µs)", f"{h['concurrent_p50_us']} / {h['concurrent_p99_us']}"),
        (f"hand-offs per second, {c} at once", h["concurrent_per_s"]),
        (f"CPU per hand-off, one / {c} at once (µs)", f"{h['serial_cpu_us']} / {h['concurrent_cpu_us']}"),
        ("record encoding alone, p50 (µs)", h["encode_p50_us"]),
        (f"drain: records moved (batches of {d['batch_size']})", f"{d['moved']} in {d['seconds']} s"),
        ("drain throughput (rows/s into Postgres)", d["rows_per_s"]),
        ("drain batch p50 / p99 (ms)", f"{d['batch_p50_ms']} / {d['batch_p99_ms']}"),
        ("written straight to Postgres (Redis silent)", d["written_directly"]),
        ("the run's rows in Postgres / expected", f"{d['in_postgres']} / {d['expected']}"),
    ]
    width = max(len(label) for label, _ in rows)
    print()
    print(f"{'ledger':<{width}}  value")
    print(f"{'-' * width}  {'-' * 16}")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger", description=__doc__.splitlines()[0])
    parser.add_argument("--handoffs", type=int, default=20_000, help="records handed off in (a)")
    parser.add_argument("--concurrency", type=int, default=64, help="hand-offs in flight in (a)'s second half")
    parser.add_argument("--records", type=int, default=50_000, help="records queued for (b)")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="smoke test: 2,000 hand-offs, 5,000 records")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where results go (default bench/results)")
    parser.add_argument("--data-dir", type=Path, default=None, help="embedded servers' folder (default .data/bench)")
    args = parser.parse_args(argv)
    if args.quick:
        args.handoffs, args.records = 2_000, 5_000

    start_django(args.data_dir)
    from billing.ledger import drain, pending_count

    while drain():  # start from an empty queue: whatever is left from earlier runs goes in first
        pass
    if pending_count():
        print("The ledger queue holds records another consumer has not acknowledged; retry later.")
        return 1
    tenant, key = bench_tenant()
    clean_up(tenant)

    records = [make_record(tenant.pk, key.pk, i) for i in range(max(args.handoffs, args.records))]
    hand_off = asyncio.run(measure_hand_off(records[: args.handoffs], args.concurrency))
    fill_queue(records[args.handoffs : args.records])  # (a) queued the first ones already
    drained = measure_drain(tenant, expected=max(args.handoffs, args.records), batch_size=args.batch_size)
    clean_up(tenant)

    from bench import report

    result = {**report.envelope("ledger", quick=args.quick), "hand_off": hand_off, "drain": drained}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ledger.json").write_text(json.dumps(result, indent=2))
    print_table(result)
    print(f"written to {args.out / 'ledger.json'}")
    if drained["in_postgres"] != drained["expected"]:
        print(f"ERROR: {drained['in_postgres']} of the run's rows are in Postgres, expected {drained['expected']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
