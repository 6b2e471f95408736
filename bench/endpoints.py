"""Every endpoint apps call, one request at a time, against the mock directly: what Sentinel adds to
chat completions, the Responses API, Anthropic's Messages API and embeddings, on the fast path (an
OpenAI-format deployment) and through litellm's translation (an Anthropic-format deployment).

    python -m bench endpoints [--requests 400] [--rounds 1] [--alternate] [--only ROW,...] [--quick]
                              [--cache bypass|miss] [--workers N] [--out DIR]

Zero-latency mock, one request at a time (c=1), non-stream; the cache bypassed per request so every
request reaches the provider (the endpoints' cache rules differ: docs/api.md), or with `--cache
miss` on, as tenants have it, every prompt unique (a miss: looked up and stored); authentication,
admission, budgets and the ledger on. Each row gives the p50/p99 latency, what Sentinel adds to the
p50 of the same upstream call made directly (chat's direct call for chat, responses and messages
over the OpenAI format; the mock's Messages endpoint for the Anthropic format; its embeddings
endpoint for embeddings) and the web workers' CPU per request. Issue #16's target: each new
endpoint's added p50 within 1 ms of chat completions' on the fast path.

On a shared machine one pass compares rows measured seconds apart, under whatever else ran then:
`--rounds N` measures the rows N times in turn (odd rounds in reverse order) and gives each row the
median of its rounds' p50s, and each endpoint's difference to chat as the median of the differences
within a round. `--alternate` measures the rows side by side instead, one request to each in turn,
so that every row sees the same moments of the machine. `--only` measures some rows (by name;
with their direct baselines, and chat completions, which every comparison needs).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from bench import loadgen, report
from bench.stack import MODEL_ALIAS, PROVIDER, Stack, add_stack_arguments, running_stack, web_server

SCENARIO = "endpoints"
ANTHROPIC_ALIAS = "bench-anthropic"
ANTHROPIC_MODEL = "anthropic/claude-3-5-haiku-20241022"
EMBEDDING_ALIAS = "bench-embed"
EMBEDDING_MODEL = "openai/text-embedding-3-small"
BYPASS = {"x-sentinel-cache-control": "no-cache, no-store"}
CACHE_HEADERS = {"bypass": BYPASS, "miss": {}}  # --cache miss: every prompt unique, through the cache
PROMPT = "Say something about the sea."


@dataclass(frozen=True)
class Row:
    name: str
    target: str  # "direct" or "sentinel"
    path: str  # after the base URL
    body: dict
    baseline: str  # the direct row this one is compared with ("" for a direct row)
    fast_path: bool = True  # an OpenAI-format deployment: Sentinel's own transport, no translation


ROWS = [
    Row("direct: chat completions", "direct", "/v1/chat/completions", {"model": "gpt-4o-mini"}, ""),
    Row("direct: messages (Anthropic format)", "direct", "/v1/messages", {"model": "claude-3-5-haiku"}, ""),
    Row("direct: embeddings", "direct", "/v1/embeddings", {"model": "text-embedding-3-small"}, ""),
    Row("chat completions", "sentinel", "/v1/chat/completions", {"model": MODEL_ALIAS}, "direct: chat completions"),
    Row("responses", "sentinel", "/v1/responses", {"model": MODEL_ALIAS}, "direct: chat completions"),
    Row("messages", "sentinel", "/v1/messages", {"model": MODEL_ALIAS}, "direct: chat completions"),
    Row("embeddings", "sentinel", "/v1/embeddings", {"model": EMBEDDING_ALIAS}, "direct: embeddings"),
    Row(
        "chat completions → Anthropic format",
        "sentinel",
        "/v1/chat/completions",
        {"model": ANTHROPIC_ALIAS},
        "direct: messages (Anthropic format)",
        fast_path=False,
    ),
    Row(
        "messages → Anthropic format",
        "sentinel",
        "/v1/messages",
        {"model": ANTHROPIC_ALIAS},
        "direct: messages (Anthropic format)",
        fast_path=False,
    ),
]


def body_of(row: Row, i: int, cache: str = "bypass") -> dict:
    # With the cache on, each row's prompts are its own: the rows share the bench alias's cache
    # partition, and the same prompt asked on another row would be that row's exact hit.
    text = f"{PROMPT} ({i})" if cache == "bypass" else f"{PROMPT} ({row.name}, {i})"
    if row.path in ("/v1/embeddings", "/v1/responses"):
        return {**row.body, "input": text}
    if row.path == "/v1/messages":
        return {**row.body, "max_tokens": 64, "messages": [{"role": "user", "content": text}]}
    return {**row.body, "messages": [{"role": "user", "content": text}]}


def prepare_models(mock_url: str) -> None:
    """An Anthropic-format deployment and an embedding deployment on the mock's bench provider."""
    from django.db import transaction

    from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
    from sentinel.localstate import announce_change

    with transaction.atomic():
        anthropic, _ = Provider.objects.update_or_create(
            name="bench-mock-anthropic", defaults={"kind": "anthropic", "api_base": f"{mock_url}/p/{PROVIDER}"}
        )
        anthropic.set_api_key("sk-ant-mock-bench")
        anthropic.save()
        openai = Provider.objects.get(name="bench-mock")
        for alias_name, deployment_name, provider, model in [
            (ANTHROPIC_ALIAS, "bench-mock-anthropic", anthropic, ANTHROPIC_MODEL),
            (EMBEDDING_ALIAS, "bench-mock-embed", openai, EMBEDDING_MODEL),
        ]:
            deployment, _ = Deployment.objects.update_or_create(
                name=deployment_name, defaults={"provider": provider, "litellm_model": model, "enabled": True}
            )
            alias, _ = ModelAlias.objects.update_or_create(
                name=alias_name, defaults={"description": "The benchmarks' model (python -m bench endpoints)"}
            )
            ChainEntry.objects.get_or_create(alias=alias, deployment=deployment, defaults={"position": 0})
    announce_change()


