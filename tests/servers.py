"""Real processes for end-to-end tests: the mock provider and gateway (uvicorn) servers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from sentinel.startup import free_port, wait_until_ready

BASE_DIR = Path(__file__).resolve().parent.parent


def wait_until_ok(url: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    def exited() -> str | None:
        return None if process.poll() is None else f"process for {url} exited with {process.returncode}"

    wait_until_ready(url, timeout=timeout, stopped=exited)


def stop_process(process: subprocess.Popen, timeout: float = 10.0) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            pass


@dataclass
class MockProviderServer:
    url: str
    process: subprocess.Popen

    def control(self, provider: str, **faults) -> dict:
        response = httpx.post(f"{self.url}/_control/{provider}", json=faults, timeout=5)
        response.raise_for_status()
        return response.json()

    def stats(self, provider: str) -> dict:
        return httpx.get(f"{self.url}/_control/{provider}", timeout=5).json()

    def api_base(self, provider: str, kind: str = "openai") -> str:
        """The virtual provider's API base as a deployment of that litellm provider kind names it
        (Anthropic's and Gemini's paths are their own: gateway.mock_dialects)."""
        return f"{self.url}/p/{provider}" + {"anthropic": "", "gemini": "/v1beta"}.get(kind, "/v1")

    def stop(self) -> None:
        stop_process(self.process)


def start_mock_provider(*extra: str) -> MockProviderServer:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.mock_provider", "--port", str(port), *extra],
        cwd=BASE_DIR,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    server = MockProviderServer(f"http://127.0.0.1:{port}", process)
    wait_until_ok(f"{server.url}/health", process)
    return server


def database_url_for(name: str) -> str:
    """The session's DATABASE_URL pointed at another database on the same server (the test DB)."""
    parts = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


@dataclass
class GatewayServer:
    url: str
    process: subprocess.Popen
    env: dict = field(repr=False)
    log_path: Path = field(repr=False)
    metrics_dir: Path = field(repr=False)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def stop(self) -> None:
        stop_process(self.process)
        shutil.rmtree(self.metrics_dir, ignore_errors=True)


def wait_semantic_ready(server: GatewayServer, timeout: float = 60.0) -> None:
    """Until the process has loaded its embedding model (before that, the semantic tier is skipped)."""
    deadline = time.monotonic() + timeout
    while httpx.get(f"{server.url}/health/ready", timeout=5).json().get("semantic_cache") != "ready":
        if time.monotonic() > deadline:
            raise AssertionError("the gateway's embedding model never loaded")
        time.sleep(0.05)


# For tests of exactness under concurrency (limits and budgets across processes): Redis is waited
# for as long as it takes to answer. Under the request path's own timeout (100 ms), a Redis that a
# loaded two-core host leaves unscheduled for a moment is taken for down, and a tenant's default
# (fail open) then admits by each process's own count, budgets unchecked: a full run once admitted
# 102 of a budget's 100. What a stall does is tested on its own (test_admission_outage.py).
PATIENT_REDIS = {"SENTINEL_REDIS_TIMEOUT_MS": "10000"}


