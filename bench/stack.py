"""The processes a scenario measures: storage, the mock provider, Sentinel (web, worker, beat) and,
when asked, the LiteLLM proxy; started on free loopback ports and always stopped by their PIDs.

Storage is what `make run` uses: DATABASE_URL / REDIS_URL when set, else the embedded PostgreSQL and
Valkey, here under their own folder (.data/bench) so a `make run` elsewhere is never touched. The
bench's tenant, key and model are created (or refreshed) in that database on every start.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from sentinel.run import Child, celery_beat, celery_worker, stop_all
from sentinel.startup import free_ports, wait_until_ready

BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = BASE_DIR / ".data" / "bench"
RESULTS_DIR = BASE_DIR / "bench" / "results"
PROVIDER = "bench"  # the mock's virtual provider every target reaches (/p/bench/v1)
MODEL_ALIAS = "bench-mock"
LITELLM_MODEL = "openai/gpt-4o-mini"  # priced in the bundled price map, so the cost path runs too
TENANT_SLUG = "bench"
KEY_NAME = "bench (issued by python -m bench)"

PROFILES = {
    "zero": {"ttft_ms": 0.0, "tpt_ms": 0.0, "tokens": 40},
    "realistic": {"ttft_ms": 120.0, "tpt_ms": 8.0, "tokens": 40},
}


def add_stack_arguments(parser) -> None:
    """The options every scenario that starts a stack shares."""
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="Sentinel web workers (one per core)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where results go (default bench/results)")
    parser.add_argument(
        "--cache",
        choices=sorted(CACHE_MODES),
        default="bypass",
        help="bypass: the cache is skipped per request (default; the gateway's own cost); "
        "miss: unique prompts through the cache's lookup and store",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help="embedded storage folder when DATABASE_URL / REDIS_URL are unset (default .data/bench)",
    )


def web_server(args) -> str:
    """How Sentinel's web workers were run, for the results."""
    return f"python -m sentinel.web: {args.workers} uvicorn processes, one SO_REUSEPORT socket each (as make run)"


def wait_ready(url: str, children: list[Child], timeout: float) -> None:
    def stopped() -> str | None:
        dead = [c.name for c in children if c.process is not None and c.process.poll() is not None]
        return f"{', '.join(dead)} stopped during start-up (see the logs)" if dead else None

    wait_until_ready(url, timeout=timeout, stopped=stopped)


def wait_embedder(url: str, workers: int, timeout: float = 180.0) -> None:
    """Until every web worker has loaded the cache's embedding model (until then a worker skips the
    semantic tier, and a run on a slow or busy host would measure no semantic hit). Each GET opens a
    new connection, which SO_REUSEPORT hands to any worker: 8 "ready" answers in a row per worker."""
    deadline = time.monotonic() + timeout
    in_a_row = 0
    while in_a_row < 8 * workers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the web workers' embedding model not loaded after {timeout:.0f}s")
        try:
            loaded = httpx.get(url, timeout=5.0).json().get("semantic_cache") == "ready"
        except (httpx.HTTPError, ValueError):
            loaded = False
        in_a_row = in_a_row + 1 if loaded else 0
        if not loaded:
            time.sleep(0.1)


def wait_quiet(processes: list[psutil.Process], timeout: float = 60.0) -> None:
    """Wait until freshly started processes stop working on their own (each web worker loads the
    cache's embedding model in the background at start), so that work is not measured."""
    deadline = time.monotonic() + timeout
    for p in processes:
        p.cpu_percent()  # the first call only starts the measurement
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if all(p.cpu_percent() < 10 for p in processes if p.is_running()):
            return


def start_django(data_dir: Path | None = None, *, migrate: bool = True) -> None:
    """Django in this process, on storage that is the embedded servers' (under data_dir, by default
    .data/bench) unless DATABASE_URL / REDIS_URL are set; migrated unless told not to."""
    if data_dir is not None:
        os.environ["SENTINEL_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("SENTINEL_DATA_DIR", str(DEFAULT_DATA_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sentinel.settings")
    import django

    from sentinel.embedded import ensure_environment

    ensure_environment()  # starts (or reuses) the embedded servers when the URLs are unset

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


