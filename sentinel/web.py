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

Each worker bounds the request head (request line and headers) at SENTINEL_MAX_HEADER_BYTES: uvicorn's
httptools protocol has no such bound of its own (a 40 MB Authorization header was read, kept and
handed to the application), so BoundedHttpToolsProtocol adds one.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.errors import GatewayError
from sentinel import logs
from sentinel.env import envstr

APP = "sentinel.asgi:application"
# After refusing a request head, how long the worker keeps reading (and dropping) what the client is
# still sending before it closes the connection; see BoundedHttpToolsProtocol._refuse.
LINGER_SECONDS = 5.0


class HeadTooLarge(Exception):
    """Raised from the parser's headers-complete callback: stops parsing a head over the bound."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bound on each request's head (request target and headers).
    The bytes read while a head is incomplete are counted: the parser keeps a header that has not
    ended to itself, so a head still incomplete past the bound is refused there (at most one read,
    64-256 KiB, is held beyond it). When a head completes, its exact size is added up only if it
    could be over the bound (the reads that carried it were larger, or it came after another request
    in the same read): the usual request pays one comparison. Over the bound: 431. Requests the
    parser refuses, which uvicorn answers 400 in plain text, get the same treatment: an error in
    OpenAI's shape with nosniff."""

    def __init__(self, *args, max_head_bytes: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_head_bytes = max_head_bytes
        self.head_received = 0  # bytes of the reads since this request's head began
        self.reading_head = True
        self.head_begun = False  # the parser has seen this head's first byte
        self.pipelined = False  # this head began in a read that also carried the previous request
        self.refused = False

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the bound, and this class's answers to what the parser refuses."""
        if self.refused:
            return  # lingering after an error: what the client still sends is dropped
        self._unset_keepalive_if_required()
        if self.reading_head:
            self.head_received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            if isinstance(error.__context__, HeadTooLarge):  # raised by on_headers_complete
                self._refuse(self._too_large())
            else:
                self.logger.warning("Invalid HTTP request received.")
                self._refuse(GatewayError(400, "invalid_http_request", "Invalid HTTP request received."))
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if not self.reading_head:
            return
        if not self.head_begun:
            self.pipelined = False  # the read that ended the previous request held nothing of the next
        elif self.head_received > self.max_head_bytes and not self.transport.is_closing():
            self._refuse(self._too_large())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_begun = True

    def on_headers_complete(self) -> None:
        self.reading_head = False
        if (self.head_received > self.max_head_bytes or self.pipelined) and self._head_size() > self.max_head_bytes:
            raise HeadTooLarge  # through the parser, to data_received
        self.pipelined = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # The rest of this read, if any, is the next request's: its head is measured exactly.
        self.reading_head, self.head_begun, self.head_received, self.pipelined = True, False, 0, True

    def _head_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)  # ": ", CRLF

    def _too_large(self) -> GatewayError:
        return GatewayError(
            431,
            "request_headers_too_large",
            f"Request headers are larger than {self.max_head_bytes} bytes.",
            kind="invalid_request_error",
        )

    def _refuse(self, error: GatewayError) -> None:
        """Answer `error` and close. The close is graceful: the response, then end of stream, then
        input is read and dropped for a moment. Closing a socket with unread input resets the
        connection, which can destroy the response before a client still sending has read it."""
        self.refused = True
        if self.cycle is not None and not self.cycle.response_complete:
            # A request before it on this connection (pipelined) is still being answered: that answer
            # is finished, then the connection closes; the refused request gets none.
            self.cycle.keep_alive = False
            return
        body = error.body()
        head = [STATUS_LINE[error.status]]
        for name, value in [
            *self.server_state.default_headers,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"connection", b"close"),
        ]:
            head.append(name + b": " + value + b"\r\n")
        self.transport.write(b"".join([*head, b"\r\n", body]))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)


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
    """One worker: uvicorn (uvloop and httptools, with a bounded request head) on its own socket."""
    import uvicorn

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sentinel.settings")
    from django.conf import settings

    config = uvicorn.Config(
        APP,
        http=functools.partial(BoundedHttpToolsProtocol, max_head_bytes=settings.MAX_HEADER_BYTES),
        lifespan="off",
        access_log=False,  # the gateway logs each chat completion itself, with more to say
        log_config=logs.config(level),
    )
    uvicorn.Server(config).run(sockets=[listening_socket(host, port)])


def serve_child(host: str, port: int, level: str) -> int:
    """A forked worker's exit status: 0 when it stopped, 1 with the traceback on stderr when it failed
    (it leaves by os._exit, which skips the interpreter's own report of an uncaught exception)."""
    try:
        serve(host, port, level)
    except SystemExit as exit_:
        return 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported here: the worker leaves by os._exit
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def preload() -> None:
    """Import once, before the workers fork, the libraries each of them would import on its own
    (they share the pages, copy-on-write): litellm and the OpenAI SDK it loads are ~8 s of CPU per
    process on this machine, paid N times at once at every start and by every replacement worker.
    Libraries only, after the settings have put litellm's offline switches into the environment:
    nothing imported here may open a connection or start a thread, which a forked worker would not
    inherit in a working state, so a thread found afterwards stops the start."""
    import threading

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sentinel.settings")
    from django.conf import settings

    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = settings.LITELLM_LOCAL_MODEL_COST_MAP  # as the settings set it
    import litellm  # noqa: F401

    if threading.active_count() != 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        raise RuntimeError(f"preloading the web workers' libraries started threads ({names}); fork would break them")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from sentinel.embedded import ensure_environment

    ensure_environment()  # before the workers read settings: they inherit the URLs (and this process keeps the servers)
    prepare_metrics_dir()  # before any worker imports prometheus_client: they inherit the environment
    level = envstr("SENTINEL_LOG_LEVEL", "INFO", "Log level of Sentinel's own loggers.")
    if args.workers <= 1:
        serve(args.host, args.port, level)
        return 0
    preload()

    def spawn() -> int:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os._exit(serve_child(args.host, args.port, level))
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
        code = os.waitstatus_to_exitcode(code)  # -N: killed by signal N
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
    from sentinel.shutdown import exit_now

    exit_now(main())
