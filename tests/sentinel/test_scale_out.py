"""Scale-out on one machine: three gateway processes on one PostgreSQL and one Valkey, behind a
round-robin load balancer (tests/loadbalancer.py), behave as one gateway. A key works wherever it
was created, a revocation reaches every process within a second, each request is billed once, a rate
limit counts the requests of all of them together, a breaker one of them opened is open on all, and
each process's metrics count what it served.

Every shared property gets its own test function on the `fleet` fixture: a client through the
balancer (`through_balancer`) or each gateway alone (`fleet.gateways`)."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from openai import OpenAI

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.mock_provider import answer_text
from tests.loadbalancer import RoundRobinProxy
from tests.servers import GatewayServer, scrape_metrics, start_gateway, wait_semantic_ready

GATEWAYS = 3


@dataclass
class Fleet:
    gateways: list[GatewayServer]
    balancer: RoundRobinProxy


@pytest.fixture(scope="module")
def fleet(test_database_name, mock_provider) -> Fleet:
    with ThreadPoolExecutor(GATEWAYS) as pool:
        gateways = list(pool.map(lambda _: start_gateway(test_database_name), range(GATEWAYS)))
    balancer = RoundRobinProxy([g.url for g in gateways]).start()
    yield Fleet(gateways, balancer)
    balancer.stop()
    for gateway in gateways:
        gateway.stop()


def through_balancer(fleet: Fleet, key: str) -> OpenAI:
    """An SDK client that opens a new connection per request, so the balancer spreads requests."""
    http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=30)
    return OpenAI(base_url=f"{fleet.balancer.url}/v1", api_key=key, max_retries=0, http_client=http)


def ask(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def post(url: str, key: str, alias: str, prompt: str = "hi", **headers: str) -> httpx.Response:
    """Unless a test says otherwise, the cache stays out of the way (tests of it pass their own)."""
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store", **headers},
        json={"model": alias, "messages": ask(prompt)},
        timeout=30,
    )


def test_a_key_created_once_works_on_every_gateway(fleet, tenant, make_key, model):
    alias, _ = model
    key = make_key(tenant)
    before = list(fleet.balancer.connections)
    client = through_balancer(fleet, key)
    for i in range(2 * GATEWAYS):
        answer = client.chat.completions.create(model=alias, messages=ask(f"spread {i}"))
        assert answer.choices[0].message.content == answer_text(f"spread {i}")
    served = [after - was for after, was in zip(fleet.balancer.connections, before, strict=True)]
    assert served == [2] * GATEWAYS


def test_a_revoked_key_is_refused_by_every_gateway_within_a_second(fleet, tenant, live_db, model):
    from tenants.services import key_create, key_revoke

    alias, _ = model
    key, secret = key_create(tenant=tenant, name="revoke everywhere")
    # Each gateway has now cached the key as active in its own memory.
    assert [post(g.url, secret, alias).status_code for g in fleet.gateways] == [200] * GATEWAYS

    key_revoke(key=key)
    revoked_at = time.monotonic()
    refused = set()
    while len(refused) < GATEWAYS and time.monotonic() - revoked_at < 1.0:
        for index, gateway in enumerate(fleet.gateways):
            if index not in refused and post(gateway.url, secret, alias).status_code == 401:
                refused.add(index)
    assert refused == set(range(GATEWAYS)), f"still accepted by {set(range(GATEWAYS)) - refused} after 1 s"
    response = post(fleet.balancer.url, secret, alias)
    assert (response.status_code, response.json()["error"]["code"]) == (401, "invalid_api_key")


def test_every_request_is_billed_once(fleet, tenant, make_key, model, live_db):
    alias, _ = model
    key = make_key(tenant)
    ids = [f"scale-{uuid.uuid4().hex}" for _ in range(4 * GATEWAYS)]
    for index, request_id in enumerate(ids):
        stream = index % 2 == 1
        response = httpx.post(
            f"{fleet.balancer.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {key}", "x-sentinel-request-id": request_id},
            json={"model": alias, "messages": ask(f"bill {index}"), "stream": stream},
            timeout=30,
        )
        assert response.status_code == 200
        assert response.headers["x-sentinel-request-id"] == request_id
    time.sleep(0.3)  # streams are recorded as they end
    drain()
    billed = list(LedgerEntry.objects.filter(tenant=tenant).values_list("request_id", flat=True))
    assert sorted(billed) == sorted(ids)


def test_each_gateway_counts_what_it_served(fleet, tenant, make_key, model):
    alias, (provider,) = model
    key = make_key(tenant)
    client = through_balancer(fleet, key)
    for i in range(3 * GATEWAYS):
        client.chat.completions.create(model=alias, messages=ask(f"count {i}"))
    labels = {"model": alias, "provider": provider, "status": "200", "code": ""}
    counts = [scrape_metrics(g.url).value("sentinel_requests_total", **labels) for g in fleet.gateways]
    assert counts == [3] * GATEWAYS


def test_a_rate_limit_counts_every_gateways_requests_together(fleet, tenant, make_key, model):
    alias, _ = model
    key = make_key(tenant, requests_per_minute=4)
    rejected_before = sum(
        scrape_metrics(g.url).value("sentinel_admission_rejections_total", limit="key-rpm") for g in fleet.gateways
    )
    statuses = [post(fleet.balancer.url, key, alias).status_code for _ in range(2 * GATEWAYS)]
    assert statuses == [200] * 4 + [429] * (2 * GATEWAYS - 4)
    rejected = sum(
        scrape_metrics(g.url).value("sentinel_admission_rejections_total", limit="key-rpm") for g in fleet.gateways
    )
    assert rejected - rejected_before == 2 * GATEWAYS - 4


def test_a_breaker_opened_through_one_gateway_is_open_on_all(fleet, tenant, make_key, make_model, mock_provider):
    from gateway.models import BreakerPolicy, Deployment
    from tests.conftest import TEST_BREAKER, unique

    alias, (primary, secondary) = make_model(chain_length=2)
    policy = BreakerPolicy.objects.create(name=unique("policy"), **TEST_BREAKER, minimum_calls=4, half_open_probes=2)
    Deployment.objects.filter(name__in=(primary, secondary)).update(breaker_policy=policy)
    key = make_key(tenant)
    mock_provider.control(primary, error_rate=1.0, error_status=503)
    first = fleet.gateways[0]
    for _ in range(2):  # a call and its retry fail each time: 4 failures open the breaker
        assert post(first.url, key, alias).headers["x-sentinel-provider"] == secondary

    calls = mock_provider.stats(primary)["calls"]
    for gateway in fleet.gateways:
        assert post(gateway.url, key, alias).headers["x-sentinel-provider"] == secondary
        assert scrape_metrics(gateway.url).value("sentinel_breaker_state", deployment=primary) == 2
    assert mock_provider.stats(primary)["calls"] == calls  # no gateway tried the open deployment

    def opened() -> float:
        labels = {"deployment": primary, "state": "open"}
        return sum(scrape_metrics(g.url).value("sentinel_breaker_transitions_total", **labels) for g in fleet.gateways)

    deadline = time.monotonic() + 5  # the transition is recorded off the request path
    while opened() < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert opened() == 1  # counted once, by the gateway that opened it


def test_an_answer_cached_through_one_gateway_is_served_by_the_others(
    fleet, tenant, make_key, model, mock_provider, live_db
):
    from gateway.models import CacheEntry

    alias, (provider,) = model
    key = make_key(tenant)
    stored = "How do I rotate my API key?"
    first = post(fleet.gateways[0].url, key, alias, stored, **{"x-sentinel-cache-control": ""})
    assert first.headers["x-sentinel-cache"] == "miss"
    deadline = time.monotonic() + 10
    while not CacheEntry.objects.filter(tenant=tenant).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    exact = post(fleet.gateways[1].url, key, alias, stored, **{"x-sentinel-cache-control": ""})
    # Until a process has loaded its embedding model its semantic tier is skipped (the fleet may have
    # started just before this test).
    wait_semantic_ready(fleet.gateways[2])
    paraphrase = post(
        fleet.gateways[2].url, key, alias, "how can i rotate my api key", **{"x-sentinel-cache-control": ""}
    )
    assert exact.headers["x-sentinel-cache"] == "hit-exact"
    assert paraphrase.headers["x-sentinel-cache"] == "hit-semantic"
    assert exact.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
    assert paraphrase.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
    assert mock_provider.stats(provider)["calls"] == 1
