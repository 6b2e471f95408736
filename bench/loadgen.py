"""A small async load generator for OpenAI-style chat endpoints (aiohttp, one process).

Two shapes of load: closed-loop (`run_load`: `concurrency` workers, each firing its next request as
soon as the last one ends, for a count or a duration) and open-loop (`run_rate`: a fixed arrival
rate, whatever the server does). It reports throughput, latency percentiles and, for streams, the
time to the first content token, read from the SSE events themselves.

Written here because wrk cannot read SSE first-token times and locust's per-request overhead is
larger than the gateway's on this machine. It shares the cores with the servers it measures, so each
request costs as little as it can: bodies are encoded once per request with orjson, and a stream is
parsed only until its first content token unless the caller asks to validate the whole answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import orjson

# A stream's last event; what follows it (nothing) is checked with this many trailing bytes.
DONE = b"data: [DONE]"
_TAIL = 64


@dataclass
class Result:
    requests: int = 0  # finished, whatever the outcome
    errors: int = 0  # non-200, connection errors, time-outs, streams without [DONE], wrong answers
    truncated: int = 0  # 200 answers cut short: a stream without [DONE], a connection broken mid-body
    wrong: int = 0  # answers the caller's `validate` rejected
    shed: int = 0  # run_rate: arrivals skipped because `max_in_flight` requests were still open
    statuses: dict[int, int] = field(default_factory=dict)  # 0: no HTTP status (connection error)
    latencies: list[float] = field(default_factory=list)  # seconds, successful requests
    ttfts: list[float] = field(default_factory=list)  # seconds, successful streams
    headers: list[dict] = field(default_factory=list)
    wall: float = 0.0

    @property
    def ok(self) -> int:
        return self.requests - self.errors

    @property
    def rps(self) -> float:
        """Successful requests per second of wall time."""
        return self.ok / self.wall if self.wall else 0.0

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "ok": self.ok,
            "errors": self.errors,
            "truncated": self.truncated,
            "wrong": self.wrong,
            "shed": self.shed,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "rps": round(self.rps, 1),
            "p50_ms": percentile_ms(self.latencies, 0.50),
            "p95_ms": percentile_ms(self.latencies, 0.95),
            "p99_ms": percentile_ms(self.latencies, 0.99),
            "mean_ms": round(sum(self.latencies) / len(self.latencies) * 1000, 3) if self.latencies else None,
            "ttft_p50_ms": percentile_ms(self.ttfts, 0.50),
            "ttft_p95_ms": percentile_ms(self.ttfts, 0.95),
            "ttft_p99_ms": percentile_ms(self.ttfts, 0.99),
            "wall_s": round(self.wall, 3),
        }


def percentile_ms(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of seconds, in milliseconds."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)


def _has_content(event: bytes) -> bool:
    """Whether one SSE event carries answer text (role-only and usage-only chunks do not)."""
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            continue
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        for choice in data.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                return True
    return False


def stream_text(raw: bytes) -> str:
    """The answer text of a whole SSE body (for validation)."""
    parts = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data:") and (payload := line[5:].strip()) and payload != b"[DONE]":
            try:
                data = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            for choice in data.get("choices") or ():
                parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


class _Client:
    """One session and the per-request logic both load shapes share."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        result: Result,
        headers: dict[str, str],
        keep_headers: tuple[str, ...],
        validate: Callable[[int, bytes, bool], bool] | None,
    ) -> None:
        self.session = session
        self.url = url
        self.result = result
        self.headers = headers
        self.keep_headers = keep_headers
        self.validate = validate

    async def one(self, i: int, body: dict) -> None:
        result = self.result
        stream = bool(body.get("stream"))
        started = time.perf_counter()
        status = 0
        first = None
        complete = True
        answer = b""
        try:
            async with self.session.post(self.url, data=orjson.dumps(body), headers=self.headers) as response:
                status = response.status
                if self.keep_headers:
                    result.headers.append({h: response.headers.get(h) for h in self.keep_headers})
                if stream and status == 200:
                    keep_all = self.validate is not None
                    pending = b""
                    tail = b""
                    async for piece in response.content.iter_any():
                        if first is None:
                            pending += piece
                            while first is None and (end := pending.find(b"\n\n")) >= 0:
                                if _has_content(pending[:end]):
                                    first = time.perf_counter()
                                pending = pending[end + 2 :]
                            if first is not None and not keep_all:
                                pending = b""
                        if keep_all:
                            answer += piece
                        tail = (tail + piece)[-_TAIL:]
                    complete = tail.rstrip().endswith(DONE)
                else:
                    answer = await response.read()
        except (TimeoutError, aiohttp.ClientError):
            if status == 200:  # the answer began, then the connection broke: a cut answer
                complete = False
            else:
                status = 0
        elapsed = time.perf_counter() - started
        result.requests += 1
        result.statuses[status] = result.statuses.get(status, 0) + 1
        if status != 200:
            result.errors += 1
            return
        if not complete:
            result.truncated += 1
            result.errors += 1
            return
        if self.validate is not None and not self.validate(i, answer, stream):
            result.wrong += 1
            result.errors += 1
            return
        result.latencies.append(elapsed)
        if first is not None:
            result.ttfts.append(first - started)


