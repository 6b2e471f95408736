"""Scenario 3, failover: a steady load on a model served by a primary and a secondary deployment; the
primary is forced to answer 503 to everything mid-run, then cleared, then forced to stall, then
cleared. Client-visible failures, the time from each fault to the open breaker, the latency a request
adds while the breaker is open, and the recovery after each fault clears.

The same fault is also run with the breaker effectively off (a policy that never opens), to show what
the breaker saves: without it every request pays the primary's retries (503) or its timeout (stall).

    python -m bench failover [--quick] [--rate R]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass, field

import httpx

from bench import report
from bench.stack import add_stack_arguments, running_stack, web_server

SCENARIO = "failover"
PRIMARY, SECONDARY = "failover-primary", "failover-secondary"
POLICY = {
    "window_seconds": 10,
    "minimum_calls": 10,
    "failure_rate_percent": 50,
    "slow_call_seconds": 2.0,
    "slow_rate_percent": 80,
    "open_seconds": 3.0,
    "max_open_seconds": 30.0,
    "half_open_probes": 3,
}
NEVER_OPENS = {**POLICY, "minimum_calls": 1_000_000}
ATTEMPT_TIMEOUT = 1.0  # seconds: the stalled primary is abandoned after this


@dataclass
class Sample:
    sent: float  # seconds since the run started
    status: int
    provider: str
    latency: float  # seconds


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic() - self.started

    def between(self, start: str, end: str) -> list[Sample]:
        return [s for s in self.samples if self.marks[start] <= s.sent < self.marks[end]]


def prepare_model(mock_url: str, policy: dict) -> str:
    """A model whose chain is primary then secondary (two virtual providers on the mock)."""
    from gateway.models import BreakerPolicy, ChainEntry, Deployment, ModelAlias, Provider
    from sentinel.localstate import announce_change

    alias = ModelAlias.objects.create(name=f"failover-{uuid.uuid4().hex[:8]}")
    breaker = BreakerPolicy.objects.create(name=f"failover-{uuid.uuid4().hex[:8]}", **policy)
    for position, name in enumerate((PRIMARY, SECONDARY)):
        provider, _ = Provider.objects.update_or_create(
            name=name,
            defaults={
                "kind": "openai",
                "api_base": f"{mock_url}/p/{name}/v1",
                "timeout_seconds": ATTEMPT_TIMEOUT,
                "first_token_timeout_seconds": ATTEMPT_TIMEOUT,
            },
        )
        provider.set_api_key("sk-mock-failover")
        provider.save()
        deployment = Deployment.objects.create(
            name=f"{name}-{alias.name}", provider=provider, litellm_model="openai/gpt-4o-mini", breaker_policy=breaker
        )
        ChainEntry.objects.create(alias=alias, deployment=deployment, position=position)
    announce_change()
    return alias.name


async def steady_load(url: str, key: str, model: str, rate: float, timeline: Timeline, stop: asyncio.Event) -> None:
    """`rate` requests a second, each on its own, until `stop` is set."""
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as client:
        pending: set[asyncio.Task] = set()

        async def one(i: int) -> None:
            sent = time.monotonic()
            body = {"model": model, "messages": [{"role": "user", "content": f"failover {uuid.uuid4().hex} {i}"}]}
            headers = {"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"}
            try:
                response = await client.post(url, json=body, headers=headers)
                status, provider = response.status_code, response.headers.get("x-sentinel-provider", "")
            except httpx.HTTPError:
                status, provider = 0, ""
            timeline.samples.append(Sample(sent - timeline.started, status, provider, time.monotonic() - sent))

        i = 0
        next_at = time.monotonic()
        while not stop.is_set():
            task = asyncio.create_task(one(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
            next_at += 1 / rate
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*pending)


def transitions_since(model: str, since_wall: float) -> list[tuple[float, str, str]]:
    from datetime import UTC, datetime

    from gateway.models import BreakerTransition

    rows = BreakerTransition.objects.filter(
        deployment__aliases__name=model,
        deployment__provider__name=PRIMARY,
        created_at__gte=datetime.fromtimestamp(since_wall, UTC),
    ).order_by("created_at")
    return [(row.created_at.timestamp(), row.from_state, row.to_state) for row in rows]


def run_faults(stack, model: str, rate: float, phase: float) -> dict:
    """Healthy → 503 → cleared → stall → cleared, `phase` seconds each, under a steady load."""
    control = f"{stack.mock_url}/_control/{PRIMARY}"
    timeline = Timeline()
    wall_start = time.time()

    async def scenario() -> None:
        stop = asyncio.Event()
        load = asyncio.create_task(steady_load(stack.sentinel_url, stack.key, model, rate, timeline, stop))
        async with httpx.AsyncClient() as mock:
            timeline.mark("healthy")
            await asyncio.sleep(phase)
            # A phase starts once the mock has answered the control call that sets its fault: a
            # request sent while that call is on its way counts in the phase before (it may still
            # reach the mock before the change).
            await mock.post(control, json={"error_rate": 1.0, "error_status": 503})
            timeline.mark("error")
            await asyncio.sleep(phase)
            await mock.post(control, json={"error_rate": 0.0})
            timeline.mark("error_cleared")
            await asyncio.sleep(phase)
            await mock.post(control, json={"stall_ms": 10_000})
            timeline.mark("stall")
            await asyncio.sleep(phase)
            await mock.post(control, json={"stall_ms": 0})
            timeline.mark("stall_cleared")
            await asyncio.sleep(phase)
            timeline.mark("end")
        stop.set()
        await load

    asyncio.run(scenario())
    marks = {name: wall_start + offset for name, offset in timeline.marks.items()}
    transitions = transitions_since(model, wall_start)

    def first_transition(to: str, after: str) -> float | None:
        found = [t for t, _, new in transitions if new == to and t >= marks[after]]
        return round(found[0] - marks[after], 3) if found else None

    def phase_stats(start: str, end: str) -> dict:
        samples = timeline.between(start, end)
        ok = [s.latency * 1000 for s in samples if s.status == 200]
        return {
            "requests": len(samples),
            "failures": sum(1 for s in samples if s.status != 200),
            "served_by_primary": sum(1 for s in samples if s.provider == PRIMARY),
            "p50_ms": round(statistics.median(ok), 2) if ok else None,
            "p99_ms": round(sorted(ok)[int(0.99 * (len(ok) - 1))], 2) if ok else None,
        }

    def while_open(start: str, end: str) -> dict:
        """The requests of a phase sent while the breaker was open (not closed, not half-open)."""
        intervals, opened = [], None
        for at, _, new in transitions:
            if new == "open" and opened is None:
                opened = at
            elif new != "open" and opened is not None:
                intervals.append((opened, at))
                opened = None
        if opened is not None:
            intervals.append((opened, float("inf")))
        samples = [
            s
            for s in timeline.between(start, end)
            if any(a <= wall_start + s.sent < b for a, b in intervals) and s.status == 200
        ]
        latencies = [s.latency * 1000 for s in samples]
        return {
            "requests": len(samples),
            "served_by_primary": sum(1 for s in samples if s.provider == PRIMARY),
            "p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        }

    return {
        "open_503": while_open("error", "error_cleared"),
        "open_stall": while_open("stall", "stall_cleared"),
        "phases": {
            "healthy": phase_stats("healthy", "error"),
            "503": phase_stats("error", "error_cleared"),
            "503 cleared": phase_stats("error_cleared", "stall"),
            "stall": phase_stats("stall", "stall_cleared"),
            "stall cleared": phase_stats("stall_cleared", "end"),
        },
        "seconds_to_open_on_503": first_transition("open", "error"),
        "seconds_to_close_after_503": first_transition("closed", "error_cleared"),
        "seconds_to_open_on_stall": first_transition("open", "stall"),
        "seconds_to_close_after_stall": first_transition("closed", "stall_cleared"),
        "transitions": [{"at_s": round(t - wall_start, 3), "from": old, "to": new} for t, old, new in transitions],
    }


def added(p50: float | None, baseline: float | None) -> float | None:
    return round(p50 - baseline, 2) if p50 is not None and baseline is not None else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench failover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2-second phases at 20 requests/s: a smoke test")
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second (default 40)")
    parser.add_argument("--phase", type=float, default=8.0, help="seconds per phase (default 8)")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    rate, phase = (20.0, 2.0) if args.quick else (args.rate, args.phase)
    result = report.envelope(SCENARIO, quick=args.quick)
    result["config"] = {
        "rate_rps": rate,
        "phase_seconds": phase,
        "mock": "zero latency",
        "attempt_timeout_s": ATTEMPT_TIMEOUT,
        "breaker_policy": POLICY,
        "web_server": web_server(args),
    }
    with running_stack(out_dir=args.out, data_dir=args.data_dir, workers=args.workers, mock_profile="zero") as stack:
        result["with_breaker"] = run_faults(stack, prepare_model(stack.mock_url, POLICY), rate, phase)
        result["without_breaker"] = run_faults(stack, prepare_model(stack.mock_url, NEVER_OPENS), rate, phase)
    rows = []
    for label in ("with_breaker", "without_breaker"):
        for name, stats in result[label]["phases"].items():
            rows.append(
                [
                    label.replace("_", " "),
                    name,
                    stats["requests"],
                    stats["failures"],
                    stats["served_by_primary"],
                    stats["p50_ms"],
                    stats["p99_ms"],
                ]
            )
    print(
        report.table(
            ["run", "phase", "requests", "failures", "by primary", "p50 ms", "p99 ms"],
            rows,
            title=f"Failover ({rate:g} requests/s, {phase:g} s phases; one run)",
        )
    )
    on = result["with_breaker"]
    healthy, errored, stalled = on["phases"]["healthy"], on["phases"]["503"], on["phases"]["stall"]
    result["summary"] = {
        "client_visible_failures": sum(p["failures"] for p in on["phases"].values()),
        "seconds_to_open_on_503": on["seconds_to_open_on_503"],
        "seconds_to_open_on_stall": on["seconds_to_open_on_stall"],
        "requests_while_open_503": on["open_503"]["requests"],
        "added_p50_ms_while_open_503": added(on["open_503"]["p50_ms"], healthy["p50_ms"]),
        "primary_calls_while_open_503": on["open_503"]["served_by_primary"],
        "requests_while_open_stall": on["open_stall"]["requests"],
        "added_p50_ms_while_open_stall": added(on["open_stall"]["p50_ms"], healthy["p50_ms"]),
        "added_p50_ms_whole_503_phase": added(errored["p50_ms"], healthy["p50_ms"]),
        "added_p50_ms_whole_stall_phase": added(stalled["p50_ms"], healthy["p50_ms"]),
        "seconds_to_recover_after_503": on["seconds_to_close_after_503"],
        "seconds_to_recover_after_stall": on["seconds_to_close_after_stall"],
    }
    print(
        report.table(
            ["figure", "value"],
            [[k.replace("_", " "), v] for k, v in result["summary"].items()],
            title="With the breaker",
        )
    )
    path = report.write_json(args.out, SCENARIO, result)
    print(f"Results: {path}")
    return 0