def start_gateway(
    database: str, *, workers: int = 1, env: dict | None = None, wait_path: str = "/health/ready"
) -> GatewayServer:
    """A web process as `make run` starts it (python -m sentinel.web), on the given test database,
    with its own metrics folder; its output (JSON log lines) goes to tests/artifacts/."""
    port = free_port()
    metrics_dir = Path(tempfile.mkdtemp(prefix=f"sentinel-test-metrics-{port}-"))
    process_env = {
        **os.environ,
        "DATABASE_URL": database_url_for(database),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        # Security keys are bound to where the browser tests open the console: http://localhost is a
        # secure context, and an IP address can be no WebAuthn relying party.
        "SENTINEL_WEBAUTHN_ORIGIN": f"http://localhost:{port}",
        **(env or {}),
    }
    log_path = BASE_DIR / "tests" / "artifacts" / f"gateway-{port}.log"
    log = open(log_path, "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "sentinel.web", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)],
        cwd=BASE_DIR,
        env=process_env,
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = GatewayServer(f"http://127.0.0.1:{port}", process, process_env, log_path, metrics_dir)
    try:
        wait_until_ok(server.url + wait_path, process, timeout=90)
    except BaseException:
        server.stop()  # never left running (its workers restarting) by a test that failed here
        raise
    return server


@dataclass
class CeleryWorker:
    process: subprocess.Popen
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        """Its consumer name in the ledger stream is <host>-<pid>."""
        return self.process.pid

    def stop(self) -> None:
        stop_process(self.process)

    def kill(self) -> None:
        """kill -9, no goodbye: what a crash or the OOM killer does."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def start_celery_worker(database: str, *, env: dict | None = None, name: str = "w") -> CeleryWorker:
    """A real Celery worker on the test database (solo pool: one process, killable as a unit)."""
    process_env = {**os.environ, "DATABASE_URL": database_url_for(database), **(env or {})}
    log_path = BASE_DIR / "tests" / "artifacts" / f"celery-{name}-{free_port()}.log"
    log = open(log_path, "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sentinel.celery_cli",
            "-A",
            "sentinel",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"{name}-{free_port()}@%h",
        ],
        cwd=BASE_DIR,
        env=process_env,
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_for_worker(log_path, process)
    return CeleryWorker(process, log_path)


def wait_for_worker(log_path: Path, process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until the worker consumes: its start (importing litellm, Django) takes seconds, many more on a
    loaded machine, and a test counting on a delivery must not spend its own wait on that."""
    deadline = time.monotonic() + timeout
    while b" ready." not in log_path.read_bytes():
        if process.poll() is not None:
            raise RuntimeError(f"celery worker exited with {process.returncode}: see {log_path}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"celery worker not ready after {timeout}s: see {log_path}")
        time.sleep(0.1)


class Listener:
    """The tests' HTTP server on a loopback address (a webhook receiver, a guardrail, a provider, a
    redirect target). It counts every TCP connection it accepts, so a test can say that nothing
    reached it (`connections == 0`), and records every request (`calls`: method, path, headers,
    body; `requests`: the same without the method). Its answer is `status` with `headers` and
    `body` (the first `failures` answers are 500 instead), or whatever `respond(path, headers, body)`
    returns as (status, body)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
        body: bytes = b'{"action": "allow"}',
        failures: int = 0,
        respond: Callable[[str, dict, bytes], tuple[int, bytes]] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.connections = 0
        self.calls: list[tuple[str, str, dict, bytes]] = []  # (method, path, headers, body)
        lock = threading.Lock()
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                sent_headers, sent = {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length)
                with lock:
                    listener.calls.append((self.command, self.path, sent_headers, sent))
                    failing = len(listener.calls) <= failures
                code, payload = respond(self.path, sent_headers, sent) if respond else (status, body)
                self.send_response(500 if failing else code)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = answer

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

            def verify_request(self, request, client_address) -> bool:
                with lock:
                    listener.connections += 1
                return True

        self.server = Server((host, port), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.host, self.port = host, self.server.server_address[1]
        self.scheme = "https" if tls is not None else "http"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def requests(self) -> list[tuple[str, dict, bytes]]:
        """(path, headers, body) of every request, in order."""
        return [(path, headers, body) for _, path, headers, body in self.calls]

    @property
    def origin(self) -> str:
        """scheme://host:port, no path: a base URL for a client to add its own paths to."""
        return self.url("")

    def url(self, path: str = "/", host: str | None = None) -> str:
        """This listener's URL, or `host` (a name or another spelling of its address) with its port."""
        host = host or (f"[{self.host}]" if ":" in self.host else self.host)
        return f"{self.scheme}://{host}:{self.port}{path}"

    def seen(self, text: str) -> bool:
        """Whether `text` appeared anywhere in what this listener received (paths, headers, bodies)."""
        return any(
            text in path or text in body.decode(errors="replace") or any(text in v for v in headers.values())
            for _, path, headers, body in self.calls
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# The egress guard's tests: 127.0.0.2 plays a public host (a process under test is started with it on
# SENTINEL_EGRESS_ALLOW); 127.0.0.1, where the listeners that must hear nothing are, is internal.
PUBLIC_HOST = "127.0.0.2"
# URLs every form that takes one refuses, with the guard's reason.
INTERNAL_URLS = [
    ("http://169.254.169.254/latest/", "the host 169.254.169.254 is a link-local address 169.254.169.254"),
    ("http://127.0.0.1:8000/admin/", "the host 127.0.0.1 is a loopback address 127.0.0.1"),
    ("http://[::1]:6379/", "the host ::1 is a loopback address ::1"),
]


def egress_refusal(reason: str) -> str:
    """What the console says of a URL the egress guard refuses."""
    return (
        f"Sentinel does not send requests here: {reason}. An operator can allow a deliberate internal target "
        "with SENTINEL_EGRESS_ALLOW."
    )


@dataclass
class Scrape:
    """One scrape of /metrics: sample values by name and labels."""

    samples: dict[tuple[str, frozenset], float]

    def value(self, name: str, **labels: str) -> float:
        """The sample with exactly these labels (0 when absent, as for a counter never touched)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def series(self, name: str) -> list[dict[str, str]]:
        return [dict(labels) for sample, labels in self.samples if sample == name]


def scrape_metrics(url: str) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(f"{url}/metrics", timeout=10)
    response.raise_for_status()
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Scrape(samples)


class TcpLink:
    """A TCP link from a local port to `target` ((host, port), or a Unix socket's path) that a test
    can cut and restore: the network between a gateway and its PostgreSQL. While cut, its port
    refuses connections and every connection it carried is closed, as when the server restarts; the
    server itself stays up for the rest of the session."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            carried, self._sockets = self._sockets, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread, which frees the port
            listener.close()
        for sock in carried:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                if isinstance(self.target, str):
                    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    server.connect(self.target)
                else:
                    server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._sockets.update((client, server))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets.difference_update((source, sink))
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
