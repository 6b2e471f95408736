"""`make run`: the whole product on one machine.

Starts (or reuses) the embedded PostgreSQL and Valkey unless DATABASE_URL / REDIS_URL point
elsewhere, migrates, prepares the demo (admin, tenant, key, mock-backed models), then runs the mock
provider, the ASGI web server, a Celery worker and Celery beat as child processes. Ctrl-C (or
SIGTERM) stops every child it started, then the embedded servers; the data stays in the data folder.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import py_compile
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from sentinel.env import envint, envstr
from sentinel.startup import wait_until_ready

BASE_DIR = Path(__file__).resolve().parent.parent
STOP_GRACE_SECONDS = 10.0
# What the processes `make run` starts import: the web workers (sentinel.asgi's imports, without
# importing it: it reads the routes, which may not be migrated yet), Celery, the mock provider.
STARTED_MODULES = (
    "django.core.asgi",
    "channels.routing",
    "gateway.http",
    "sentinel.routing",
    "sentinel.urls",
    "celery.apps.worker",
    "celery.apps.beat",
    "gateway.mock_provider",
)

HOST = envstr("SENTINEL_HOST", "127.0.0.1", "Address `make run` serves the gateway and mock provider on.")
PORT = envint("SENTINEL_PORT", 8000, "Port of the gateway (API, console, websockets) under `make run`.")
MOCK_PORT = envint("SENTINEL_MOCK_PORT", 8100, "Port of the mock provider under `make run`.")
WEB_WORKERS = envint("SENTINEL_WEB_WORKERS", os.cpu_count() or 1, "ASGI worker processes (default: one per core).")


@dataclass
class Child:
    name: str
    argv: list[str]
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    def start(self, log_dir: Path, env: dict[str, str]) -> None:
        log = open(log_dir / f"{self.name}.log", "ab")  # noqa: SIM115 - lives as long as the child
        self.process = subprocess.Popen(
            self.argv,
            cwd=BASE_DIR,
            env={**env, **self.extra_env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: we stop it and everything it forks
        )

    def terminate(self) -> None:
        """SIGTERM to the leader only: it stops its own children in order. Signalling the whole group
        would also stop a Celery pool child in the middle of a task (WorkerLostError) instead of
        letting the worker finish it (a warm shutdown)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def group_alive(self) -> bool:
        if self.process is None:
            return False
        self.process.poll()
        try:
            os.killpg(self.process.pid, 0)
            return True
        except ProcessLookupError:
            return False


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


def wait_http_ok(url: str, timeout: float, children: list[Child]) -> bool:
    def stopped() -> str | None:
        return "stopped" if any(c.process and c.process.poll() is not None for c in children) else None

    try:
        wait_until_ready(url, timeout=timeout, stopped=stopped)
    except (RuntimeError, TimeoutError):
        return False
    return True


# The order children stop in: the web processes first (no new requests), then the worker and beat
# (the worker finishes its tasks: a warm shutdown), then the mock provider; storage stops last, when
# this process exits (sentinel.embedded).
STOP_ORDER = (("web",), ("worker", "beat"), ("mock",))


def stop_all(children: list[Child]) -> None:
    by_name = {child.name: child for child in children}
    for names in STOP_ORDER:
        group = [by_name[name] for name in names if name in by_name]
        _stop(group)
    _stop([child for child in children if all(child.name not in names for names in STOP_ORDER)])


def _stop(children: list[Child]) -> None:
    for child in children:
        child.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while time.monotonic() < deadline and any(c.group_alive() for c in children):
        time.sleep(0.1)
    for child in children:  # past the grace period, or a grandchild its leader left behind
        if child.group_alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGKILL)
    for child in children:
        if child.process is not None:
            child.process.wait()


