"""Scenario 6, soak: Sentinel under a fixed request rate for a long time (10 minutes by default).

Measures the resident memory (RSS) of every process of the run — web workers, the Celery worker and
beat, the mock provider and the embedded Valkey, and the embedded PostgreSQL as one server (the private
memory of all its processes; its shared buffer cache beside it) — after a warm-up and at the end,
sampled along the way, and counts every failed, truncated or wrong answer (each answer
is checked against the mock's deterministic answer to its prompt). Target (issue #9): RSS growth under
10% for every process.

    python -m bench soak [--duration 600] [--rate 100] [--stream-share 0.5] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid
from pathlib import Path

import orjson
import psutil
import redis

from bench import loadgen, report
from bench.stack import MODEL_ALIAS, Stack, add_stack_arguments, running_stack, web_server
from gateway.mock_provider import answer_text

SCENARIO = "soak"
GROWTH_LIMIT = 0.10
MB = 2**20


POSTGRES = "postgres (server: private memory, RssAnon of all its processes)"
# Not a process: the shared memory (buffer cache and the rest of its one segment) its processes have
# touched. It fills up to the segment's fixed size as the tables grow; it cannot grow past it.
POSTGRES_SHARED = "postgres shared memory touched (PSS of shmem, not a process)"
# Not a process: Valkey's own count of its data, next to its RSS (which also holds allocator slack
# and AOF buffers), to tell data that keeps growing from memory the allocator keeps.
VALKEY_DATA = "valkey data (INFO used_memory, not a process)"


def proc_kb(pid: int, name: str, keys: tuple[str, ...]) -> dict[str, int]:
    """Fields in kB from /proc/<pid>/status or /proc/<pid>/smaps_rollup."""
    found = {}
    with open(f"/proc/{pid}/{name}") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in keys:
                found[key] = int(value.split()[0]) * 1024
    return found


def shared_segment_size(pid: int) -> int:
    """Bytes of writable shared memory a process maps: for the postmaster, PostgreSQL's main segment
    (shared_buffers and the rest, fixed at start) and its small System V and dynamic segments."""
    size, shared = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(maxsplit=2)
            if "-" in first[0] and not first[0].endswith(":"):  # a mapping's header: range, permissions, ...
                shared = "w" in first[1] and first[1].endswith("s")
            elif first[0] == "Size:" and shared:
                size += int(first[1]) * 1024
    return size


class Sampler:
    """Resident memory of every process of the stack over time, keyed by a readable name (processes
    may come and go). The embedded PostgreSQL is one entry: its backends come and go with the
    connection pools, and a backend's RSS (and even its USS, for pages no other process touched yet)
    counts the pages of the shared buffer cache it has used, which fill up to shared_buffers as the
    ledger table grows. So the server is measured by what it allocates for itself, the anonymous
    resident memory of all its processes (RssAnon: heaps, caches, work memory), with the shared memory
    touched beside it and its fixed ceiling, the segment's size."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.commands: dict[str, str] = {}
        self.series: list[tuple[float, dict[str, int]]] = []
        self.postgres_processes: list[int] = []  # at each sample: pools grow and shrink backends
        self.postgres_segment: int | None = None
        self.started = time.monotonic()
        self.redis = redis.Redis.from_url(os.environ["REDIS_URL"])

    def sample(self) -> dict[str, int]:
        memory: dict[str, int] = {}
        postgres = postgres_shared = 0
        processes = self.stack.processes().values()
        self.postgres_processes.append(sum(1 for name, _ in processes if name.startswith("postgres")))
        for name, process in processes:
            try:
                if name.startswith("postgres"):
                    postgres += proc_kb(process.pid, "status", ("RssAnon",))["RssAnon"]
                    postgres_shared += proc_kb(process.pid, "smaps_rollup", ("Pss_Shmem",))["Pss_Shmem"]
                    if name == "postgres" and self.postgres_segment is None:
                        self.postgres_segment = shared_segment_size(process.pid)
                    continue
                memory[name] = process.memory_info().rss
                if name not in self.commands:
                    self.commands[name] = " ".join(process.cmdline())[:160]
            except (psutil.Error, OSError, KeyError):
                continue
        if postgres:
            memory[POSTGRES] = postgres
            memory[POSTGRES_SHARED] = postgres_shared
            self.commands.setdefault(POSTGRES, "embedded PostgreSQL: postmaster, helpers and backends")
        with contextlib.suppress(redis.RedisError):
            memory[VALKEY_DATA] = self.redis.info("memory")["used_memory"]
        self.series.append((round(time.monotonic() - self.started, 1), memory))
        return memory

    async def every(self, seconds: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), seconds)
            except TimeoutError:
                self.sample()