def target(stack: Stack, row: Row, cache: str = "bypass") -> tuple[str, dict[str, str]]:
    if row.target == "direct":
        headers = {"authorization": "Bearer sk-mock-bench", "x-api-key": "sk-mock-bench"}
        return f"{stack.mock_url}/p/{PROVIDER}{row.path}", headers
    headers = {"authorization": f"Bearer {stack.key}", **CACHE_HEADERS[cache]}
    if row.path == "/v1/messages":
        headers["anthropic-version"] = "2023-06-01"
    return f"{stack.gateway_url}{row.path}", headers


def measure(stack: Stack, row: Row, total: int, warmup: int, first: int = 0, cache: str = "bypass") -> dict:
    url, headers = target(stack, row, cache)
    warming = loadgen.run_load(url, lambda i: body_of(row, -1 - i, cache), concurrency=1, total=warmup, headers=headers)
    loadgen.run(warming)
    server = "mock" if row.target == "direct" else "web"
    cpu_before = stack.cpu_seconds(server)
    result = loadgen.run(
        loadgen.run_load(url, lambda i: body_of(row, first + i, cache), concurrency=1, total=total, headers=headers)
    )
    cpu = stack.cpu_seconds(server) - cpu_before
    return measured(row, result, round(cpu * 1000 / result.ok, 3) if result.ok else None)


def measured(row: Row, result, cpu_ms_per_request: float | None) -> dict:
    """One row's figures, as the table and the results file show them."""
    summary = result.summary()
    return {
        "row": row.name,
        "target": row.target,
        "path": row.path,
        "fast_path": row.fast_path,
        "baseline": row.baseline,
        "requests": result.requests,
        "errors": result.errors,
        "p50_ms": summary.get("p50_ms"),
        "p99_ms": summary.get("p99_ms"),
        "server_cpu_ms_per_request": cpu_ms_per_request,
    }


def measure_alternating(
    stack: Stack, rows: list[Row], total: int, warmup: int, first: int = 0, cache: str = "bypass"
) -> list[dict]:
    """The rows side by side: one request to each in turn (gateway rows on one connection, so one web
    worker). The web workers' CPU is not told apart by row here."""

    def targets(offset: int) -> list[loadgen.Target]:
        made = []
        for row in rows:
            url, headers = target(stack, row, cache)
            made.append(loadgen.Target(url, lambda i, row=row: body_of(row, offset + i, cache), headers))
        return made

    loadgen.run(loadgen.run_alternating(targets(-1 - warmup), total=warmup))
    results = loadgen.run(loadgen.run_alternating(targets(first), total=total))
    return [measured(row, result, None) for row, result in zip(rows, results, strict=True)]


