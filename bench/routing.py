"""`model: "auto"` classifier benchmark: how long gateway.autoroute.classify takes per prompt on the
labeled set (tests/data/routing_eval.jsonl), on the request path's own thread. No servers needed.

    python -m bench.routing [--rounds 50] [--quick]

Prints p50 / p99 / max over prompts (each prompt's median over the rounds) and the raw p99 over
all calls; writes bench/results/routing.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
DATA = BASE_DIR / "tests" / "data" / "routing_eval.jsonl"
RESULTS = BASE_DIR / "bench" / "results" / "routing.json"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(prompts: list[str], rounds: int) -> dict:
    sys.path.insert(0, str(BASE_DIR))
    from gateway.autoroute import classify

    conversations = [[{"role": "user", "content": prompt}] for prompt in prompts]
    for messages in conversations:  # warm up: compiled patterns, caches
        classify(messages)
    per_prompt: list[list[float]] = [[] for _ in prompts]
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for timings, messages in zip(per_prompt, conversations, strict=True):
            started = clock()
            classify(messages)
            timings.append((clock() - started) / 1000)
    calls = [t for timings in per_prompt for t in timings]
    # A prompt's own time is its median over the rounds: what the classifier costs, without the
    # scheduling noise of a shared machine (which the raw p99 shows).
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    args = parser.parse_args(argv)
    prompts = [json.loads(line)["prompt"] for line in DATA.read_text().splitlines() if line.strip()]
    result = measure(prompts, 5 if args.quick else args.rounds)
    print("per prompt (median of its rounds):")
    print(f"{'prompts':>10} {'calls':>8} {'p50 µs':>8} {'p99 µs':>8} {'max µs':>8} {'(chars)':>8} {'raw p99 µs':>11}")
    print(
        f"{result['prompts']:>10} {result['calls']:>8} {result['p50_us']:>8} {result['p99_us']:>8} "
        f"{result['max_us']:>8} {result['slowest_prompt_chars']:>8} {result['raw_p99_us']:>11}"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
