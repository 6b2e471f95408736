"""Scenario 1, overhead: what the gateway adds to a request, against the mock directly and against two
peers (the LiteLLM proxy; Portkey's gateway, non-stream only), on the same machine, mock and load
generator, in one run.

Loads (bench/README.md): zero-latency mock, one request at a time (added p50/p99, streamed first token)
and 32 at a time (throughput), streamed and not; multi-turn conversations (3 to 20 turns, every context
new) one and 32 at a time; and the realistic mock streamed at 32 (throughput and first-token p50
against direct). Sentinel runs with authentication, the ledger (worker and beat draining it) and every
check of its request path on, one web worker per core, and is measured twice: as tenants get it (the
exact and semantic cache on; every prompt unique, so every request is a miss: looked up, then
stored) and, as context, with the cache bypassed per request (no-cache, no-store).

    python -m bench overhead [--quick] [--no-peer] [--no-portkey] [--only LOAD,...] [--workers N] [--out DIR]
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import loadgen, report
from bench.stack import CACHE_MODES, MODEL_ALIAS, Stack, add_stack_arguments, running_stack, web_server

SCENARIO = "overhead"
TARGETS = ("direct", "sentinel", "sentinel-warm", "sentinel-bypass", "litellm", "portkey")
# The process (tree) whose CPU time a request through each target costs, beyond the load generator.
SERVER = {
    "direct": "mock",
    "sentinel": "web",
    "sentinel-warm": "web",
    "sentinel-bypass": "web",
    "litellm": "litellm",
    "portkey": "portkey",
}
# A warm partition: one request in WARM_EVERY asks a prompt answered WARM_BACK requests before it again
# (an exact hit), so the partition never goes cold and every other request is a miss that is searched
# (by the static first stage; MiniLM runs only where an entry could be served: docs/decisions.md, 15).
WARM_EVERY, WARM_BACK = 50, 40
LABELS = {
    "direct": "direct to mock",
    "sentinel": "Sentinel (cache on, misses)",
    "sentinel-warm": "Sentinel (cache on, warm: 1 in 50 repeated)",
    "sentinel-bypass": "Sentinel (cache bypassed)",
    "litellm": "LiteLLM proxy",
    "portkey": "Portkey gateway",
}
BYPASS = {"x-sentinel-cache-control": "no-cache, no-store"}
RUN = uuid.uuid4().hex[:8]


@dataclass(frozen=True)
class Load:
    name: str
    title: str
    profile: str  # mock profile
    stream: bool
    concurrency: int
    total: int | None  # requests per target (None: bounded by duration only)
    duration: float | None  # seconds per target
    warmup: int  # requests before measuring, per target
    ramp: float = 0.0  # seconds over which the workers' first requests are staggered
    turns: bool = False  # conversations of 3 to 20 turns, each context new (every request a new partition)


def takes_part(load: Load, target: str) -> bool:
    """Portkey streams nothing on Node 20 here; the peers are not measured on multi-turn loads; the
    warm partition is measured non-streamed, one request at a time and 32 at once."""
    if target == "portkey" and load.stream:
        return False
    if target == "sentinel-warm":
        return load.name in ("c1-nonstream", "c32-nonstream")
    return not (load.turns and target in ("litellm", "portkey"))


def loads(quick: bool) -> list[Load]:
    if quick:
        return [
            Load("c1-nonstream", "c=1 non-stream", "zero", False, 1, 30, 10, 5),
            Load("c1-stream", "c=1 stream", "zero", True, 1, 30, 10, 5),
            Load("c32-nonstream", "c=32 non-stream", "zero", False, 32, 2000, 1.0, 32),
            Load("c32-stream", "c=32 stream", "zero", True, 32, 2000, 1.0, 32),
            Load("c1-multiturn", "c=1 multi-turn", "zero", False, 1, 30, 10, 5, turns=True),
            Load("c32-multiturn", "c=32 multi-turn", "zero", False, 32, 2000, 1.0, 32, turns=True),
            Load("realistic-c32-stream", "realistic, c=32 stream", "realistic", True, 32, 64, 5, 0, 0.45),
        ]
    return [
        Load("c1-nonstream", "c=1 non-stream", "zero", False, 1, 2000, 20, 100),
        Load("c1-stream", "c=1 stream", "zero", True, 1, 1000, 20, 50),
        Load("c32-nonstream", "c=32 non-stream", "zero", False, 32, None, 10, 500),
        Load("c32-stream", "c=32 stream", "zero", True, 32, None, 10, 200),
        Load("c1-multiturn", "c=1 multi-turn", "zero", False, 1, 1000, 20, 50, turns=True),
        Load("c32-multiturn", "c=32 multi-turn", "zero", False, 32, None, 10, 200, turns=True),
        # Staggered over one answer's time (450 ms), so the 32 clients are not in lockstep.
        Load("realistic-c32-stream", "realistic, c=32 stream", "realistic", True, 32, None, 20, 64, 0.45),
        # Not a target: at c=32 the mock's pacing caps every target at about 71/s (32 / 0.45 s), below
        # five times what the proxy reaches on this machine. At 128 the pacing allows about 280/s, so
        # the ratio shows what each gateway's own cost leaves of it.
        Load("realistic-c128-stream", "realistic, c=128 stream", "realistic", True, 128, None, 20, 128, 0.45),
    ]


def target_request(stack: Stack, target: str) -> tuple[str, dict[str, str], str]:
    """URL, headers and model name for one target."""
    if target == "direct":
        return stack.direct_url, {}, "gpt-4o-mini"
    if target in ("sentinel", "sentinel-warm"):
        # A namespace of its own per run (and for the warm partition): every run starts from an empty
        # cache, whatever earlier runs left in the bench database (the prompts are unique either way).
        namespace = {"x-sentinel-cache-namespace": f"overhead-{RUN}{'-warm' if target == 'sentinel-warm' else ''}"}
        return stack.sentinel_url, {"authorization": f"Bearer {stack.key}", **namespace}, MODEL_ALIAS
    if target == "sentinel-bypass":
        return stack.sentinel_url, {"authorization": f"Bearer {stack.key}", **BYPASS}, MODEL_ALIAS
    if target == "portkey":
        from bench import portkey

        return f"{stack.portkey_url}/v1/chat/completions", portkey.headers(stack.mock_url), "gpt-4o-mini"
    return stack.litellm_url, {}, "mock"


def conversation(prefix: str, i: int) -> list[dict]:
    """3 to 20 turns; the earlier turns make every request's context, so its cache partition, new."""
    messages = []
    for turn in range(2 + i % 18):
        messages.append({"role": "user", "content": f"{prefix} turn {turn}: tell me about item {turn}"})
        messages.append({"role": "assistant", "content": f"Item {turn} is one of the items you asked about."})
    messages.append({"role": "user", "content": "And what else can you tell me?"})
    return messages