def setup_django(data_dir: Path) -> dict[str, bool]:
    """Settings, storage (embedded unless the URLs are set) and migrations, in this process; the
    embedded servers live as long as it does and are shared by every scenario of one run.

    Returns which storage servers are the embedded ones."""
    global _storage
    if _storage is not None:
        return _storage
    embedded = {"postgres": not os.environ.get("DATABASE_URL"), "valkey": not os.environ.get("REDIS_URL")}
    os.environ["DJANGO_SETTINGS_MODULE"] = "sentinel.settings"
    os.environ.setdefault("SENTINEL_LOG_LEVEL", "WARNING")
    start_django(data_dir)
    from gateway.cache.engine import shared_embedder

    shared_embedder()  # as `make run` does: the embedding model is exported once, before web workers load it
    _storage = embedded
    return embedded


_storage: dict[str, bool] | None = None


# Every check of the request path is on, with limits far above what a run can reach: each request
# goes through admission (rate logs, concurrency, budget reservation and settlement) for real.
GENEROUS_LIMITS = {"requests_per_minute": 10_000_000, "tokens_per_minute": 1_000_000_000, "max_concurrent": 100_000}
GENEROUS_BUDGET_USD = 1_000_000
SENTINEL_CONDITIONS = (
    "authentication (virtual key), admission (requests/min, tokens/min and concurrency limits on key, tenant and "
    "model; hard budgets on tenant (monthly) and key (daily), reserved and settled), ledger (Redis stream, drained "
    "by a Celery worker) on; every prompt unique"
)
# How requests meet the cache. Measuring the gateway's own cost, the cache is bypassed per request
# (the relay-mix scenario measures the cache); "miss" sends unique prompts through the lookup
# (exact tier, embedding, vector search) and the store after the response.
CACHE_MODES = {
    "bypass": ({"x-sentinel-cache-control": "no-cache, no-store"}, "cache bypassed per request (no-cache, no-store)"),
    "miss": ({}, "cache on: every request a miss (exact and semantic lookup, then stored)"),
}


def prepare_bench_tenant(mock_url: str) -> str:
    """The bench tenant with limits and budgets, its model pointing at the mock's `bench` provider, and
    a fresh key (earlier bench keys are revoked: only digests are stored, so they cannot be reused)."""
    from django.db import transaction

    from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
    from tenants.models import Budget, Tenant, VirtualKey
    from tenants.services import key_create, key_revoke

    with transaction.atomic():
        provider, _ = Provider.objects.update_or_create(
            name="bench-mock",
            defaults={"kind": "openai", "api_base": f"{mock_url}/p/{PROVIDER}/v1", "transport": "auto"},
        )
        provider.set_api_key("sk-mock-bench")
        provider.save()
        deployment, _ = Deployment.objects.update_or_create(
            name="bench-mock", defaults={"provider": provider, "litellm_model": LITELLM_MODEL, "enabled": True}
        )
        alias, _ = ModelAlias.objects.update_or_create(
            name=MODEL_ALIAS, defaults={"description": "The benchmarks' model (python -m bench)", **GENEROUS_LIMITS}
        )
        ChainEntry.objects.get_or_create(alias=alias, deployment=deployment, defaults={"position": 0})
        # Shadow verification (1% of semantic hits asked of the provider again, in the background) is
        # off: a run's provider calls are then exactly its misses, which relay_mix checks; its cost
        # is measured by its own tests (tests/gateway/test_cache_shadow.py).
        tenant, _ = Tenant.objects.update_or_create(
            slug=TENANT_SLUG,
            defaults={"name": "Benchmarks", "status": "active", "shadow_share": 0, **GENEROUS_LIMITS},
        )
        Budget.objects.update_or_create(
            tenant=tenant, key=None, period=Budget.Period.MONTHLY, defaults={"limit_usd": GENEROUS_BUDGET_USD}
        )
        for old in VirtualKey.objects.filter(tenant=tenant, name=KEY_NAME, status="active"):
            key_revoke(key=old)
        key, secret = key_create(tenant=tenant, name=KEY_NAME, **GENEROUS_LIMITS)
        Budget.objects.create(tenant=tenant, key=key, period=Budget.Period.DAILY, limit_usd=GENEROUS_BUDGET_USD)
    return secret