def compare(rows: list[dict]) -> None:
    """Added p50 against each row's direct call, and each endpoint's against chat completions'."""
    by_name = {r["row"]: r for r in rows}
    for r in rows:
        base = by_name.get(r["baseline"])
        if base and r["p50_ms"] is not None and base["p50_ms"] is not None:
            r["added_p50_ms"] = round(r["p50_ms"] - base["p50_ms"], 3)
    chat = by_name["chat completions"].get("added_p50_ms")
    for r in rows:
        if r["target"] == "sentinel" and chat is not None and r.get("added_p50_ms") is not None:
            r["added_vs_chat_ms"] = round(r["added_p50_ms"] - chat, 3)
            r["within_1ms_of_chat"] = r["added_vs_chat_ms"] <= 1.0 if r["fast_path"] else None


def combine(rounds: list[list[dict]]) -> list[dict]:
    """One row from each row's rounds: the medians of its p50s, p99s and CPU, and (rounds compared
    first, then the median) its difference to chat completions within the same round."""
    for measured in rounds:
        compare(measured)
    rows = []
    for i, first in enumerate(rounds[0]):
        each = [measured[i] for measured in rounds]
        row = {**first, "requests": sum(r["requests"] for r in each), "errors": sum(r["errors"] for r in each)}
        for field in ("p50_ms", "p99_ms", "server_cpu_ms_per_request", "added_p50_ms", "added_vs_chat_ms"):
            values = [r[field] for r in each if r.get(field) is not None]
            if values:
                row[field] = round(statistics.median(values), 3)
            if len(rounds) > 1 and values:
                row[f"{field}_rounds"] = values
        if row.get("added_vs_chat_ms") is not None:
            row["within_1ms_of_chat"] = row["added_vs_chat_ms"] <= 1.0 if row["fast_path"] else None
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench endpoints", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 requests a row: a smoke test")
    parser.add_argument("--requests", type=int, default=400, help="requests per row and round")
    parser.add_argument("--rounds", type=int, default=1, help="measure the rows this many times in turn")
    parser.add_argument("--only", default="", help="rows to measure, by name, comma-separated")
    parser.add_argument(
        "--alternate",
        action="store_true",
        help="one request to each row in turn instead of row after row (no CPU figures)",
    )
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    total, warmup = (40, 10) if args.quick else (args.requests, 50)
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = only - {row.name for row in ROWS}
    if unknown:
        parser.error(f"no row named {', '.join(sorted(unknown))}; rows: {', '.join(row.name for row in ROWS)}")
    wanted = only | {"direct: chat completions", "chat completions"}
    wanted |= {row.baseline for row in ROWS if row.name in wanted}
    selected = [row for row in ROWS if not only or row.name in wanted]
    result = report.envelope(SCENARIO, quick=args.quick)
    result["config"] = {
        "requests_per_row": total,
        "rounds": args.rounds,
        "alternate": args.alternate,
        "concurrency": 1,
        "stream": False,
        "web_server": web_server(args),
        "mock": "zero latency",
        "cache": "bypassed per request (no-cache, no-store)" if args.cache == "bypass" else "on, every prompt a miss",
    }
    with running_stack(out_dir=args.out, data_dir=args.data_dir, workers=args.workers, mock_profile="zero") as stack:
        prepare_models(stack.mock_url)
        rounds = []
        for n in range(args.rounds):
            if args.alternate:
                rounds.append(measure_alternating(stack, selected, total, warmup, first=n * total, cache=args.cache))
                print(f"round {n + 1}: {rounds[-1]}", flush=True)
                continue
            measured = {}
            for row in selected if n % 2 == 0 else selected[::-1]:
                measured[row.name] = measure(stack, row, total, warmup, first=n * total, cache=args.cache)
                print(f"round {n + 1}, {row.name}: {measured[row.name]}", flush=True)
            rounds.append([measured[row.name] for row in selected])
    rows = combine(rounds)
    result["rows"] = rows
    report.write_json(args.out, SCENARIO, result)
    print(
        report.table(
            ["endpoint", "p50 ms", "p99 ms", "added p50", "vs chat", "CPU ms/req", "errors"],
            [
                [
                    r["row"],
                    r["p50_ms"],
                    r["p99_ms"],
                    r.get("added_p50_ms"),
                    r.get("added_vs_chat_ms"),
                    r["server_cpu_ms_per_request"],
                    r["errors"],
                ]
                for r in rows
            ],
            f"c=1, non-stream, zero-latency mock, cache {'bypassed' if args.cache == 'bypass' else 'on (misses)'},"
            f" {args.rounds} round(s), medians"
            " (CPU: mock's on direct rows, else web workers')",
        )
    )
    return 1 if any(r["errors"] for r in rows) else 0