def measure(stack: Stack, load: Load, target: str, run_id: str) -> tuple[loadgen.Result, dict]:
    """The load's result, the CPU milliseconds per successful request the target's own server
    process spent (the mock's for direct; Sentinel's web workers; the LiteLLM proxy) and, for
    Sentinel, each web worker's share of that CPU (how evenly the connections were spread)."""
    url, headers, model = target_request(stack, target)

    def body_for(phase: str):
        def body(i: int) -> dict:
            if target == "sentinel-warm" and i >= WARM_BACK and i % WARM_EVERY == 0:
                i -= WARM_BACK  # asked (and answered) before: an exact hit
            prompt = f"bench {run_id} {target} {load.name} {phase} {i}: tell me something"
            messages = conversation(prompt, i) if load.turns else [{"role": "user", "content": prompt}]
            return {"model": model, "messages": messages, "stream": load.stream}

        return body

    # The peer is slow enough that a fixed count would take minutes: time bounds every run.
    if load.warmup:
        loadgen.run(
            loadgen.run_load(
                url,
                body_for("warm"),
                concurrency=load.concurrency,
                total=load.warmup,
                duration=load.duration,
                headers=headers,
            )
        )
    workers = stack.web_workers() if target.startswith("sentinel") else []
    workers_before = stack.cpu_of(workers)
    semantic_before = semantic_lookups(stack) if target in ("sentinel", "sentinel-warm") else {}
    cpu_before = stack.cpu_seconds(SERVER[target])
    storage_before = stack.storage_cpu_seconds() if target.startswith("sentinel") else None
    result = loadgen.run(
        loadgen.run_load(
            url,
            body_for("run"),
            concurrency=load.concurrency,
            total=load.total,
            duration=load.duration,
            headers=headers,
            ramp=load.ramp,
        )
    )
    cpu = stack.cpu_seconds(SERVER[target]) - cpu_before
    extra = {"server_cpu_ms_per_request": round(cpu * 1000 / result.ok, 3) if result.ok else None}
    if storage_before is not None and result.ok:
        # PostgreSQL's and Valkey's CPU beside the web workers' (cache stores, the ledger, admission):
        # context for the web column, which is what a gateway process costs; the peers keep no state.
        storage = (stack.storage_cpu_seconds() or storage_before) - storage_before
        extra["storage_cpu_ms_per_request"] = round(storage * 1000 / result.ok, 3)
    if workers:
        spent = [after - before for after, before in zip(stack.cpu_of(workers), workers_before, strict=True)]
        extra["web_worker_cpu_share"] = [round(s / sum(spent), 2) if sum(spent) else None for s in spent]
    if target in ("sentinel", "sentinel-warm"):
        after = semantic_lookups(stack)
        extra["semantic_lookups"] = {outcome: int(after[outcome] - semantic_before[outcome]) for outcome in after}
    return result, extra


