"""Screening benchmark: what the local checks add to a request.

    python -m bench screening [--rounds 5] [--quick] [--out DIR]

Times `gateway.screening.engine.screen_input` (every local check on: personal data of every kind,
injection, moderation; no outside service) per request, for short prompts (the labeled set's 376
prompts, one user message each) and long ones (conversations of about 4,000 characters: a system
prompt and six turns, drawn from the whole set or from its clean texts only) and chat requests in
between (a system prompt and three short turns, about 1,000 characters), and single user messages
of 4,000 characters (issue 25: one long message is read by every check, where a long conversation's
text sits mostly in turns fewer checks read), each with the checks redacting and with them only
logging; the same for
each family of checks alone; a tenant without a policy; the next request of a long conversation,
whose earlier turns the engine has seen (it remembers their findings); and screening a streamed
40-chunk answer. Pure CPU: no server is called. Prints wall-clock p50/p99/max and the CPU time p50
(what the checks cost, apart from waiting for a core on a busy machine); writes
bench/results/screening.json.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

from bench.report import percentile
from bench.stack import BASE_DIR, RESULTS_DIR, start_django
from sentinel.startup import settle_web_process

DATA = BASE_DIR / "tests" / "data" / "screening_eval.jsonl"
PERSONAL_DATA = ("email", "phone", "payment_card", "iban", "national_id", "ip_address", "secret")


def run_to_end(coro) -> None:
    """Drive a coroutine that never waits (no outside service is configured) without an event loop,
    so the loop's own overhead is not counted."""
    try:
        coro.send(None)
    except StopIteration:
        return
    raise RuntimeError("screen_input waited on something: the benchmark must not call services")


def policy(checks: dict[str, str]):
    from gateway.screening.policy import Policy

    return Policy(input=tuple(checks.items()))


def conversations(
    texts: list[str], count: int, rng: random.Random, *, turns: int = 6, texts_per_turn: int = 6
) -> list[list[dict]]:
    system = (
        "You are the support assistant of a mid-sized online shop. Answer politely and briefly, in the "
        "customer's language. Never promise refunds; explain the return policy instead: items can be "
        "returned within 30 days, unused, with the receipt. Shipping takes 3 to 5 working days in the EU. "
    ) * 2
    result = []
    for _ in range(count):
        messages = [{"role": "system", "content": system}]
        for turn in range(turns):
            parts = rng.sample(texts, texts_per_turn)
            messages.append({"role": "user" if turn % 2 == 0 else "assistant", "content": " ".join(parts)})
        result.append(messages)
    return result


def single_messages(texts: list[str], count: int, rng: random.Random, *, chars: int = 4000) -> list[list[dict]]:
    """One user message of `chars` characters each, labeled texts joined until it is that long."""
    bodies = []
    for _ in range(count):
        content = ""
        while len(content) < chars:
            content += rng.choice(texts) + " "
        bodies.append([{"role": "user", "content": content[:chars]}])
    return bodies


def time_input(
    checks: dict[str, str] | None, bodies: list[list[dict]], rounds: int, *, earlier_turns_seen: bool = False
) -> tuple[list[float], list[float]]:
    """Wall and CPU time (ms) of screen_input per request. The findings the engine remembers per
    text (engine.remembered_spans) are forgotten before each request, so the checks themselves are
    timed; with `earlier_turns_seen`, the request before it (the same conversation less its last
    turn) is screened first, untimed, as in a chat where each request sends the history again."""
    from gateway.screening.engine import forget_spans, screen_input

    screening = policy(checks) if checks is not None else None
    key = SimpleNamespace(screening=screening, tenant_slug="bench", tenant_id=0)
    samples, cpu = [], []
    for _ in range(rounds):
        for messages in bodies:
            forget_spans()
            if earlier_turns_seen:
                before = SimpleNamespace(
                    key=key, body={"messages": [dict(m) for m in messages[:-1]]}, request_id="bench", screening=None
                )
                run_to_end(screen_input(before))
            call = SimpleNamespace(
                key=key, body={"messages": [dict(m) for m in messages]}, request_id="bench", screening=None
            )
            started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
            run_to_end(screen_input(call))
            cpu.append((time.thread_time_ns() - started_cpu) / 1e6)
            samples.append((time.perf_counter_ns() - started) / 1e6)
    return samples, cpu