def banner(*, gateway: str, console: str, mock: str, data_dir: Path, demo, embedded: bool) -> str:
    login = (
        f"{demo.admin_username} / {demo.admin_password}"
        if demo.admin_password
        else f"{demo.admin_username} (password changed since it was generated)"
    )
    snippet = (
        f".venv/bin/python -c \"from openai import OpenAI; c = OpenAI(base_url='{gateway}/v1', "
        f"api_key='{demo.key_secret}'); print(c.chat.completions.create(model='gpt-4o-mini', "
        "messages=[{'role': 'user', 'content': 'Hello'}]).choices[0].message.content)\""
    )
    curl = (
        f"curl {gateway}/v1/chat/completions -H 'Authorization: Bearer {demo.key_secret}' "
        "-H 'Content-Type: application/json' "
        '-d \'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}\''
    )
    storage = f"embedded PostgreSQL + Valkey in {data_dir}" if embedded else "DATABASE_URL / REDIS_URL"
    return f"""
Sentinel is running.

  Gateway (OpenAI API)  {gateway}/v1
  Console (admin)       {console}/admin/    login: {login}
  Mock provider         {mock}    (faults: POST {mock}/_control/primary)
  Storage               {storage}
  Metrics               {gateway}/metrics    (API schema and docs: {gateway}/api/docs/)
  Logs                  {data_dir / "logs"}    (JSON lines)

Demo key for tenant "demo" (a new one each start; the previous one is revoked):

export OPENAI_BASE_URL={gateway}/v1
export OPENAI_API_KEY={demo.key_secret}

{curl}

{snippet}

Models: gpt-4o-mini, gpt-4o, fast, smart. Press Ctrl-C to stop everything; the data is kept.
"""


def celery_worker(loglevel: str, *, concurrency: int) -> list[str]:
    """The Celery worker's arguments to Python (here and in bench/stack.py)."""
    return [
        *("-m", "sentinel.celery_cli", "-A", "sentinel", "worker"),
        *("--loglevel", loglevel, "--concurrency", str(concurrency)),
    ]


def celery_beat(loglevel: str, *, pidfile: Path) -> list[str]:
    return ["-m", "sentinel.celery_cli", "-A", "sentinel", "beat", "--loglevel", loglevel, "--pidfile", str(pidfile)]


def prepare() -> None:
    """What the processes need made once before they start, run beside the migrations (a core each):
    the modules they import compiled, and the embedding model exported (first run only)."""
    import django

    django.setup()
    if not compiled():
        for name in STARTED_MODULES:
            importlib.import_module(name)
        from sentinel.celery import app

        app.loader.import_default_modules()  # the worker's tasks
        compile_imported()
    from gateway.cache.engine import shared_embedder

    shared_embedder()  # and the verifier's cut of the model, exported beside it once


