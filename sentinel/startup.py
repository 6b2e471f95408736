"""Starting local processes: a free port to give one, and waiting until it answers over HTTP. Used by
`make run` (sentinel.run), the embedded servers, the benchmarks' stacks and the test fixtures."""

from __future__ import annotations

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