def processes_table(sampler: Sampler, start: dict[str, int], end: dict[str, int]) -> list[dict]:
    rows = []
    for name in sorted(set(start) | set(end)):
        before, after = start.get(name), end.get(name)
        growth = None if not before or after is None else round((after - before) / before, 4)
        rows.append(
            {
                "process": name,
                "command": sampler.commands.get(name, ""),
                "rss_start_mb": round(before / MB, 1) if before else None,
                "rss_end_mb": round(after / MB, 1) if after is not None else None,
                "growth": growth,
                "note": "started during the soak"
                if before is None
                else ("ended during the soak" if after is None else ""),
                "met": None if growth is None or "not a process" in name else growth < GROWTH_LIMIT,
            }
        )
    return rows


def plot(path: Path, sampler: Sampler, baseline_at: float) -> None:
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(11, 5.5))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)
    for name in sorted({n for _, memory in sampler.series for n in memory}):
        points = [(t, memory[name] / MB) for t, memory in sampler.series if name in memory]
        ax.plot([t for t, _ in points], [mb for _, mb in points], label=name, linewidth=1.2)
    ax.axvline(baseline_at, color="black", linewidth=0.8, linestyle=":")
    ax.annotate(" baseline (after warm-up)", (baseline_at, ax.get_ylim()[1] * 0.95), fontsize=8)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("RSS, MB")
    ax.set_title("Soak: resident memory of every process")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 seconds at a low rate: a smoke test")
    parser.add_argument("--duration", type=float, help="seconds of soak after the warm-up (default 600)")
    parser.add_argument(
        "--warmup",
        type=float,
        help="seconds at the same rate before the baseline (default 75: longer than one rate-limit window, "
        "over which Valkey's sliding logs fill up before they stay level)",
    )
    parser.add_argument("--rate", type=float, help="requests per second (default 100)")
    parser.add_argument("--stream-share", type=float, default=0.5, help="share of streamed requests")
    parser.add_argument("--profile", choices=("zero", "realistic"), default="realistic", help="mock profile")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS samples")
    parser.add_argument("--max-in-flight", type=int, default=512)
    parser.add_argument("--no-plot", action="store_true")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    duration = args.duration or (20.0 if args.quick else 600.0)
    warmup = args.warmup if args.warmup is not None else (3.0 if args.quick else 75.0)
    rate = args.rate or (20.0 if args.quick else 100.0)
    sample_every = min(args.sample_every, max(duration / 10, 1.0))
    run_id = uuid.uuid4().hex[:8]
    stream_every = round(1 / args.stream_share) if args.stream_share > 0 else 0

    def prompt(phase: str, i: int) -> str:
        return f"soak {run_id} {phase} {i}"

    def body_for(phase: str):
        def body(i: int) -> dict:
            stream = bool(stream_every) and i % stream_every == 0
            return {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": prompt(phase, i)}], "stream": stream}

        return body

    def validate(phase: str):
        def check(i: int, answer: bytes, stream: bool) -> bool:
            text = loadgen.stream_text(answer) if stream else orjson.loads(answer)["choices"][0]["message"]["content"]
            return text == answer_text(prompt(phase, i))

        return check

    result = report.envelope(SCENARIO, quick=args.quick)
    result["config"] = {
        "duration_s": duration,
        "warmup_s": warmup,
        "rate_per_s": rate,
        "stream_share": args.stream_share,
        "mock_profile": args.profile,
        "sentinel_web_workers": args.workers,
        "sentinel_web_server": web_server(args),
        "ledger_worker": True,
    }
    with running_stack(
        out_dir=args.out,
        data_dir=args.data_dir,
        workers=args.workers,
        cache=args.cache,
        ledger_worker=True,
        mock_profile=args.profile,
    ) as stack:
        result["config"]["sentinel_conditions"] = stack.conditions
        sampler = Sampler(stack)
        print(f"  warm-up: {warmup:.0f} s at {rate:g}/s", flush=True)
        loadgen.run(
            loadgen.run_rate(
                stack.sentinel_url,
                body_for("warm"),
                rate=rate,
                duration=warmup,
                max_in_flight=args.max_in_flight,
                headers=stack.sentinel_headers,
                validate=validate("warm"),
            )
        )
        start = sampler.sample()
        start_index = len(sampler.series) - 1
        baseline_at = sampler.series[-1][0]
        print(f"  soak: {duration:.0f} s at {rate:g}/s, RSS sampled every {sample_every:.0f} s", flush=True)

        async def soak() -> loadgen.Result:
            stop = asyncio.Event()
            sampling = asyncio.get_running_loop().create_task(sampler.every(sample_every, stop))
            try:
                return await loadgen.run_rate(
                    stack.sentinel_url,
                    body_for("soak"),
                    rate=rate,
                    duration=duration,
                    max_in_flight=args.max_in_flight,
                    headers=stack.sentinel_headers,
                    validate=validate("soak"),
                )
            finally:
                stop.set()
                await sampling

        measured = loadgen.run(soak())
        end = sampler.sample()

    summary = measured.summary()
    rows = processes_table(sampler, start, end)
    for row in rows:
        if row["process"] == POSTGRES:  # more backends is more memory: say how many there were
            first, last = sampler.postgres_processes[start_index], sampler.postgres_processes[-1]
            row["note"] = f"{first} → {last} processes (postmaster, helpers, backends)"
        if row["process"] == POSTGRES_SHARED and sampler.postgres_segment:
            row["note"] = f"fixed main segment: {sampler.postgres_segment / MB:.0f} MB (shared_buffers and the rest)"
    measured_rows = [r for r in rows if r["met"] is not None]
    worst = max(measured_rows, key=lambda r: r["growth"], default=None)
    result["load"] = summary
    result["processes"] = rows
    result["rss_series_mb"] = [
        {"t": t, "rss": {name: round(v / MB, 1) for name, v in memory.items()}} for t, memory in sampler.series
    ]
    result["targets"] = [
        {
            "check": "RSS growth of every process, % (baseline after warm-up)",
            "measured": round(worst["growth"] * 100, 2) if worst else None,
            "worst_process": worst["process"] if worst else None,
            "target": "< 10",
            "met": all(r["met"] for r in measured_rows) if measured_rows else None,
        },
        {
            "check": "errors (failed, truncated, wrong, shed)",
            "measured": summary["errors"] + summary["shed"],
            "target": "0",
            "met": summary["errors"] + summary["shed"] == 0,
        },
    ]

    print()
    print(
        report.table(
            ["process", "MB at start", "MB at end", "growth %", "< 10%", "note"],
            [
                [
                    r["process"],
                    r["rss_start_mb"],
                    r["rss_end_mb"],
                    None if r["growth"] is None else round(r["growth"] * 100, 2),
                    r["met"],
                    r["note"],
                ]
                for r in rows
            ],
            title=f"Soak: {duration:.0f} s at {rate:g}/s after {warmup:.0f} s of warm-up ({args.profile} mock)",
        )
    )
    print()
    print(
        report.table(
            ["requests", "ok", "errors", "truncated", "wrong", "shed", "rps", "p50 ms", "p99 ms", "1st token p50"],
            [
                [
                    summary["requests"],
                    summary["ok"],
                    summary["errors"],
                    summary["truncated"],
                    summary["wrong"],
                    summary["shed"],
                    summary["rps"],
                    summary["p50_ms"],
                    summary["p99_ms"],
                    summary["ttft_p50_ms"],
                ]
            ],
            title=f"Load (statuses: {summary['statuses']})",
        )
    )
    print()
    print(
        report.table(
            ["check", "measured", "target", "met"],
            [[c["check"], c["measured"], c["target"], c["met"]] for c in result["targets"]],
        )
    )
    path = report.write_json(args.out, SCENARIO, result)
    print(f"Results: {path}")
    if not args.no_plot:
        png = args.out / f"{SCENARIO}.png"
        plot(png, sampler, baseline_at)
        print(f"Plot: {png}")
    return 1 if args.quick and (summary["errors"] or summary["shed"]) else 0
