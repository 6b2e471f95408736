"""Starting local processes: a free port to give one, and waiting until it answers over HTTP. Used by
`make run` (sentinel.run), the embedded servers, the benchmarks' stacks and the test fixtures. And
how a web process settles once it has loaded (`settle_web_process`), which the benchmarks that time
its parts in one process do too."""

from __future__ import annotations

import gc
import socket
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS's choice)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` different such ports: each socket is held until all are chosen (a port chosen and let
    go may be the OS's next choice too, before the process it was for has bound it: a full test run
    once gave two Valkey cluster nodes one port)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_until_ready(url: str, *, timeout: float, stopped: Callable[[], str | None] | None = None) -> None:
    """Return once GET `url` answers 200. `stopped` says what died, if anything did, while waiting
    (a RuntimeError with its words); after `timeout` seconds, a TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stopped is not None and (what := stopped()):
            raise RuntimeError(what)
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s")


def settle_web_process() -> None:
    """What a web process does once everything it keeps is loaded (sentinel/asgi.py).

    - Everything made so far lives as long as the process: keep the collector from re-scanning it
      (gc.freeze), and let young objects, which requests make by the thousand, pile up a little
      longer before each collection (the collector showed in ~14% of a loaded worker's samples).
    - numpy's BLAS (OpenBLAS) on one thread. With its default, a thread per core, each matrix
      product of the cache verifier's context features woke a second thread that then spun, waiting
      for more work, on the core the verifier's other thread (or the other web process) needed: the
      verifier's p99 per candidate was 6.6 ms with it, 4.2-4.5 without (bench verifier, docs/cache.md).
      The products a request makes are small; a web process is one per core already.
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 40)
