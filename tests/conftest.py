"""Shared fixtures. End-to-end tests run against real processes: the mock provider and a uvicorn
gateway on the session's test database, with data committed (not rolled back) so those processes
see it; tests stay apart by creating their own tenants, keys and models with unique names."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from hypothesis.configuration import set_hypothesis_home_dir
from openai import OpenAI

from tests.servers import (
    GatewayServer,
    Listener,
    MockProviderServer,
    start_gateway,
    start_mock_provider,
    wait_semantic_ready,
)

# Tests write nothing into the tree: hypothesis keeps its example database and caches under the
# temporary directory instead of .hypothesis/ at the root.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "sentinel-hypothesis")

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
ARTIFACTS.mkdir(exist_ok=True)
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


# Fixtures that start or reach a server (PostgreSQL, Valkey, a gateway or mock provider process, a
# browser): a test that uses one, directly or through another fixture, is marked `servers`, and
# `make test-fast` (`-m "not servers"`) leaves it out. Tests that reach a server without a fixture
# carry `pytest.mark.servers` themselves.
# A breaker that opens within a test's few calls (a test adds minimum_calls and half_open_probes).
TEST_BREAKER = {
    "window_seconds": 30,
    "failure_rate_percent": 50,
    "slow_call_seconds": 5,
    "slow_rate_percent": 50,
    "open_seconds": 30,
    "max_open_seconds": 60,
}
SERVER_FIXTURES = {"django_db_setup", "mock_provider", "gateway", "browser", "valkey_cluster"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.servers)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "a condition") -> Any:
    """Poll `condition` until it returns something true, and return that; after `timeout` seconds an
    AssertionError naming `what`. The timeout bounds the wait: it is no claim about speed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def embedded_test_valkey() -> dict | None:
    """The pid and port of the test session's own embedded Valkey, None when REDIS_URL points
    elsewhere."""
    import json

    from django.conf import settings

    state = settings.DATA_DIR / "valkey" / "server.json"
    if not state.exists():
        return None
    found = json.loads(state.read_text())
    return found if f"redis://127.0.0.1:{found['port']}/0" == settings.REDIS_URL else None


def flush_embedded_test_redis() -> None:
    """A fresh test database needs a fresh Redis (queued ledger records, markers and caches name
    rows of the old one). Only ever the test session's own embedded Valkey is flushed."""
    from sentinel.redis_clients import sync_redis

    if embedded_test_valkey():
        sync_redis().flushdb()


def relax_embedded_test_durability() -> None:
    """The test session's own embedded servers write without fsync: their data is thrown away, and
    what the tests kill is processes, whose writes the kernel keeps, never the machine. With fsync,
    two test workers' PostgreSQL and Valkey shared a busy disk, and Valkey's "AOF fsync is taking
    too long" held a write's reply past the 2 s socket timeout (a ledger drain failed on it). The
    product's embedded default keeps `appendfsync everysec` and PostgreSQL's fsync."""
    import psycopg
    from django.conf import settings

    from sentinel.redis_clients import sync_redis

    if embedded_test_valkey():
        sync_redis().config_set("appendfsync", "no")
    if f"host={settings.DATA_DIR / 'pg'}" in settings.DATABASE_URL:
        with psycopg.connect(settings.DATABASE_URL, autocommit=True) as conn:
            conn.execute("alter system set fsync = off")
            conn.execute("select pg_reload_conf()")


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment, django_db_blocker, django_db_keepdb, django_db_createdb):
    """Always set up the default test database. pytest-django only does so for tests that use its
    `db` fixtures, and the end-to-end tests reach the database through other processes instead."""
    from django.test.utils import setup_databases, teardown_databases

    keepdb = django_db_keepdb and not django_db_createdb
    relax_embedded_test_durability()
    if not keepdb:
        flush_embedded_test_redis()
    with django_db_blocker.unblock():
        config = setup_databases(verbosity=0, interactive=False, aliases={"default"}, keepdb=keepdb)
    yield
    if not keepdb:
        with django_db_blocker.unblock():
            # A connection another thread of this process still holds would make dropping the
            # database fail ("being accessed by other users": tests/billing/test_admin.py alone did).
            with connection.cursor() as cursor:
                cursor.execute(
                    "select pg_terminate_backend(pid) from pg_stat_activity "
                    "where datname = current_database() and pid <> pg_backend_pid()"
                )
            connection.close()
            teardown_databases(config, verbosity=0)


@pytest.fixture(scope="session")
def mock_provider() -> MockProviderServer:
    server = start_mock_provider()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def test_database_name(django_db_setup, django_db_blocker) -> str:
    with django_db_blocker.unblock():
        return connection.settings_dict["NAME"]


@pytest.fixture(scope="session")
def embedding_model() -> None:
    """Export the embedding model and the verifier's cross-encoder once (first run only) before
    gateway processes load them (shared_embedder warms the verifier up, which scores a pair)."""
    from gateway.cache.engine import shared_embedder

    shared_embedder()


@pytest.fixture(scope="session")
def gateway(test_database_name, mock_provider, embedding_model) -> GatewayServer:
    server = start_gateway(test_database_name)
    wait_semantic_ready(server)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh_database_state():
    """What one test leaves of this process's database state is never the next test's problem. A
    test stopped mid-query (pytest-timeout's signal) leaves Django's connection with a command in
    progress, and every later query of the session fails with "another command is already in
    progress"; a test that made localstate think the database is away would make the next ones
    read nothing for 2 s. Both are reset here, and a broken connection is reported on stderr."""
    yield
    import sys

    from psycopg.pq import TransactionStatus

    from sentinel import localstate

    raw = connection.connection
    if raw is not None and raw.info.transaction_status in (TransactionStatus.ACTIVE, TransactionStatus.UNKNOWN):
        print(f"closing this process's database connection: left {raw.info.transaction_status.name}", file=sys.stderr)
        with suppress(Exception):
            connection.close()
    localstate._suspect = localstate._probing = False


