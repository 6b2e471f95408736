"""`model: "auto"` classifier benchmark: how long gateway.upstream.autoroute.classify takes per prompt on the
labeled set (tests/data/routing_eval.jsonl), on the request path's own thread. No servers needed.

    python -m bench routing [--rounds 50] [--quick]

Each prompt's time is its median over the rounds (what the classifier costs, without the scheduling
noise of a shared machine); the table shows p50 / p99 / max over the prompts, and the raw p99 over all
calls. Writes bench/results/routing.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import orjson

from bench.report import envelope, percentile, table, write_json
from bench.stack import BASE_DIR, RESULTS_DIR

DATA = BASE_DIR / "tests" / "data" / "routing_eval.jsonl"


def measure(prompts: list[str], rounds: int) -> dict:
    from gateway.upstream.autoroute import classify

    conversations = [[{"role": "user", "content": prompt}] for prompt in prompts]
    for messages in conversations:  # warm up
        classify(messages)
    per_prompt: list[list[float]] = [[] for _ in prompts]
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for timings, messages in zip(per_prompt, conversations, strict=True):
            started = clock()
            classify(messages)
            timings.append((clock() - started) / 1000)
    calls = [t for timings in per_prompt for t in timings]
    medians = [statistics.median(timings) for timings in per_prompt]
    slowest = max(range(len(prompts)), key=lambda i: medians[i])
    return {
        "prompts": len(prompts),
        "calls": len(calls),
        "p50_us": round(statistics.median(medians), 1),
        "p99_us": round(percentile(medians, 0.99), 1),
        "max_us": round(max(medians), 1),
        "slowest_prompt_chars": len(prompts[slowest]),
        "raw_p99_us": round(percentile(calls, 0.99), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench routing", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for routing.json")
    args = parser.parse_args(argv)
    prompts = [orjson.loads(line)["prompt"] for line in DATA.read_text().splitlines() if line.strip()]
    result = measure(prompts, 5 if args.quick else args.rounds)
    print(
        table(
            ["prompts", "calls", "p50 µs", "p99 µs", "max µs", "(its chars)", "raw p99 µs"],
            [
                [
                    result[k]
                    for k in ("prompts", "calls", "p50_us", "p99_us", "max_us", "slowest_prompt_chars", "raw_p99_us")
                ]
            ],
            title="classify() per prompt (median of its rounds)",
        )
    )
    write_json(args.out, "routing", {**envelope("routing", quick=args.quick), "results": result})
    return 0
