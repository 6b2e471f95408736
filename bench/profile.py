"""Where a web worker's time goes under load: py-spy samples the uvicorn workers while 32 requests at a
time run against the zero-latency mock, streamed and not, and multi-turn conversations.

Sentinel runs one uvicorn process per worker on SO_REUSEPORT sockets here, so the connections spread
evenly. The first worker is also recorded as a flame graph (bench/results/profile-<mode>.svg); every
worker is recorded as raw collapsed stacks (profile-<mode>.txt, all workers together), from which the
cost centres are counted: time by package of the innermost frame
(self) and the share of samples that pass through each notable function (inclusive). py-spy samples
only the thread holding the GIL (--gil), so percentages are shares of the worker's Python CPU time.

    python -m bench profile [--seconds 20] [--rate 100] [--modes nonstream,stream,multiturn] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

from bench import loadgen, report
from bench.overhead import conversation
from bench.stack import BASE_DIR, MODEL_ALIAS, Stack, add_stack_arguments, running_stack, web_server

SCENARIO = "profile"
# mode: (streamed, multi-turn conversations as bench overhead's c32-multiturn sends them)
MODES = {"nonstream": (False, False), "stream": (True, False), "multiturn": (False, True)}
_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*)\)$")

# Cost centres counted inclusively: (label, file fragment, regex on the function name or None for any).
CENTRES = [
    ("uvicorn HTTP protocol (httptools parsing, RequestResponseCycle)", "uvicorn/protocols/", None),
    ("Django ASGI handler (the whole request, Sentinel's view included)", "django/core/handlers/", None),
    ("Django request object (ASGIRequest, headers, body)", "django/", r"ASGIRequest|HttpRequest|HttpHeaders"),
    ("Django response sending (send_response, streamed chunks)", "django/core/handlers/asgi.py", r"send_response"),
    ("Django StreamingHttpResponse iteration", "django/http/response.py", r"StreamingHttpResponse"),
    ("Django signals (request_started / request_finished)", "django/dispatch/", None),
    ("asgiref sync_to_async (thread hops)", "asgiref/", None),
    ("thread-pool worker threads (sync_to_async targets)", "concurrent/futures/thread.py", r"_worker"),
    ("Sentinel request path (pipeline.chat_completions)", "gateway/pipeline.py", r"^chat_completions$"),
    ("  authenticate (key lookup)", "gateway/auth.py", r"authenticate"),
    ("  check_shared_state (one Redis MGET)", "gateway/pipeline.py", r"check_shared_state"),
    ("  parse_chat_request (validation, pydantic)", "gateway/schemas.py", r"parse_chat_request"),
    ("  upstream call (gateway.upstream.transport, fast path)", "gateway/upstream/transport.py", None),
    ("  litellm request building (map/transform params)", "litellm/", None),
    ("  streaming relay (gateway.relay)", "gateway/relay.py", r"relay"),
    ("  finish (ledger record, metrics, events)", "gateway/settlement.py", r"^finish$"),
    ("    ledger hand-off (XADD)", "billing/ledger.py", r"hand_off"),
    ("  price lookup and cost", "billing/", r"price|cost"),
    ("aiohttp client (all)", "aiohttp/", None),
    ("redis-py (all Redis calls)", "redis/", None),
    ("pydantic (all)", "pydantic", None),
    ("uuid (request and record ids)", "/uuid.py", None),
    ("logging", "/logging/", None),
]


def package_of(file: str) -> str:
    """A frame's package: the site-packages folder, the stdlib module, or Sentinel's app."""
    if "site-packages/" in file:
        return file.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/lib/python3" in file:
        rest = file.split("/lib/python3", 1)[1].split("/", 1)[1]
        return "stdlib:" + rest.split("/", 1)[0].removesuffix(".py")
    base = str(BASE_DIR) + "/"
    if file.startswith(base):
        return "sentinel:" + file[len(base) :].split("/", 1)[0].removesuffix(".py")
    return file or "?"


def parse_raw(text: str) -> list[tuple[list[tuple[str, str]], int]]:
    """py-spy's raw format: `frame;frame;... count` per line, outermost frame first."""
    stacks = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        frames_text, _, count = line.rpartition(" ")
        frames = []
        for frame in frames_text.split(";"):
            match = _FRAME.match(frame)
            frames.append((match["function"], match["file"]) if match else (frame, ""))
        stacks.append((frames, int(count)))
    return stacks