@pytest.fixture
def live_db(django_db_setup, django_db_blocker):
    """Database access whose writes are committed, so gateway processes see them."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def make_tenant(live_db) -> Callable:
    from tenants.models import Tenant

    def make(**fields) -> Tenant:
        slug = unique("t")
        # Shadow verification asks a random 1% of semantic hits of the provider too (its own tests
        # set a share): off here, so a test that counts provider calls after a hit counts exactly.
        fields.setdefault("shadow_share", 0)
        return Tenant.objects.create(name=fields.pop("name", slug), slug=slug, **fields)

    return make


@pytest.fixture
def tenant(make_tenant):
    return make_tenant()


@dataclass
class Tenancy:
    """Two tenants and the people around them: the shared fixture for isolation tests."""

    tenant: object  # the tenant under test ("A")
    other: object  # another tenant ("B")
    owner: object  # admin of A
    finance: object  # finance member of A
    viewer: object  # viewer of A
    outsider: object  # admin of B, nothing in A
    superuser: object
    password: str = "correct horse battery staple"


@pytest.fixture
def tenancy(make_tenant) -> Tenancy:
    from django.contrib.auth import get_user_model

    from tenants.services import membership_save

    User = get_user_model()
    a, b = make_tenant(name="Tenant A"), make_tenant(name="Tenant B")
    password = Tenancy.password

    def person(role, tenant, **flags):
        user = User.objects.create_user(unique(role), password=password, is_staff=True, **flags)
        if tenant is not None:
            membership_save(tenant=tenant, user=user, role=role)  # as the console does: role groups too
        return user

    return Tenancy(
        tenant=a,
        other=b,
        owner=person("admin", a),
        finance=person("finance", a),
        viewer=person("viewer", a),
        outsider=person("admin", b),
        superuser=person("root", None, is_superuser=True),
    )


@pytest.fixture
def make_key(live_db) -> Callable:
    from tenants.services import key_create

    def make(tenant, **fields) -> str:
        _, secret = key_create(tenant=tenant, name=fields.pop("name", unique("key")), **fields)
        return secret

    return make


@pytest.fixture
def api_key(tenant, make_key) -> str:
    return make_key(tenant)


@pytest.fixture
def internal() -> Iterator[Listener]:
    """A listener on 127.0.0.1, internal to the egress guard: what must never be reached."""
    listener = Listener("127.0.0.1")
    yield listener
    listener.close()


@pytest.fixture
def make_model(live_db, mock_provider) -> Callable:
    """A model alias served by a chain of fresh virtual providers on the mock (isolated faults and
    counters per test). Returns (alias name, [provider names in chain order])."""
    from gateway.models import ChainEntry, Deployment, ModelAlias, Provider

    def make(chain_length: int = 1, litellm_model: str = "openai/gpt-4o-mini", **provider_fields):
        alias = ModelAlias.objects.create(name=unique("model"))
        names = []
        for position in range(chain_length):
            name = unique("prov")
            provider = Provider(name=name, kind="openai", api_base=mock_provider.api_base(name), **provider_fields)
            provider.set_api_key("sk-test-" + name)
            provider.save()
            deployment = Deployment.objects.create(name=name, provider=provider, litellm_model=litellm_model)
            ChainEntry.objects.create(alias=alias, deployment=deployment, position=position)
            names.append(name)
        return alias.name, names

    return make


@pytest.fixture
def model(make_model) -> tuple[str, list[str]]:
    return make_model()


@pytest.fixture
def client(gateway, api_key) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30)


# --- browser tests -------------------------------------------------------------------------------


def require_chromium(path: Path, *, required: bool) -> None:
    """Skip the test when the browser is missing, or fail it where the browser is required (CI)."""
    if path.exists():
        return
    message = f"{path} is not installed (apt-get install chromium): browser tests need Debian's chromium"
    if required:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def browser() -> Callable:
    """Opens pages in Debian's chromium, driven by Playwright, which never downloads a browser here.
    Where /usr/bin/chromium is missing the test skips, unless SENTINEL_REQUIRE_BROWSER=1 (CI installs
    it): then it fails. Use `with browser() as page:` once the test's data is in place, and run
    Django work inside it through `off_the_browser_loop`."""
    require_chromium(CHROMIUM, required=os.environ.get("SENTINEL_REQUIRE_BROWSER") == "1")

    @contextmanager
    def open_page(**context_options) -> Iterator:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                context = chromium.new_context(viewport={"width": 1280, "height": 900}, **context_options)
                page = context.new_page()
                page.set_default_timeout(20_000)
                yield page
            finally:
                chromium.close()

    return open_page


def off_the_browser_loop(function: Callable, *args, **kwargs):
    """Playwright's sync API keeps an event loop running in the test's thread, where Django refuses
    ORM calls and async_to_sync: such work runs in a thread of its own (its connection closed after)."""
    from django.db import connections

    def run():
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


def screenshot(page, name: str) -> Path:
    """A screenshot kept with the test artifacts (tests/artifacts/, not committed)."""
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