def semantic_lookups(stack: Stack) -> dict[str, float]:
    """What the web workers' semantic tier did so far (sentinel_cache_semantic_lookups_total, every
    worker's): searched, skipped_empty (a new partition), skipped_cold (a partition where nothing
    was served for SENTINEL_CACHE_COLD_AFTER stores); and prompts embedded and the model runs that
    embedded them (their ratio is the mean batch)."""
    from prometheus_client.parser import text_string_to_metric_families

    counts = dict.fromkeys(("searched", "skipped_empty", "skipped_cold", "embedded", "embed_runs"), 0.0)
    text = httpx.get(f"{stack.gateway_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if family.name == "sentinel_cache_semantic_lookups" and sample.labels.get("outcome") in counts:
                counts[sample.labels["outcome"]] += sample.value
            elif family.name == "sentinel_cache_embedded_prompts":
                counts["embedded"] += sample.value
            elif family.name == "sentinel_cache_embed_runs":
                counts["embed_runs"] += sample.value
    return counts


def probe_sentinel(stack: Stack) -> dict:
    """One request through Sentinel before measuring, cache on: the answer is the mock's and the path
    is the cache-miss path (what the headers say is recorded with the results)."""
    from gateway.mock_provider import answer_text

    prompt = f"bench probe {uuid.uuid4().hex}"
    response = httpx.post(
        stack.sentinel_url,
        json={"model": MODEL_ALIAS, "messages": [{"role": "user", "content": prompt}]},
        headers=target_request(stack, "sentinel")[1],
        timeout=30,
    )
    if response.status_code != 200:
        raise RuntimeError(f"Sentinel's probe request failed: {response.status_code} {response.text[:300]}")
    content = response.json()["choices"][0]["message"]["content"]
    if content != answer_text(prompt):
        raise RuntimeError(f"Sentinel's probe got a wrong answer: {content[:80]!r}")
    return {k: v for k, v in response.headers.items() if k.startswith("x-sentinel-") and k != "x-sentinel-request-id"}


def warm_every_worker(stack: Stack, run_id: str, rounds: int = 10) -> list[float]:
    """Load Sentinel until every web worker has done real work: a worker's first requests pay for
    lazy imports and caches, and which worker a measured connection lands on is up to the kernel.
    Returns the CPU seconds each worker spent warming."""
    workers = stack.web_workers()
    before = stack.cpu_of(workers)
    spent = [0.0] * len(workers)

    def body(i: int) -> dict:
        prompt = f"bench {run_id} warm-all {i}"
        return {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": prompt}], "stream": i % 2 == 1}

    for n in range(rounds):
        loadgen.run(
            loadgen.run_load(
                stack.sentinel_url,
                lambda i, n=n: body(n * 256 + i),
                concurrency=32,
                total=256,
                headers=target_request(stack, "sentinel")[1],
            )
        )
        spent = [after - b for after, b in zip(stack.cpu_of(workers), before, strict=True)]
        if min(spent) >= 0.5:
            break
    return [round(s, 2) for s in spent]


def derive(rows: dict[tuple[str, str], dict], have_peer: bool) -> tuple[list[dict], list[dict]]:
    """Added latency vs direct (c=1) and the issues' targets (#9, #19), from the measured rows."""

    def get(load: str, target: str, field: str):
        return (rows.get((load, target)) or {}).get(field)

    def minus(a, b):
        return None if a is None or b is None else round(a - b, 3)

    def ratio(a, b):
        return None if not a or not b else round(a / b, 2)

    added = []
    for target in TARGETS[1:]:
        if ("c1-nonstream", target) not in rows:
            continue
        added.append(
            {
                "target": target,
                "nonstream_p50_ms": minus(
                    get("c1-nonstream", target, "p50_ms"), get("c1-nonstream", "direct", "p50_ms")
                ),
                "nonstream_p99_ms": minus(
                    get("c1-nonstream", target, "p99_ms"), get("c1-nonstream", "direct", "p99_ms")
                ),
                "stream_ttft_p50_ms": minus(
                    get("c1-stream", target, "ttft_p50_ms"), get("c1-stream", "direct", "ttft_p50_ms")
                ),
                "stream_ttft_p99_ms": minus(
                    get("c1-stream", target, "ttft_p99_ms"), get("c1-stream", "direct", "ttft_p99_ms")
                ),
                "multiturn_p50_ms": minus(
                    get("c1-multiturn", target, "p50_ms"), get("c1-multiturn", "direct", "p50_ms")
                ),
            }
        )
    by_target = {a["target"]: a for a in added}

    def check(name: str, measured, goal: str, met) -> dict:
        return {"check": name, "measured": measured, "target": goal, "met": None if measured is None else met}

    def at_most(name: str, measured, limit: float, goal: str) -> dict:
        return check(name, measured, goal, measured is not None and measured <= limit)

    def at_least(name: str, measured, limit: float, goal: str) -> dict:
        return check(name, measured, goal, measured is not None and measured >= limit)

    on, off = "sentinel", "sentinel-bypass"
    cpu = "server_cpu_ms_per_request"
    s_c32, b_c32, l_c32, k_c32 = (get("c32-nonstream", t, "rps") for t in (on, off, "litellm", "portkey"))
    s_cpu, b_cpu, k_cpu = (get("c32-nonstream", t, cpu) for t in (on, off, "portkey"))
    s_real = get("realistic-c32-stream", on, "rps")
    d_real = get("realistic-c32-stream", "direct", "rps")
    l_real = get("realistic-c32-stream", "litellm", "rps")
    ttft_delta = minus(
        get("realistic-c32-stream", on, "ttft_p50_ms"), get("realistic-c32-stream", "direct", "ttft_p50_ms")
    )
    a_on, a_off, a_k = (by_target.get(t, {}) for t in (on, off, "portkey"))
    per_core = ratio(ratio(1000, s_cpu), ratio(1000, k_cpu))  # requests per CPU-second, Sentinel / Portkey
    checks = [
        at_most("c=1 non-stream, cache on: added p50 (ms)", a_on.get("nonstream_p50_ms"), 3, "≤ 3 ms"),
        at_most("c=1 stream, cache on: first token added p50 (ms)", a_on.get("stream_ttft_p50_ms"), 3, "≤ 3 ms"),
        at_least("c=32 non-stream, cache on: Sentinel / LiteLLM throughput", ratio(s_c32, l_c32), 10, "≥ 10×"),
        at_least("c=32 non-stream: cache on / cache bypassed throughput", ratio(s_c32, b_c32), 0.6, "≥ 0.60"),
        at_most("c=32 non-stream: CPU per miss / CPU per bypassed request", ratio(s_cpu, b_cpu), 2, "≤ 2×"),
        at_most(
            "multi-turn c=32: CPU per request, cache on / bypassed",
            ratio(get("c32-multiturn", on, cpu), get("c32-multiturn", off, cpu)),
            1.1,
            "≤ 1 (CPU per request moves ±10% run to run)",
        ),
        at_least("c=32 non-stream, cache bypassed: Sentinel / LiteLLM throughput", ratio(b_c32, l_c32), 10, "≥ 10×"),
        at_most("c=1 non-stream, cache bypassed: added p50 (ms)", a_off.get("nonstream_p50_ms"), 2, "≤ 2 ms"),
        at_least("c=32 non-stream, cache on: requests per CPU-second, Sentinel / Portkey", per_core, 1, "> 1 (ahead)"),
        at_least(
            "c=32 non-stream: throughput, Sentinel cache on (all its workers) / Portkey (one process)",
            ratio(s_c32, k_c32),
            0,
            "context",
        ),
        check(
            "c=1 non-stream: added p50, Sentinel cache on minus Portkey (ms)",
            minus(a_on.get("nonstream_p50_ms"), a_k.get("nonstream_p50_ms")),
            "< 0 (ahead)",
            (minus(a_on.get("nonstream_p50_ms"), a_k.get("nonstream_p50_ms")) or 0) < 0,
        ),
        at_least("realistic, stream, c=32: Sentinel / direct throughput", ratio(s_real, d_real), 0.9, "≥ 0.90"),
        at_least("realistic, stream, c=32: Sentinel / LiteLLM throughput", ratio(s_real, l_real), 5, "≥ 5×"),
        at_most("realistic, stream, c=32: first-token p50 added vs direct (ms)", ttft_delta, 10, "≤ 10 ms"),
    ]
    checks[9]["met"] = None  # context, not a target
    s_wide, d_wide, l_wide = (get("realistic-c128-stream", t, "rps") for t in (on, "direct", "litellm"))
    if s_wide:
        for name, value in (("direct", ratio(s_wide, d_wide)), ("LiteLLM", ratio(s_wide, l_wide))):
            checks.append(
                {
                    "check": f"realistic, stream, c=128: Sentinel / {name} throughput",
                    "measured": value,
                    "target": "context, not a target",
                    "met": None,
                }
            )
    if not have_peer:
        checks = [c for c in checks if "LiteLLM" not in c["check"]]
    if not k_c32:
        checks = [c for c in checks if "Portkey" not in c["check"]]
    return added, checks


def plot(path: Path, rows: dict, samples: dict, all_loads: list[Load], targets: list[str]) -> None:
    plt = report.pyplot()
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    colors = {
        "direct": "#7f7f7f",
        "sentinel": "#1f77b4",
        "sentinel-warm": "#9467bd",
        "sentinel-bypass": "#aec7e8",
        "litellm": "#d62728",
        "portkey": "#2ca02c",
    }
    fig, grid = plt.subplots(2, 2, figsize=(15, 10))
    axes = grid.flatten()

    width = 0.8 / len(targets)

    def bars(ax, groups: list[str], value: Callable[[int, str], float], fmt: str, ylabel: str, title: str) -> None:
        """A group of bars per x label, one bar per target, on a log scale."""
        for t_i, target in enumerate(targets):
            values = [value(i, target) for i in range(len(groups))]
            xs = [i + (t_i - (len(targets) - 1) / 2) * width for i in range(len(groups))]
            drawn = ax.bar(xs, values, width, label=LABELS[target], color=colors[target])
            ax.bar_label(drawn, labels=[format(v, fmt) for v in values], fontsize=8)
        ax.set_xticks(range(len(groups)), groups)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(title)

    def at_c32(field: str) -> Callable[[int, str], float]:
        return lambda i, target: (rows.get((c32[i].name, target)) or {}).get(field) or 0

    c32 = [ld for ld in all_loads if ld.concurrency == 32]
    titles = [ld.title for ld in c32]
    bars(axes[0], titles, at_c32("rps"), ",.0f", "requests / s (log)", "Throughput at 32 concurrent requests")
    axes[0].legend()

    c1 = [("c1-nonstream", "p50_ms", "non-stream\np50"), ("c1-nonstream", "p99_ms", "non-stream\np99")]
    c1 += [("c1-stream", "ttft_p50_ms", "stream\n1st token p50"), ("c1-stream", "ttft_p99_ms", "stream\n1st token p99")]
    bars(
        axes[1],
        [label for _, _, label in c1],
        lambda i, target: (rows.get((c1[i][0], target)) or {}).get(c1[i][1]) or 0,
        ".1f",
        "ms (log)",
        "One request at a time (zero-latency mock)",
    )

    ax = axes[2]
    for target in targets:
        ttfts = sorted(samples.get(("realistic-c32-stream", target)) or [])
        if ttfts:
            ys = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
            ax.plot([t * 1000 for t in ttfts], ys, label=LABELS[target], color=colors[target])
    ax.set_xscale("log")
    low, high = ax.get_xlim()
    ax.set_xticks([t for t in (50, 100, 200, 500, 1000, 2000, 5000, 10000) if low <= t <= high])
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("first token, ms (log)")
    ax.set_ylabel("share of requests")
    ax.set_title("Realistic mock, stream, c=32: first token")
    ax.grid(alpha=0.3)
    ax.legend()

    bars(
        axes[3],
        titles,
        at_c32("server_cpu_ms_per_request"),
        ".2f",
        "CPU ms per request (log)",
        "Server CPU per request at c=32 (mock / Sentinel web workers / proxy)",
    )

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke test, not a measurement")
    parser.add_argument(
        "--peer",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure the LiteLLM proxy too (default: yes, except with --quick)",
    )
    parser.add_argument(
        "--portkey",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure Portkey's gateway too, non-stream (default: yes, except with --quick)",
    )
    parser.add_argument("--only", default="", help="comma-separated load names (default: every load)")
    parser.add_argument("--no-plot", action="store_true")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    with_peer = (not args.quick) if args.peer is None else args.peer
    with_portkey = (not args.quick) if args.portkey is None else args.portkey

    from bench import peer

    result = report.envelope(SCENARIO, quick=args.quick)
    all_loads = loads(args.quick)
    if args.only:
        wanted = set(args.only.split(","))
        all_loads = [ld for ld in all_loads if ld.name in wanted]
    rows: dict[tuple[str, str], dict] = {}
    samples: dict[tuple[str, str], list[float]] = {}
    run_id = uuid.uuid4().hex[:8]
    with running_stack(
        out_dir=args.out,
        data_dir=args.data_dir,
        workers=args.workers,
        cache=args.cache,
        ledger_worker=not args.quick,
        peer=with_peer,
        portkey=with_portkey,
    ) as stack:
        targets = [t for t in TARGETS if (t != "litellm" or stack.peer_url) and (t != "portkey" or stack.portkey_url)]
        result["config"] = {
            "sentinel_web_workers": args.workers,
            "sentinel_web_server": web_server(args),
            "ledger_worker": not args.quick,
            "sentinel_conditions": stack.conditions.rsplit("; ", 1)[0]
            + f"; measured twice: {CACHE_MODES['miss'][1]}, and as context {CACHE_MODES['bypass'][1]}",
            "loads": [ld.__dict__ for ld in all_loads],
            "mock_tokens": 40,
        }
        result["sentinel_probe_headers"] = probe_sentinel(stack)
        result["warm_up_cpu_s_per_worker"] = warm_every_worker(stack, run_id)
        if stack.peer_url:
            result["peer"] = {"version": peer.version(), "conditions": peer.CONDITIONS}
            result["versions"]["litellm_peer"] = peer.version()
        else:
            result["peer"] = {"missing": stack.peer_missing or "not asked for (--no-peer or --quick)"}
        if stack.portkey_url:
            from bench import portkey

            result["portkey"] = {"version": portkey.version(args.data_dir), "conditions": portkey.CONDITIONS}
        else:
            result["portkey"] = {"missing": stack.portkey_missing or "not asked for (--no-portkey or --quick)"}
        profile = None
        for load in all_loads:
            if load.profile != profile:
                stack.mock_profile(load.profile)
                profile = load.profile
            for target in [t for t in targets if takes_part(load, t)]:
                print(f"  {load.title:<24} {LABELS[target]:<28}", end="", flush=True)
                measured, extra = measure(stack, load, target, run_id)
                summary = {**measured.summary(), **extra}
                cpu_ms = extra["server_cpu_ms_per_request"]
                rows[(load.name, target)] = summary
                samples[(load.name, target)] = measured.ttfts
                print(
                    f"{summary['rps']:>9,.1f} rps  p50 {report.fmt(summary['p50_ms'], 2):>8} ms"
                    f"  1st token p50 {report.fmt(summary['ttft_p50_ms'], 2):>8} ms"
                    f"  cpu/request {report.fmt(cpu_ms, 2):>6} ms"
                    + (
                        f" (+ storage {report.fmt(extra['storage_cpu_ms_per_request'], 2)})"
                        if "storage_cpu_ms_per_request" in extra
                        else ""
                    )
                    + f"  errors {summary['errors']}"
                    + (
                        f"  workers' CPU split {extra['web_worker_cpu_share']}"
                        if "web_worker_cpu_share" in extra
                        else ""
                    )
                    + (f"  semantic tier {extra['semantic_lookups']}" if "semantic_lookups" in extra else ""),
                    flush=True,
                )
    added, checks = derive(rows, bool(stack.peer_url))
    result["rows"] = [{"load": load, "target": target, **summary} for (load, target), summary in rows.items()]
    result["added_vs_direct"] = added
    result["targets"] = checks

    print()
    print(
        report.table(
            [
                "load",
                "target",
                "requests",
                "errors",
                "rps",
                "p50 ms",
                "p99 ms",
                "1st token p50",
                "1st token p99",
                "server CPU ms/req",
            ],
            [
                [
                    next(ld.title for ld in all_loads if ld.name == r["load"]),
                    LABELS[r["target"]],
                    r["requests"],
                    r["errors"],
                    r["rps"],
                    r["p50_ms"],
                    r["p99_ms"],
                    r["ttft_p50_ms"],
                    r["ttft_p99_ms"],
                    r["server_cpu_ms_per_request"],
                ]
                for r in result["rows"]
            ],
            title="Overhead (zero-latency mock unless noted; one run)",
        )
    )
    print()
    print(
        report.table(
            [
                "target",
                "non-stream p50 +ms",
                "non-stream p99 +ms",
                "1st token p50 +ms",
                "1st token p99 +ms",
                "multi-turn p50 +ms",
            ],
            [
                [
                    LABELS[a["target"]],
                    a["nonstream_p50_ms"],
                    a["nonstream_p99_ms"],
                    a["stream_ttft_p50_ms"],
                    a["stream_ttft_p99_ms"],
                    a["multiturn_p50_ms"],
                ]
                for a in added
            ],
            title="Added to one request at a time, vs direct",
        )
    )
    print()
    print(
        report.table(
            ["check", "measured", "target", "met"],
            [[c["check"], c["measured"], c["target"], c["met"]] for c in checks],
            title="Targets (issues #9 and #19)",
        )
    )
    if not stack.peer_url:
        print(f"\nNo LiteLLM proxy in this run: {result['peer']['missing']}")
    else:
        print(f"\nPeer: {peer.CONDITIONS}.")
    if "missing" in result["portkey"]:
        print(f"No Portkey gateway in this run: {result['portkey']['missing']}")
    else:
        print(f"Second peer: {result['portkey']['conditions']}.")
    print(f"Sentinel: {result['config']['sentinel_conditions']}.")
    path = report.write_json(args.out, SCENARIO, result)
    print(f"Results: {path}")
    if not args.no_plot:
        png = args.out / f"{SCENARIO}.png"
        plot(png, rows, samples, all_loads, targets)
        print(f"Plot: {png}")
    failed = sum(r["errors"] for r in result["rows"])
    return 1 if failed and args.quick else 0