@dataclass
class Stack:
    log_dir: Path
    data_dir: Path
    workers: int
    mock_url: str = ""
    gateway_url: str = ""
    peer_url: str = ""
    peer_missing: str = ""  # why the peer is not part of this run, when it is not
    portkey_url: str = ""  # the second peer (bench/portkey.py), when asked for
    portkey_missing: str = ""
    key: str = ""
    cache: str = "bypass"  # a CACHE_MODES name
    embedded: dict[str, bool] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)

    # --- targets ------------------------------------------------------------------------------

    @property
    def direct_url(self) -> str:
        return f"{self.mock_url}/p/{PROVIDER}/v1/chat/completions"

    @property
    def sentinel_url(self) -> str:
        return f"{self.gateway_url}/v1/chat/completions"

    @property
    def litellm_url(self) -> str:
        return f"{self.peer_url}/v1/chat/completions"

    @property
    def sentinel_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}", **CACHE_MODES[self.cache][0]}

    @property
    def conditions(self) -> str:
        """What Sentinel had on in this run, for the results."""
        ledger = "drained by a Celery worker" if self.child("worker") else "not drained in this run"
        return SENTINEL_CONDITIONS.replace("drained by a Celery worker", ledger) + "; " + CACHE_MODES[self.cache][1]

    def mock_profile(self, name: str) -> None:
        """Switch the mock's `bench` provider to a standard profile (bench/README.md)."""
        response = httpx.post(
            f"{self.mock_url}/_control/{PROVIDER}", json={**PROFILES[name], "reset_counters": True}, timeout=5
        )
        response.raise_for_status()

    def mock_stats(self) -> dict:
        return httpx.get(f"{self.mock_url}/_control/{PROVIDER}", timeout=5).json()

    # --- processes ----------------------------------------------------------------------------

    def child(self, name: str) -> Child | None:
        return next((c for c in self.children if c.name == name), None)

    def web_workers(self) -> list[psutil.Process]:
        """The uvicorn processes that serve requests (a root itself when it runs one worker)."""
        workers = []
        for c in self.children:
            if c.name.startswith("web") and c.process is not None:
                root = psutil.Process(c.process.pid)
                workers.extend(root.children() or [root])  # sentinel.web forks its workers
        return workers

    @staticmethod
    def cpu_of(processes: list[psutil.Process]) -> list[float]:
        """CPU time (user + system) each process has used so far."""
        found = []
        for p in processes:
            try:
                times = p.cpu_times()
                found.append(times.user + times.system)
            except psutil.Error:
                found.append(0.0)
        return found

    def cpu_seconds(self, name: str) -> float:
        """CPU time (user + system) the process trees of the children called `name` (or `name-<n>`)
        have used so far. Per request, it tells a process's own cost even when other work on the
        machine slows every clock down."""
        pids = [
            c.process.pid
            for c in self.children
            if (c.name == name or c.name.startswith(name + "-")) and c.process is not None and c.process.poll() is None
        ]
        return self._trees_cpu(pids)

    def storage_cpu_seconds(self) -> float | None:
        """CPU time the embedded PostgreSQL (every backend) and Valkey have used so far, or None when
        this run uses external servers (their CPU is not this host's to read)."""
        pids = self.storage_pids()
        return self._trees_cpu(list(pids.values())) if set(pids) == {"postgres", "valkey"} else None

    def _trees_cpu(self, pids: list[int]) -> float:
        """CPU time of the processes `pids` and all their descendants."""
        trees = []
        for pid in pids:
            root = psutil.Process(pid)
            trees.extend([root, *root.children(recursive=True)])
        return sum(self.cpu_of(trees))

    def processes(self) -> dict[int, tuple[str, psutil.Process]]:
        """Every process of the run by pid, with a readable name: each child's tree (descendants
        named `<child>:<pid>`), and the embedded storage servers when this run uses them."""
        found: dict[int, tuple[str, psutil.Process]] = {}

        def add(name: str, root: psutil.Process, children: list[psutil.Process]) -> None:
            found[root.pid] = (name, root)
            for p in children:
                found[p.pid] = (f"{name}:{p.pid}", p)

        for c in self.children:
            if c.process is None or c.process.poll() is not None:
                continue
            root = psutil.Process(c.process.pid)
            add(c.name, root, root.children(recursive=True))
        for name, pid in self.storage_pids().items():
            server = psutil.Process(pid)
            # Postgres's children are its backends (one per pooled connection) and helpers.
            add(name, server, server.children() if name == "postgres" else [])
        return found

    def storage_pids(self) -> dict[str, int]:
        """The embedded Valkey and PostgreSQL (postmaster) this run uses, if it uses them."""
        import json

        pids = {}
        pid_file = self.data_dir / "pg" / "postmaster.pid"
        if self.embedded.get("postgres") and pid_file.exists():
            pids["postgres"] = int(pid_file.read_text().split("\n", 1)[0])
        state = self.data_dir / "valkey" / "server.json"
        if self.embedded.get("valkey") and state.exists():
            pids["valkey"] = int(json.loads(state.read_text())["pid"])
        return {name: pid for name, pid in pids.items() if psutil.pid_exists(pid)}