def time_on_a_busy_loop(checks: dict[str, str], bodies: list[list[dict]], *, in_thread: bool) -> dict:
    """Screening requests one after another on an event loop that eight other coroutines keep busy
    (each a slice of about 0.1 ms of CPU, then a yield, as a saturated web worker's requests are):
    the screened request's wall time, and the longest the others waited for the loop. `in_thread`:
    the checks run in a worker thread, as the request path did until 2026-12-06 for texts of over
    1,000 characters (context: what that cost; it still does past engine.INLINE_CHARS)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import orjson

    from gateway.screening.engine import forget_spans, screen_input

    key = SimpleNamespace(screening=policy(checks), tenant_slug="bench", tenant_id=0)
    work = {"messages": [{"role": "user", "content": "x" * 300}] * 4}
    pool = ThreadPoolExecutor(max_workers=2)

    async def other(stop: asyncio.Event, gaps: list[float]) -> None:
        last = time.perf_counter()
        while not stop.is_set():
            for _ in range(6):
                orjson.loads(orjson.dumps(work))
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append((now - last) * 1000)
            last = now

    async def run() -> tuple[list[float], list[float]]:
        stop, gaps, samples = asyncio.Event(), [], []
        others = [asyncio.create_task(other(stop, gaps)) for _ in range(8)]
        await asyncio.sleep(0.05)
        for messages in bodies:
            forget_spans()
            call = SimpleNamespace(
                key=key, body={"messages": [dict(m) for m in messages]}, request_id="bench", screening=None
            )
            started = time.perf_counter()
            if in_thread:
                await asyncio.get_running_loop().run_in_executor(pool, run_to_end, screen_input(call))
            else:
                await screen_input(call)
            samples.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0)  # the next screened request is another request: the others run between
        stop.set()
        await asyncio.gather(*others)
        return samples, gaps

    settle_web_process()  # as a web process once started (sentinel/asgi.py): no full collection of the weights
    samples, gaps = asyncio.run(run())
    pool.shutdown()
    return {
        **stats(samples),
        "n": len(samples),
        "loop_wait_p99_ms": round(percentile(gaps, 0.99), 3),
        "loop_wait_max_ms": round(max(gaps), 3),
    }


def time_stream(texts: list[str], rounds: int) -> list[float]:
    """Screening a whole streamed answer of 40 chunks (output personal data and moderation on)."""
    from gateway.screening.engine import Screening
    from gateway.screening.policy import Policy
    from gateway.screening.streaming import StreamScreen

    samples = []
    for _ in range(rounds):
        for text in texts:
            words = (text + " ") * 3
            pieces = [words[i : i + 8] for i in range(0, min(len(words), 320), 8)][:40]
            screen = StreamScreen(
                Policy(output_personal_data="redact", output_moderation="block"), Screening(tenant="bench")
            )
            chunks = [
                {"id": "c", "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces
            ]
            chunks.append({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            started = time.perf_counter_ns()
            for chunk in chunks:
                screen.feed(chunk)
            samples.append((time.perf_counter_ns() - started) / 1e6)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="Times each prompt is screened.")
    parser.add_argument("--quick", action="store_true", help="One round, fewer long conversations.")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where results go (default bench/results)")
    parser.add_argument("--data-dir", type=Path, default=None, help="settings' data folder (default .data/bench)")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    start_django(args.data_dir, migrate=False)
    examples = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    texts = [example["text"] for example in examples]
    rng = random.Random(7)
    short = [[{"role": "user", "content": text}] for text in texts]
    # Long conversations from the labeled set are dense with findings (about one text in two carries
    # personal data); long ones from its clean texts are closer to a document or a code review.
    long = conversations(texts, 20 if args.quick else 100, rng)
    long_clean = conversations([e["text"] for e in examples if not e["labels"]], 20 if args.quick else 100, rng)
    chat = conversations(texts, 50 if args.quick else 300, rng, turns=3, texts_per_turn=2)
    single = single_messages(texts, 20 if args.quick else 100, rng)
    single_clean = single_messages([e["text"] for e in examples if not e["labels"]], 20 if args.quick else 100, rng)
    every = {**dict.fromkeys(PERSONAL_DATA, "redact"), "injection": "log", "moderation": "log"}
    logging_only = dict.fromkeys((*PERSONAL_DATA, "injection", "moderation"), "log")
    scenarios = [
        ("no policy", None, short),
        ("short, all checks (redact)", every, short),
        ("short, all checks (log)", logging_only, short),
        ("short, personal data only", dict.fromkeys(PERSONAL_DATA, "redact"), short),
        ("short, injection only", {"injection": "log"}, short),
        ("short, moderation only", {"moderation": "log"}, short),
        ("chat ~1k chars, all checks (redact)", every, chat),
        ("long ~4k chars, all checks (redact)", every, long),
        ("long ~4k chars, all checks (log)", logging_only, long),
        ("long ~4k chars of clean text, all checks", every, long_clean),
        ("long ~4k chars, next turn (history seen)", every, long),
        ("single 4k user message, all checks (redact)", every, single),
        ("single 4k user message, all checks (log)", logging_only, single),
        ("single 4k clean user message, all checks", every, single_clean),
    ]
    from gateway.screening.engine import compile_prefilters

    compile_prefilters()  # as a running process has, once it has met a long text
    time_input(every, short[:50], 1)  # warm up (regex compilation, phonenumbers metadata)
    rows = []
    for name, checks, bodies in scenarios:
        samples, cpu = time_input(checks, bodies, rounds, earlier_turns_seen="history seen" in name)
        chars = sum(len(m["content"]) for body in bodies for m in body) / len(bodies)
        rows.append(
            {
                "scenario": name,
                "n": len(samples),
                "chars": round(chars),
                **stats(samples),
                "cpu_p50_ms": round(percentile(cpu, 0.50), 4),
            }
        )
    busy = []
    for name, in_thread in (("on the loop (as shipped)", False), ("in a worker thread (to 2026-12-06)", True)):
        # In a worker thread each request took seconds: five of them say so.
        sample = single[:5] if in_thread else single[:100]
        busy.append({"scenario": f"single 4k, {name}", **time_on_a_busy_loop(every, sample, in_thread=in_thread)})
    samples = time_stream(texts[:100], rounds)
    rows.append({"scenario": "stream, 40 chunks, output checks", "n": len(samples), "chars": 320, **stats(samples)})

    print(f"{'scenario':<46}{'n':>7}{'chars':>7}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'cpu p50':>9}")
    for row in rows:
        print(
            f"{row['scenario']:<46}{row['n']:>7}{row['chars']:>7}{row['p50_ms']:>9.3f}{row['p99_ms']:>9.3f}"
            f"{row['max_ms']:>9.3f}{row.get('cpu_p50_ms', float('nan')):>9.3f}"
        )
    print(
        f"\n{'on a busy event loop (8 other coroutines)':<50}{'n':>4}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'loop wait p99':>15}{'max':>9}"
    )
    for row in busy:
        print(
            f"{row['scenario']:<50}{row['n']:>4}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}"
            f"{row['loop_wait_p99_ms']:>15.2f}{row['loop_wait_max_ms']:>9.2f}"
        )
    from bench import report

    result = {
        **report.envelope("screening", quick=args.quick),
        "rounds": rounds,
        "scenarios": rows,
        "busy_loop": busy,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "screening.json").write_text(json.dumps(result, indent=2))
    print(f"\nwritten to {args.out / 'screening.json'}")
    return 0


def stats(samples: list[float]) -> dict:
    return {
        "p50_ms": round(percentile(samples, 0.50), 4),
        "p99_ms": round(percentile(samples, 0.99), 4),
        "max_ms": round(max(samples), 4),
    }


if __name__ == "__main__":
    raise SystemExit(main())
