"""Capacity model: what one request costs each part of a deployment, measured, and how many of each
part a deployment needs for 1k, 10k and 100k requests/s (docs/capacity.md).

    python -m bench capacity [--requests 3000] [--concurrency 16] [--quick]

Starts the stack `make run` starts (web workers, ledger worker, beat, embedded PostgreSQL and
Valkey unless DATABASE_URL / REDIS_URL are set; zero-latency mock) and sends each load in turn:

- `cache on, misses`: the default a tenant gets, every prompt new (looked up, answered, stored);
- `cache on, exact hits`: one prompt asked again and again;
- `cache bypassed`: `no-cache, no-store` per request (the gateway's own cost);
- `cache on, misses, streamed`.

For each, after the ledger worker has drained every record and PostgreSQL has published its
writes, it reads what changed: CPU seconds of the web workers, the ledger worker (and beat),
Valkey and PostgreSQL (all their processes: CPU time, not wall time, so a busy shared machine
still gives each part's own cost), Valkey's commands (INFO commandstats: calls inside scripts
included) and PostgreSQL's write transactions and WAL bytes, per answered request; CPU and
commands less what the stack does idle in as long (beat's jobs, the worker's polling), which is
reported on its own.
"""

from __future__ import annotations

import argparse
import math
import time
import uuid

import psutil

from bench import loadgen, report
from bench.stack import CACHE_MODES, MODEL_ALIAS, add_stack_arguments, running_stack, web_server

SCENARIO = "capacity"
TARGETS_RPS = (1_000, 10_000, 100_000)
# Parts are planned to run at this share of their CPU: room for bursts and for a part to fail over.
UTILISATION = 0.6

LOADS = [
    ("cache on, misses", "miss", False, "unique"),
    ("cache on, exact hits", "miss", False, "same"),
    ("cache bypassed", "bypass", False, "unique"),
    ("cache on, misses, streamed", "miss", True, "unique"),
]


def valkey_counters() -> dict:
    from sentinel.redis_clients import sync_redis

    redis = sync_redis()
    stats = redis.info("commandstats")
    cpu = redis.info("cpu")
    return {
        "commands": {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()},
        "cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
    }