def _python_child(name: str, *args: str) -> Child:
    return Child(name, [sys.executable, *args])


@contextmanager
def running_stack(
    *,
    out_dir: Path,
    workers: int,
    ledger_worker: bool = True,
    peer: bool = False,
    mock_profile: str = "zero",
    data_dir: Path = DEFAULT_DATA_DIR,
    cache: str = "bypass",
    portkey: bool = False,
):
    """Start everything, yield the Stack, and stop every process started here, whatever happens."""
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    embedded = setup_django(data_dir)
    stack = Stack(log_dir=log_dir, data_dir=data_dir, workers=workers, embedded=embedded, cache=cache)
    mock_port, web_port = free_ports(2)
    stack.mock_url = f"http://127.0.0.1:{mock_port}"
    stack.gateway_url = f"http://127.0.0.1:{web_port}"
    stack.key = prepare_bench_tenant(stack.mock_url)
    env = dict(os.environ)

    stack.children.append(
        _python_child("mock", "-m", "gateway.mock_provider", "--port", str(mock_port), "--profile", mock_profile)
    )
    # As `make run` serves: one uvicorn process per worker, each on its own SO_REUSEPORT socket.
    stack.children.append(
        _python_child(
            "web", "-m", "sentinel.web", "--host", "127.0.0.1", "--port", str(web_port), "--workers", str(workers)
        )
    )
    if ledger_worker:
        stack.children.append(_python_child("worker", *celery_worker("WARNING", concurrency=1)))
        stack.children.append(_python_child("beat", *celery_beat("WARNING", pidfile=data_dir / "beat-bench.pid")))
    previous_term = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for c in stack.children:
            (log_dir / f"{c.name}.log").unlink(missing_ok=True)
            c.start(log_dir, env)
        if peer:
            from bench import peer as peer_module

            try:
                peer_child, stack.peer_url = peer_module.start(stack.mock_url, log_dir)
                stack.children.append(peer_child)
            except peer_module.PeerUnavailable as exc:
                stack.peer_missing = str(exc)
        if portkey:
            from bench import portkey as portkey_module

            try:
                portkey_child, stack.portkey_url = portkey_module.start(data_dir, log_dir)
                stack.children.append(portkey_child)
            except portkey_module.PeerUnavailable as exc:
                stack.portkey_missing = str(exc)
        wait_ready(f"{stack.mock_url}/health", stack.children, 30)
        stack.mock_profile(mock_profile)
        wait_ready(f"{stack.gateway_url}/health/ready", stack.children, 120)
        wait_embedder(f"{stack.gateway_url}/health/ready", workers)
        wait_quiet(stack.web_workers())
        if stack.peer_url:
            try:
                wait_ready(f"{stack.peer_url}/health/liveliness", stack.children, 120)
            except (RuntimeError, TimeoutError) as exc:
                stack.peer_missing = f"the LiteLLM proxy did not start ({exc}; see {log_dir / 'litellm.log'})"
                stack.peer_url = ""
                stop_all([stack.child("litellm")])
        if stack.portkey_url:
            try:
                wait_ready(stack.portkey_url, stack.children, 60)
            except (RuntimeError, TimeoutError) as exc:
                stack.portkey_missing = f"Portkey did not start ({exc}; see {log_dir / 'portkey.log'})"
                stack.portkey_url = ""
                stop_all([stack.child("portkey")])
        yield stack
    finally:
        stop_all(stack.children)
        signal.signal(signal.SIGTERM, previous_term)
        from django.db import connections

        connections.close_all()


def _interrupt(signum, frame) -> None:
    """SIGTERM ends a run like Ctrl-C does: every `finally` runs and every process is stopped."""
    raise KeyboardInterrupt
