"""The web process: N uvicorn workers, each on its own SO_REUSEPORT socket on the same port, logging
JSON lines, and the folder where those workers share their metrics, emptied first so a scrape never
adds up an earlier run's.

    python -m sentinel.web --host 0.0.0.0 --port 8000 --workers 2

`make run`, docker-compose.yml and the tests all start the web process this way.

Why not `uvicorn --workers N`: it shares one listening socket, and the worker that wakes first accepts
a whole burst of new connections, so with a few keep-alive clients (an app's connection pool, a load
balancer) one worker can serve everything while the others idle (measured: one worker took all of a
32-connection load, halving throughput). With a socket per worker the kernel spreads connections
evenly. This supervisor forks the workers, forwards SIGINT/SIGTERM to them, and replaces a worker that
dies; a crash loop (workers dying again and again) stops it, so whatever runs it sees the failure.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from sentinel import logs
from sentinel.env import envstr

APP = "sentinel.asgi:application"


def prepare_metrics_dir() -> Path:
    """PROMETHEUS_MULTIPROC_DIR, created and emptied; a temporary folder when it is unset.

    It has to be in the environment before any worker imports prometheus_client, and no two web
    processes may share one (each empties it as it starts)."""
    configured = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
    else:
        path = Path(tempfile.mkdtemp(prefix="sentinel-metrics-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    return path


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Serve Sentinel's web process (API, console, metrics).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    return parser


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def serve(host: str, port: int, level: str) -> None:
    """One worker: uvicorn (uvloop and httptools) on its own socket."""
    import uvicorn

    config = uvicorn.Config(
        APP,
        lifespan="off",
        access_log=False,  # the gateway logs each chat completion itself, with more to say
        log_config=logs.config(level),
    )
    uvicorn.Server(config).run(sockets=[listening_socket(host, port)])


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    prepare_metrics_dir()  # before any worker imports prometheus_client: they inherit the environment
    level = envstr("SENTINEL_LOG_LEVEL", "INFO", "Log level of Sentinel's own loggers.")
    if args.workers <= 1:
        serve(args.host, args.port, level)
        return 0

    def spawn() -> int:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                serve(args.host, args.port, level)
            finally:
                os._exit(0)
        return pid

    children = {spawn() for _ in range(args.workers)}
    stopping = False
    restarts: list[float] = []

    def stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    status = 0
    while children:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            break
        children.discard(pid)
        if stopping:
            continue
        # A worker died (killed, crashed): the others keep serving while a new one starts. A worker
        # that keeps dying at once is a broken deployment: stop, so whatever runs this sees it.
        now = time.monotonic()
        restarts = [t for t in restarts if now - t < 60] + [now]
        if len(restarts) > 5 * args.workers:
            print(f"web workers keep dying (last: {pid}, status {code}); stopping", file=sys.stderr, flush=True)
            status = 1
            stop(None, None)
            continue
        print(f"web worker {pid} exited (status {code}); starting another", file=sys.stderr, flush=True)
        children.add(spawn())
    return status


if __name__ == "__main__":
    sys.exit(main())
