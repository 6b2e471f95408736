"""The semantic cache verifier's time per candidate (issue #17: p99 ≤ 5 ms on this machine): every
labeled pair of the three sets the pair model was built from whose MiniLM cosine reaches the floor,
that is every pair the cache would put to gateway.cache.acceptance.verify. No servers needed.

    python -m bench verifier [--rounds 20] [--quick]

Each call starts with both prompts unseen (the verifier's per-text caches are emptied first), as for
a new prompt against a stored one never asked before; a pair the words leave to the cross-encoder is
scored in every call (nothing of a pair's score can be kept for another pair). Each pair's time is
its median over the rounds; the table shows p50 / p99 / max over the pairs, and the raw p99 over all
calls. Writes bench/results/verifier.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.report import envelope, percentile, table, write_json
from bench.stack import RESULTS_DIR, start_django
from sentinel.startup import settle_web_process


def candidates(limit: int | None) -> list[tuple[str, str, float]]:
    """(stored, asked, cosine) for every labeled pair at or above the cosine floor."""
    from gateway.cache import acceptance
    from gateway.cache.engine import shared_embedder
    from gateway.management.commands.cache_verifier_train import labeled_pairs, prompt_vectors

    pairs = labeled_pairs()[:limit]
    vectors = prompt_vectors(pairs, shared_embedder())
    out = []
    for pair in pairs:
        a, b = acceptance.normalize_prompt(pair["a"]), acceptance.normalize_prompt(pair["b"])
        similarity = float(vectors[a] @ vectors[b])
        if similarity >= acceptance.DEFAULT_THRESHOLD:
            out.append((a, b, similarity))
    return out


def measure(pairs: list[tuple[str, str, float]], rounds: int) -> dict:
    from gateway.cache import acceptance
    from gateway.cache.verifier import text

    verify = acceptance.verify
    for a, b, similarity in pairs:  # warm up: the models' weights, the word-piece table
        verify(a, b, similarity)
    per_pair: list[list[float]] = [[] for _ in pairs]
    accepted = 0
    clock = time.perf_counter_ns
    for round_ in range(rounds):
        for timings, (a, b, similarity) in zip(per_pair, pairs, strict=True):
            text.tokens.cache_clear()
            text.split_payload.cache_clear()
            started = clock()
            verdict = verify(a, b, similarity)
            timings.append((clock() - started) / 1e6)
            accepted += round_ == 0 and verdict.accepted
    calls = [t for timings in per_pair for t in timings]
    medians = [statistics.median(timings) for timings in per_pair]
    slowest = max(range(len(pairs)), key=lambda i: medians[i])
    return {
        "candidates": len(pairs),
        "accepted": accepted,
        "calls": len(calls),
        "p50_ms": round(statistics.median(medians), 3),
        "p99_ms": round(percentile(medians, 0.99), 3),
        "max_ms": round(max(medians), 3),
        "slowest_pair_chars": len(pairs[slowest][0]) + len(pairs[slowest][1]),
        "raw_p99_ms": round(percentile(calls, 0.99), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench verifier", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 rounds over the first 300 pairs")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for verifier.json")
    parser.add_argument("--data-dir", type=Path, default=None, help="settings' data folder (default .data/bench)")
    args = parser.parse_args(argv)
    start_django(args.data_dir, migrate=False)
    pairs, rounds = candidates(300 if args.quick else None), 3 if args.quick else args.rounds
    settle_web_process()  # as a web process once started: its collector and BLAS settings
    result = measure(pairs, rounds)
    keys = ("candidates", "accepted", "calls", "p50_ms", "p99_ms", "max_ms", "slowest_pair_chars", "raw_p99_ms")
    print(
        table(
            ["case", "candidates", "accepted", "calls", "p50 ms", "p99 ms", "max ms", "(its chars)", "raw p99 ms"],
            [
                ["both prompts unseen", *(result[k] for k in keys)],
            ],
            title="acceptance.verify() per candidate (median of its rounds)",
        )
    )
    write_json(
        args.out,
        "verifier",
        {**envelope("verifier", quick=args.quick), "results": result},
    )
    return 0
