"""The benchmark runner (bench/README.md): `python -m bench` runs every scenario in turn, `python -m bench
NAME [ARGS...]` one of them with its own arguments, `python -m bench --list` lists them.

Each scenario is a module bench/<module>.py with `main(argv) -> int`; the registry below names them in
the order they run. A scenario whose module is not written yet is reported as not available yet.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    name: str
    module: str
    about: str
    in_all: bool = True  # run by `python -m bench` with no name


REGISTRY = [
    Scenario("overhead", "bench.overhead", "zero-latency mock: direct vs Sentinel vs LiteLLM, c=1 and c=32"),
    Scenario("endpoints", "bench.endpoints", "c=1: chat, responses, messages, embeddings; fast path and translated"),
    Scenario("relay_mix", "bench.relay_mix", "realistic mock, 4000 requests, repeats/paraphrases/novel, cache off/on"),
    Scenario("failover", "bench.failover", "primary forced to 503 then to stalls mid-run: failures, breaker, recovery"),
    Scenario("admission", "bench.admission", "4 gateway processes: rate, concurrency and budget limits, overspend"),
    Scenario("cache_scale", "bench.cache_scale", "10k/100k/1M cache entries: semantic lookup p50/p99, recall@1"),
    Scenario("soak", "bench.soak", "fixed rate for 10 minutes: RSS of every process at start and end, errors"),
    Scenario("durability", "bench.durability", "kill -9 a web process and a worker mid-load: ledger rows vs answers"),
    Scenario("ledger", "bench.ledger", "the ledger's write path under load"),
    Scenario("screening", "bench.screening", "the local safety checks' time per request: short, chat and long prompts"),
    Scenario("verifier", "bench.verifier", "the semantic cache verifier's time per candidate on the labeled pairs"),
    Scenario("retrieval", "bench.retrieval", "vector store search quality (recall@5, MRR) and latency, ingestion rate"),
    Scenario("routing", "bench.routing", 'model "auto": the local classifier\'s time per prompt on the labeled set'),
    Scenario("balancing", "bench.balancing", "two deployments, one slowing: round-robin vs weighted vs P2C peak-EWMA"),
    Scenario("tokens", "bench.tokens", "prompt bounds for reservations: short chat, 3,000 characters a script, tools"),
    Scenario("capacity", "bench.capacity", "CPU, Valkey commands, PostgreSQL writes a request; parts for 1k-100k/s"),
    Scenario("redis_stall", "bench.redis_stall", "Valkey stalls mid-run: added latency, fail open/closed, recovery"),
    Scenario("console", "bench.console", "console lists and dashboard at 1M keys and 1M ledger rows: server time"),
    Scenario("profile", "bench.profile", "py-spy flame graphs of a web worker at c=32 (on demand)", in_all=False),
]
BY_NAME = {s.name: s for s in REGISTRY}


def available(scenario: Scenario) -> bool:
    return importlib.util.find_spec(scenario.module) is not None


def run_one(scenario: Scenario, argv: list[str]) -> str:
    """Run one scenario; returns its outcome: ok, failed (exit code), error, not available yet."""
    if not available(scenario):
        print(f"{scenario.name}: not available yet (no module {scenario.module})", flush=True)
        return "not available yet"
    print(f"\n=== {scenario.name}: {scenario.about}", flush=True)
    started = time.monotonic()
    module = importlib.import_module(scenario.module)
    try:
        code = module.main(argv)
    except SystemExit as exc:  # argparse: --help (0) or a bad option (2)
        code = exc.code
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - one scenario's failure does not stop the others
        import traceback

        traceback.print_exc()
        print(f"{scenario.name}: error: {exc}", flush=True)
        return "error"
    finally:
        print(f"=== {scenario.name}: {time.monotonic() - started:.0f} s", flush=True)
    return "ok" if not code else f"failed (exit {code})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):
        name, rest = argv[0], argv[1:]
        scenario = BY_NAME.get(name)
        if scenario is None:
            print(f"Unknown scenario {name!r}; choose from: {', '.join(BY_NAME)}", file=sys.stderr)
            return 2
        try:
            outcome = run_one(scenario, rest)
        except KeyboardInterrupt:
            print("\nInterrupted; every process the bench started has been stopped.", file=sys.stderr)
            return 130
        return 0 if outcome in ("ok", "not available yet") else 1

    parser = argparse.ArgumentParser(
        prog="python -m bench",
        usage="python -m bench [--list | --quick] | python -m bench NAME [scenario options]",
        description="Sentinel's benchmarks. `python -m bench NAME --help` shows a scenario's own options.",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and whether each is available")
    parser.add_argument("--quick", action="store_true", help="every scenario in its short smoke-test mode")
    args = parser.parse_args(argv)
    if args.list:
        for s in REGISTRY:
            state = "available" if available(s) else "not available yet"
            extra = "" if s.in_all else " (not part of the full run)"
            print(f"{s.name:<12} {state:<18} {s.about}{extra}")
        return 0
    try:
        outcomes = {s.name: run_one(s, ["--quick"] if args.quick else []) for s in REGISTRY if s.in_all}
    except KeyboardInterrupt:
        print("\nInterrupted; every process the bench started has been stopped.", file=sys.stderr)
        return 130
    print("\nSummary:")
    for name, outcome in outcomes.items():
        print(f"  {name:<12} {outcome}")
    return 0 if all(o in ("ok", "not available yet") for o in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