def compiled() -> bool:
    """Whether the installed packages have their bytecode already: the test and bench installs
    compile it, an earlier `make run` wrote it (the largest packages stand for the rest)."""
    for name in ("django", "litellm", "openai"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not os.path.exists(importlib.util.cache_from_source(spec.origin)):
            return False
    return True


def compile_imported() -> None:
    """Bytecode for the installed modules imported so far. The install writes none (compiling all
    22,000 files took most of it); a process writes what it imports, unless PYTHONDONTWRITEBYTECODE
    is set, and then every process compiled them again at every start, the web workers past their
    readiness bound. Written here, it is done once."""
    installed = sysconfig.get_paths()["purelib"]
    for module in list(sys.modules.values()):
        source = getattr(module, "__file__", None) or ""
        if source.startswith(installed) and source.endswith(".py"):
            cached = importlib.util.cache_from_source(source)
            if not os.path.exists(cached):
                py_compile.compile(source, cfile=cached, quiet=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run Sentinel with everything it needs.")
    parser.add_argument("--prepare", action="store_true", help="Only prepare what the processes need, then exit.")
    parser.add_argument("--host", default=os.environ.get("SENTINEL_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SENTINEL_PORT", "8000")))
    parser.add_argument("--mock-port", type=int, default=int(os.environ.get("SENTINEL_MOCK_PORT", "8100")))
    parser.add_argument("--workers", type=int, default=int(os.environ.get("SENTINEL_WEB_WORKERS", os.cpu_count() or 1)))
    args = parser.parse_args(argv)
    if args.prepare:
        prepare()
        return 0

    for name, port in (("SENTINEL_PORT", args.port), ("SENTINEL_MOCK_PORT", args.mock_port)):
        if not port_free(args.host, port):
            print(f"Port {port} on {args.host} is in use; set {name} to another port.", file=sys.stderr)
            return 2

    stopping = False

    def request_stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    mock_url = f"http://{args.host}:{args.mock_port}"
    os.environ.setdefault("SENTINEL_MOCK_URL", mock_url)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sentinel.settings")
    embedded = not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    print("Starting storage, migrating, preparing the demo…", flush=True)

    import django

    from sentinel.embedded import ensure_environment

    ensure_environment()  # the embedded servers, for whichever URL is unset; its children inherit the URLs
    python = sys.executable
    preparing = subprocess.Popen([python, "-m", "sentinel.run", "--prepare"], cwd=BASE_DIR)
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from sentinel.demo import ensure_demo

    call_command("migrate", verbosity=0)
    demo = ensure_demo(os.environ["SENTINEL_MOCK_URL"])
    if preparing.wait() != 0 and not stopping:  # the web workers would export the model themselves, each
        print("Preparing the processes failed (see above); starting them anyway.", file=sys.stderr)

    log_dir = settings.DATA_DIR / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    children = [
        Child(
            "mock",
            [python, "-m", "gateway.mock_provider", "--host", args.host, "--port", str(args.mock_port)],
        ),
        Child(
            "web",
            [
                python,
                "-m",
                "sentinel.web",
                "--host",
                args.host,
                "--port",
                str(args.port),
                "--workers",
                str(args.workers),
            ],
            # The web workers share their metrics through this folder (sentinel.web empties it first).
            {
                "PROMETHEUS_MULTIPROC_DIR": os.environ.get("PROMETHEUS_MULTIPROC_DIR")
                or str(settings.DATA_DIR / "metrics")
            },
        ),
        Child(
            "worker",
            [python, *celery_worker("INFO", concurrency=2)],
        ),
        Child(
            "beat",
            [python, *celery_beat("INFO", pidfile=settings.DATA_DIR / "beat.pid")],
        ),
    ]
    env = dict(os.environ)
    for child in children:
        child.start(log_dir, env)

    gateway = f"http://{args.host}:{args.port}"
    try:
        ready = wait_http_ok(f"{mock_url}/health", 30, children) and wait_http_ok(
            f"{gateway}/health/ready", 90, children
        )
        if not ready and not stopping:
            failed = [c.name for c in children if c.process.poll() is not None]
            print(
                f"Sentinel did not become ready (stopped: {failed or 'none'}); see {log_dir}.",
                file=sys.stderr,
            )
            return 1
        if not stopping:
            print(
                banner(
                    gateway=gateway,
                    # The console at the host name security keys are bound to (an IP address cannot be
                    # a WebAuthn relying party: docs/governance.md).
                    console=f"http://localhost:{args.port}" if args.host in ("127.0.0.1", "localhost") else gateway,
                    mock=mock_url,
                    data_dir=settings.DATA_DIR,
                    demo=demo,
                    embedded=embedded,
                ),
                flush=True,
            )
        while not stopping:
            dead = [c for c in children if c.process.poll() is not None]
            if dead:
                print(
                    f"{dead[0].name} stopped unexpectedly; see {log_dir / (dead[0].name + '.log')}.",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.3)
        return 0
    finally:
        with contextlib.suppress(OSError):  # whoever read our output may be gone: stop the children anyway
            print("Stopping…", flush=True)
        stop_all(children)
        from django.db import connections

        connections.close_all()
        with contextlib.suppress(OSError):
            print("Stopped. Data kept in", settings.DATA_DIR, flush=True)


if __name__ == "__main__":
    from sentinel.shutdown import exit_now

    exit_now(main())
