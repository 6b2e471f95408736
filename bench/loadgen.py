"""A small async load generator for OpenAI-style chat endpoints (aiohttp, one process).

Fires `total` requests with `concurrency` in flight and reports throughput, latency percentiles and,
for streams, time to the first content byte. Written here because wrk cannot read SSE first-token
times and locust's per-request overhead is larger than the gateway's on this machine.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import orjson


@dataclass
class Result:
    requests: int = 0
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # seconds
    ttfts: list[float] = field(default_factory=list)  # seconds
    headers: list[dict] = field(default_factory=list)
    wall: float = 0.0

    @property
    def rps(self) -> float:
        return self.requests / self.wall if self.wall else 0.0

    def summary(self) -> dict:
        def pct(values: list[float], q: float) -> float | None:
            if not values:
                return None
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

        return {
            "requests": self.requests,
            "errors": self.errors,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "rps": round(self.rps, 1),
            "p50_ms": pct(self.latencies, 0.50),
            "p95_ms": pct(self.latencies, 0.95),
            "p99_ms": pct(self.latencies, 0.99),
            "mean_ms": statistics.fmean(self.latencies) * 1000 if self.latencies else None,
            "ttft_p50_ms": pct(self.ttfts, 0.50),
            "ttft_p99_ms": pct(self.ttfts, 0.99),
            "wall_s": round(self.wall, 3),
        }


async def run_load(
    url: str,
    body_for: Callable[[int], dict],
    *,
    total: int,
    concurrency: int,
    headers: dict[str, str] | None = None,
    keep_headers: tuple[str, ...] = (),
    timeout: float = 60.0,
) -> Result:
    """POST body_for(i) for i in range(total) with `concurrency` workers."""
    result = Result()
    counter = iter(range(total))
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    base_headers = {"content-type": "application/json", **(headers or {})}

    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as session:

        async def worker() -> None:
            for i in counter:
                body = body_for(i)
                stream = bool(body.get("stream"))
                started = time.perf_counter()
                try:
                    async with session.post(url, data=orjson.dumps(body), headers=base_headers) as response:
                        first = None
                        if stream:
                            async for chunk in response.content.iter_any():
                                if first is None and b'"content":"' in chunk and b'"content":""' not in chunk:
                                    first = time.perf_counter()
                                # keep reading until the server ends the stream
                        else:
                            await response.read()
                        elapsed = time.perf_counter() - started
                        result.statuses[response.status] = result.statuses.get(response.status, 0) + 1
                        if keep_headers:
                            result.headers.append({h: response.headers.get(h) for h in keep_headers})
                        if response.status != 200:
                            result.errors += 1
                        result.latencies.append(elapsed)
                        if first is not None:
                            result.ttfts.append(first - started)
                except (TimeoutError, aiohttp.ClientError):
                    result.errors += 1
                    result.statuses[0] = result.statuses.get(0, 0) + 1
                result.requests += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall = time.perf_counter() - started
    return result