def postgres_counters() -> dict:
    """Write transactions (transaction ids handed out) and WAL bytes so far: both are read at once,
    unlike pg_stat_database, which a busy backend publishes at most once a second and an idle one
    within ten."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
        )
        xmax, wal = cursor.fetchone()
    return {"write_transactions": xmax, "wal_bytes": wal}


def ledger_count() -> int:
    from billing.models import LedgerEntry

    return LedgerEntry.objects.count()


def process_cpu(stack) -> dict[str, float]:
    """CPU seconds so far by part; a process that left between two readings takes its CPU with it
    (none should: the stack's processes live through the run)."""
    spent: dict[str, float] = {}
    for name, process in stack.processes().values():
        part = name.split(":")[0].split("-")[0]
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        # A Postgres backend's children are none; a web root's children are its uvicorn workers.
        spent[part] = spent.get(part, 0.0) + times.user + times.system + times.children_user + times.children_system
    return spent


def snapshot(stack) -> dict:
    return {
        "at": time.monotonic(),
        "cpu": process_cpu(stack),
        "valkey": valkey_counters(),
        "postgres": postgres_counters(),
    }


def flat(reading: dict) -> dict[str, float]:
    """A snapshot's counters under one name each (cpu.web, valkey.get, postgres.commits, ...)."""
    found = {f"cpu.{part}": spent for part, spent in reading["cpu"].items()}
    found["valkey_cpu"] = reading["valkey"]["cpu_s"]
    found.update({f"valkey.{name}": calls for name, calls in reading["valkey"]["commands"].items()})
    found.update({f"postgres.{name}": value for name, value in reading["postgres"].items()})
    return found


def change(before: dict, after: dict) -> dict[str, float]:
    old, new = flat(before), flat(after)
    return {name: value - old.get(name, 0) for name, value in new.items()}


def idle_rates(stack, seconds: float) -> dict[str, float]:
    """What the stack does per second with no traffic (beat's jobs, the worker's polling, breakers'
    upkeep): subtracted from each load's readings, and reported as the fixed cost it is."""
    before = snapshot(stack)
    time.sleep(seconds)
    after = snapshot(stack)
    elapsed = after["at"] - before["at"]
    return {name: value / elapsed for name, value in change(before, after).items()}


def wait_settled(expected_rows: int, timeout: float) -> bool:
    """The ledger worker has written every answered request's row (it drains in batches)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ledger_count() >= expected_rows:
            return True
        time.sleep(0.25)
    return False


def per_request(before: dict, after: dict, idle: dict[str, float], answered: int) -> dict:
    """Each counter's change less what the stack does idle in as long (CPU, Valkey commands), per
    answered request."""
    elapsed = after["at"] - before["at"]
    # PostgreSQL's writes are not reduced by its idle rate: what it writes with no traffic is mostly
    # work the traffic left behind (vacuum, rollups, partition indexes), part of what traffic costs.
    own = {
        name: max(0.0, value - (0.0 if name.startswith("postgres.") else idle.get(name, 0.0)) * elapsed) / answered
        for name, value in change(before, after).items()
    }
    cpu = {name.removeprefix("cpu."): round(v * 1000, 3) for name, v in own.items() if name.startswith("cpu.")}
    if "valkey" not in cpu:  # not embedded here: Valkey says what it spent
        cpu["valkey"] = round(own["valkey_cpu"] * 1000, 3)
    commands = {
        name.removeprefix("valkey."): v
        for name, v in own.items()
        if name.startswith("valkey.") and name != "valkey.info"  # this scenario's own readings
    }
    return {
        "cpu_ms": cpu,
        "valkey_commands": round(sum(commands.values()), 2),
        "valkey_top_commands": {
            n: round(c, 2) for n, c in sorted(commands.items(), key=lambda kv: -kv[1])[:8] if round(c, 2) > 0
        },
        "postgres_write_transactions": round(own["postgres.write_transactions"], 2),
        "postgres_wal_kb": round(own["postgres.wal_bytes"] / 1024, 2),
    }


def load_request(stack, run: str, name: str, mode: str, stream: bool, prompts: str):
    """The URL's headers and body maker of one load."""
    headers = {"authorization": f"Bearer {stack.key}", **CACHE_MODES[mode][0]}

    def body(i: int) -> dict:
        text = f"capacity {run} {name} {i}: tell me something" if prompts == "unique" else f"capacity {run} {name}"
        return {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": text}], "stream": stream}

    return headers, body


def warm(stack, run: str, concurrency: int) -> None:
    """Every load's path served by every worker before anything is measured (lazy imports, the
    embedder, caches, the repeated answer): what is left is the stack's idle rate and the loads."""
    for name, mode, stream, prompts in LOADS:
        headers, body = load_request(stack, run, f"warm {name}", mode, stream, prompts)
        rows = ledger_count()
        done = loadgen.run(
            loadgen.run_load(stack.sentinel_url, body, concurrency=concurrency, total=concurrency * 4, headers=headers)
        )
        wait_settled(rows + done.ok, 60)


def measure(stack, load: tuple, total: int, concurrency: int, run: str) -> dict:
    """One load's outcome and the snapshots around it (turned into figures once the idle rate is known)."""
    name, mode, stream, prompts = load
    headers, body = load_request(stack, run, name, mode, stream, prompts)
    rows_before = ledger_count()
    before = snapshot(stack)
    result = loadgen.run(
        loadgen.run_load(stack.sentinel_url, body, concurrency=concurrency, total=total, headers=headers)
    )
    settled = wait_settled(rows_before + result.ok, 120)
    return {
        "load": name,
        "requests": result.requests,
        "errors": result.errors,
        "rps": round(result.rps, 1),
        "ledger_settled": settled,
        "snapshots": (before, snapshot(stack)),
    }


def plan(row: dict) -> list[dict]:
    """Cores (or processes) each part needs at each target rate, at UTILISATION of its CPU."""
    cpu = row["cpu_ms"]
    lines = []
    for rps in TARGETS_RPS:

        def cores(part: str, rate: int = rps) -> float:
            return rate * cpu.get(part, 0.0) / 1000 / UTILISATION

        lines.append(
            {
                "rps": rps,
                "web_cores": math.ceil(cores("web")),
                "ledger_worker_cores": math.ceil(cores("worker")),
                "postgres_cores": round(cores("postgres"), 1),
                "postgres_write_transactions_per_s": round(rps * row["postgres_write_transactions"]),
                "postgres_wal_mb_per_s": round(rps * row["postgres_wal_kb"] / 1024, 1),
                "valkey_cores": round(cores("valkey"), 1),
                "valkey_commands_per_s": round(rps * row["valkey_commands"]),
            }
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench capacity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 requests a load: a smoke test")
    parser.add_argument("--requests", type=int, default=3000, help="requests per load")
    parser.add_argument("--concurrency", type=int, default=16)
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    total = 100 if args.quick else args.requests
    run = uuid.uuid4().hex[:8]
    result = report.envelope(SCENARIO, quick=args.quick)
    result["config"] = {
        "requests_per_load": total,
        "concurrency": args.concurrency,
        "web_server": web_server(args),
        "mock": "zero latency",
        "utilisation": UTILISATION,
    }
    with running_stack(out_dir=args.out, data_dir=args.data_dir, workers=args.workers, mock_profile="zero") as stack:
        result["config"]["storage"] = {k: ("embedded" if v else "external") for k, v in stack.embedded.items()}
        warm(stack, run, args.concurrency)
        idle_seconds = 4 if args.quick else 15
        first = idle_rates(stack, idle_seconds)
        measured = [measure(stack, load, total, args.concurrency, run) for load in LOADS]
        second = idle_rates(stack, idle_seconds)
    # The lower of the two idle windows, before and after the loads: a beat job in one is not idle.
    idle = {name: min(rate, second.get(name, rate)) for name, rate in first.items()}
    result["idle_per_second"] = {
        "cpu_ms": {k.removeprefix("cpu."): round(v * 1000, 2) for k, v in idle.items() if k.startswith("cpu.")},
        "valkey_commands": round(sum(v for k, v in idle.items() if k.startswith("valkey.")), 1),
        "postgres_write_transactions": round(idle["postgres.write_transactions"], 2),
        "postgres_wal_kb": round(idle["postgres.wal_bytes"] / 1024, 2),
    }
    print(f"idle, per second: {result['idle_per_second']}", flush=True)
    rows = []
    for row in measured:
        before, after = row.pop("snapshots")
        rows.append({**row, **per_request(before, after, idle, max(row["requests"] - row["errors"], 1))})
        print(f"{row['load']}: {rows[-1]}", flush=True)
    result["loads"] = rows
    result["plan"] = {row["load"]: plan(row) for row in rows}
    report.write_json(args.out, SCENARIO, result)

    headers = ["load", "rps", "web", "ledger worker", "beat", "valkey", "postgres"]
    headers += ["valkey cmds", "pg write txns", "pg WAL KB"]
    print(
        report.table(
            headers,
            [
                [
                    r["load"],
                    r["rps"],
                    r["cpu_ms"].get("web"),
                    r["cpu_ms"].get("worker"),
                    r["cpu_ms"].get("beat"),
                    r["cpu_ms"].get("valkey"),
                    r["cpu_ms"].get("postgres"),
                    r["valkey_commands"],
                    r["postgres_write_transactions"],
                    r["postgres_wal_kb"],
                ]
                for r in rows
            ],
            "Per answered request (CPU in ms; Valkey commands include those run inside scripts)",
        )
    )
    default = result["plan"][LOADS[0][0]]
    print(
        report.table(
            ["rps", "web cores", "ledger cores", "pg cores", "pg write txns/s", "pg WAL MB/s"]
            + ["valkey cores", "valkey cmds/s"],
            [list(line.values()) for line in default],
            f"Needed for the default load (cache on, misses), each part at {UTILISATION:.0%} of its CPU",
        )
    )
    failed = [r["load"] for r in rows if r["errors"] or not r["ledger_settled"]]
    if failed:
        print(f"capacity: loads with errors or unsettled ledgers: {failed}")
        return 1
    return 0