def cost_centres(stacks: list[tuple[list[tuple[str, str]], int]], possible: int) -> dict:
    """Shares of the samples; `possible` is how many samples a worker that always held the GIL
    would have given."""
    total = sum(count for _, count in stacks) or 1
    self_by_package: Counter = Counter()
    inclusive_fn: Counter = Counter()
    centres: Counter = Counter()
    for frames, count in stacks:
        _leaf_function, leaf_file = frames[-1]
        self_by_package[package_of(leaf_file)] += count
        for fn in {f"{function} ({package_of(file)})" for function, file in frames}:
            inclusive_fn[fn] += count
        for label, fragment, pattern in CENTRES:
            if any(fragment in file and (pattern is None or re.search(pattern, fn)) for fn, file in frames):
                centres[label] += count

    def pct(n: int) -> float:
        return round(100 * n / total, 1)

    return {
        "samples": total,
        "gil_held_pct": round(100 * total / possible, 1) if possible else None,
        "centres_inclusive_pct": {label: pct(centres[label]) for label, _, _ in CENTRES},
        "self_by_package_pct": {name: pct(n) for name, n in self_by_package.most_common(20)},
        "top_functions_inclusive_pct": {name: pct(n) for name, n in inclusive_fn.most_common(40)},
    }


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise RuntimeError("py-spy is not installed (it is in requirements-bench.txt: make bench installs it)")
    return found


def record(stack: Stack, mode: str, seconds: float, rate: int, out: Path) -> dict:
    stream, turns = MODES[mode]
    workers = stack.web_workers()
    svg, raw = out / f"profile-{mode}.svg", out / f"profile-{mode}.txt"
    run_id = uuid.uuid4().hex[:8]

    def body_for(i: int) -> dict:
        prompt = f"profile {run_id} {mode} {i}"
        messages = conversation(prompt, i) if turns else [{"role": "user", "content": prompt}]
        return {"model": MODEL_ALIAS, "messages": messages, "stream": stream}

    loadgen.run(
        loadgen.run_load(
            stack.sentinel_url, body_for, concurrency=32, duration=3, headers=stack.sentinel_headers, total=None
        )
    )
    command = [py_spy(), "record", "--gil", "--nonblocking", "--rate", str(rate), "--duration", str(int(seconds))]
    command.append("--nolineno")
    raws = [out / f"profile-{mode}-{n}.txt" for n in range(len(workers))]
    recorders = [
        subprocess.Popen([*command, "-f", "flamegraph", "-o", str(svg), "-p", str(workers[0].pid)], **_quiet())
    ]
    recorders += [
        subprocess.Popen([*command, "--full-filenames", "-f", "raw", "-o", str(path), "-p", str(w.pid)], **_quiet())
        for path, w in zip(raws, workers, strict=True)
    ]
    try:
        measured = loadgen.run(
            loadgen.run_load(
                stack.sentinel_url,
                body_for,
                concurrency=32,
                duration=seconds + 1,
                headers=stack.sentinel_headers,
            )
        )
        for recorder in recorders:
            recorder.wait(timeout=60)
    finally:
        for recorder in recorders:
            if recorder.poll() is None:
                recorder.kill()
                recorder.wait()
    raw.write_text("".join(path.read_text() for path in raws if path.exists()))
    for path in raws:
        path.unlink(missing_ok=True)
    if not raw.read_text().strip():
        raise RuntimeError(f"py-spy recorded nothing (exit {[r.returncode for r in recorders]})")
    found = cost_centres(parse_raw(raw.read_text()), possible=int(rate * seconds) * len(workers))
    return {"mode": mode, "svg": str(svg), "raw": str(raw), "load": measured.summary(), **found}


def _quiet() -> dict:
    return {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "stdin": subprocess.DEVNULL}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 seconds per mode: a smoke test")
    parser.add_argument("--seconds", type=float, default=20.0, help="sampling time per mode")
    parser.add_argument("--rate", type=int, default=100, help="samples per second")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    seconds = 3.0 if args.quick else args.seconds
    py_spy()
    result = report.envelope(SCENARIO, quick=args.quick)
    result["config"] = {
        "seconds": seconds,
        "rate": args.rate,
        "workers": args.workers,
        "web_server": web_server(args),
        "concurrency": 32,
    }
    modes = []
    with running_stack(
        out_dir=args.out,
        data_dir=args.data_dir,
        workers=args.workers,
        cache=args.cache,
        ledger_worker=True,
    ) as stack:
        for mode in args.modes.split(","):
            print(f"  {mode}: sampling {seconds:.0f} s at c=32", flush=True)
            modes.append(record(stack, mode, seconds, args.rate, args.out))
    result["modes"] = modes
    for found in modes:
        print()
        print(
            report.table(
                ["cost centre (inclusive)", "% of busy samples"],
                [[label, share] for label, share in found["centres_inclusive_pct"].items()],
                title=(
                    f"{found['mode']}: {found['samples']} samples (GIL held {found['gil_held_pct']}% of the time),"
                    f" {found['load']['rps']} rps while sampled"
                ),
            )
        )
        print()
        print(
            report.table(
                ["package of the innermost frame (self)", "%"],
                [[name, share] for name, share in found["self_by_package_pct"].items()],
            )
        )
        print(f"Flame graph: {found['svg']}")
    path = report.write_json(args.out, SCENARIO, result)
    print(f"Results: {path}")
    return 0