def _session(limit: int, timeout: float) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        timeout=aiohttp.ClientTimeout(total=timeout),
        skip_auto_headers=("User-Agent",),
    )


async def run_load(
    url: str,
    body_for: Callable[[int], dict],
    *,
    concurrency: int,
    total: int | None = None,
    duration: float | None = None,
    headers: dict[str, str] | None = None,
    keep_headers: tuple[str, ...] = (),
    validate: Callable[[int, bytes, bool], bool] | None = None,
    timeout: float = 60.0,
    ramp: float = 0.0,
) -> Result:
    """POST body_for(i) with `concurrency` requests in flight, until `total` requests were sent or
    `duration` seconds passed (whichever comes first; at least one of them is required).

    `ramp` staggers the workers' first requests over that many seconds: against a slow upstream,
    workers that all start at once stay in lockstep and hit the server in bursts of `concurrency`,
    which independent clients do not.

    `validate(i, answer, stream)` gets the body (non-stream) or the whole SSE body (stream) of each
    200 answer; False counts the request as a wrong answer.
    """
    if total is None and duration is None:
        raise ValueError("run_load needs a total, a duration or both")
    result = Result()
    next_index = 0
    limit = total if total is not None else float("inf")
    base_headers = {"content-type": "application/json", **(headers or {})}

    async with _session(concurrency, timeout) as session:
        client = _Client(session, url, result, base_headers, keep_headers, validate)
        started = time.perf_counter()
        stop_at = started + duration if duration is not None else float("inf")

        async def worker(n: int) -> None:
            nonlocal next_index
            if ramp:
                await asyncio.sleep(ramp * n / concurrency)
            while next_index < limit and time.perf_counter() < stop_at:
                i = next_index
                next_index += 1
                await client.one(i, body_for(i))

        await asyncio.gather(*(worker(n) for n in range(concurrency)))
        result.wall = time.perf_counter() - started
    return result


@dataclass(frozen=True)
class Target:
    url: str
    body_for: Callable[[int], dict]
    headers: dict[str, str] = field(default_factory=dict)


async def run_alternating(targets: list[Target], *, total: int, timeout: float = 60.0) -> list[Result]:
    """One request at a time, to each target in turn, `total` rounds: targets measured side by side
    see the same moment of a shared machine. Each round starts one target further on, so every target
    follows every other equally often (a request can slow the next one down with work it leaves
    behind, such as the ledger worker's). Targets on one host share one keep-alive connection (so
    one server process, where workers each own a socket). One Result per target."""
    results = [Result() for _ in targets]
    sessions: dict[str, aiohttp.ClientSession] = {}
    clients = []
    try:
        for target, result in zip(targets, results, strict=True):
            host = target.url.split("/", 3)[2]
            session = sessions.get(host) or sessions.setdefault(host, _session(1, timeout))
            headers = {"content-type": "application/json", **target.headers}
            clients.append(_Client(session, target.url, result, headers, (), None))
        started = time.perf_counter()
        pairs = list(zip(clients, targets, strict=True))
        for i in range(total):
            start = i % len(pairs)
            for client, target in pairs[start:] + pairs[:start]:
                await client.one(i, target.body_for(i))
        for result in results:
            result.wall = time.perf_counter() - started
    finally:
        for session in sessions.values():
            await session.close()
    return results


async def run_rate(
    url: str,
    body_for: Callable[[int], dict],
    *,
    rate: float,
    duration: float,
    max_in_flight: int = 256,
    headers: dict[str, str] | None = None,
    validate: Callable[[int, bytes, bool], bool] | None = None,
    timeout: float = 60.0,
) -> Result:
    """Start body_for(i) at a fixed `rate` per second for `duration` seconds, whatever the answers'
    speed (open loop); an arrival that finds `max_in_flight` requests still open is shed and counted."""
    result = Result()
    base_headers = {"content-type": "application/json", **(headers or {})}
    tasks: set[asyncio.Task] = set()
    async with _session(max_in_flight, timeout) as session:
        client = _Client(session, url, result, base_headers, (), validate)
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        i = 0
        while (due := i / rate) < duration:
            wait = started + due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if len(tasks) >= max_in_flight:
                result.shed += 1
            else:
                task = loop.create_task(client.one(i, body_for(i)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.gather(*tasks)
        result.wall = time.perf_counter() - started
    return result


def run(coro):
    """asyncio.run on uvloop when available: the client's own cost per request is part of what
    limits a run on two shared cores."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
