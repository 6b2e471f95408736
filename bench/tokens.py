"""Tokens benchmark: what bounding a request's prompt for its reservation costs (gateway.limits.tokens).

    python -m bench tokens [--rounds 2000] [--quick] [--out DIR]

Times `prompt_bound` for a deployment of openai/gpt-4o-mini (o200k_base) on: a short chat (a
system prompt and a question, ~80 characters), 3,000-character prompts in CJK, Arabic, emoji, code
and English, and a request whose tools are most of it (six tools, ~7,000 bytes of schema, the same
each round as an app's are; every prompt differs from round to round). Each exactly (what admission
does when a hard budget or a token limit applies: tiktoken, the first 32 KiB of text) and by bytes
alone (what it does otherwise); and for a Claude deployment (bytes by design). CPU time per call
(the process's, so other load on the machine counts less), median and p99 over the rounds, in
microseconds. No server is called. Prints a table; writes bench/results/tokens.json.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

from bench import report
from bench.stack import RESULTS_DIR

SCENARIO = "tokens"
OPENAI = "openai/gpt-4o-mini"
CLAUDE = "anthropic/claude-sonnet-4-5"


def bodies() -> dict[str, dict]:
    rng = random.Random(15)
    hanzi = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生，。"
    emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🔥", " "]
    texts = {
        "cjk 3,000": "".join(rng.choice(hanzi) for _ in range(3000)),
        "arabic 3,000": "".join(rng.choice("ابتثجحخدذرزسشصضطظعغفقكلمنهوي ") for _ in range(3000)),
        "emoji 3,000": "".join(rng.choice(emoji) for _ in range(1300))[:3000],
        "code 3,000": ("def f(x):\n    return {k: v for k, v in x.items() if v is not None}\n" * 50)[:3000],
        "english 3,000": ("The quick brown fox jumps over the lazy dog. " * 70)[:3000],
    }
    found = {
        "short chat": {
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of Chile, in one word?"},
            ]
        }
    }
    found.update({name: {"messages": [{"role": "user", "content": text}]} for name, text in texts.items()})
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a city's weather up for the coming days.",
            "parameters": {
                "type": "object",
                "properties": {
                    f"field_{j}": {"type": "string", "description": "A street in the city, exactly as written"}
                    for j in range(12)
                },
                "required": ["field_0"],
            },
        },
    }
    found["tools (6)"] = {"messages": [{"role": "user", "content": "weather?"}], "tools": [tool] * 6}
    return found


def variants(body: dict, rounds: int) -> list[dict]:
    """A different prompt each round (the text rotated), as distinct requests are: a count remembered
    from an earlier round would not be what a new prompt costs. Tools stay the same, as an app's do."""
    *context, last = body["messages"]
    text = last["content"]
    rotated = (text[i % len(text) :] + text[: i % len(text)] for i in range(rounds))
    return [{**body, "messages": [*context, {"role": "user", "content": turn}]} for turn in rotated]


def cpu_us(function, bodies: list[dict]) -> tuple[float, float]:
    samples = []
    for body in bodies:
        started = time.process_time_ns()
        function(body)
        samples.append((time.process_time_ns() - started) / 1000)
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(0.99 * len(samples)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench tokens", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000, help="calls timed per case")
    parser.add_argument("--quick", action="store_true", help="50 rounds: a smoke test")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where results go (default bench/results)")
    args = parser.parse_args(argv)
    rounds = 50 if args.quick else args.rounds

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm would fetch its price map
    import tiktoken

    from gateway.limits import tokens

    tokens.warm_up()
    result = report.envelope(SCENARIO, quick=args.quick, tiktoken=tiktoken.__version__)
    rows, cases = [], {}
    for name, body in bodies().items():
        text_bytes = tokens.gather(body).text_bytes()
        distinct = variants(body, rounds)
        exact = cpu_us(lambda b: tokens.prompt_bound(b, [OPENAI]), distinct)
        cheap = cpu_us(lambda b: tokens.prompt_bound(b, [OPENAI], exact=False), distinct)
        claude = cpu_us(lambda b: tokens.prompt_bound(b, [CLAUDE]), distinct)
        cases[name] = {
            "text_bytes": text_bytes,
            "bound_exact": tokens.prompt_bound(body, [OPENAI]),
            "bound_bytes": tokens.prompt_bound(body, [OPENAI], exact=False),
            "exact_p50_us": exact[0],
            "exact_p99_us": exact[1],
            "bytes_p50_us": cheap[0],
            "bytes_p99_us": cheap[1],
            "claude_p50_us": claude[0],
        }
        rows.append([name, text_bytes, cases[name]["bound_exact"], exact[0], exact[1], cheap[0], claude[0]])
    result["rounds"] = rounds
    result["cases"] = cases
    print(
        report.table(
            ["request", "bytes", "bound", "exact p50 µs", "exact p99 µs", "bytes p50 µs", "claude p50 µs"],
            rows,
            title=f"Prompt bound per request, CPU time ({rounds} rounds; {OPENAI} unless said)",
        )
    )
    path = report.write_json(args.out, SCENARIO, result)
    print(f"Results: {path}")
    return 0
