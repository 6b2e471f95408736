"""Gateway metrics: what finish() and the refusal path record, read back from /metrics of real gateway
processes (multiprocess mode, as `make run` serves them), and the recording functions on their own."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.multiprocess import MultiProcessCollector

from billing.ledger import LedgerRecord, drain
from billing.models import LedgerEntry
from gateway import metrics
from tests.servers import scrape_metrics, start_gateway


def ask(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def chat(gateway_url: str, key: str, body: dict) -> httpx.Response:
    return httpx.post(
        f"{gateway_url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body, timeout=30
    )


# --- end to end, one worker ----------------------------------------------------------------------


def test_a_scrape_shows_each_request_by_model_provider_and_outcome(gateway, tenant, api_key, model, live_db):
    alias, (provider,) = model
    for prompt in ("one", "two"):
        assert chat(gateway.url, api_key, {"model": alias, "messages": ask(prompt)}).status_code == 200
    streamed = chat(gateway.url, api_key, {"model": alias, "messages": ask("three"), "stream": True})
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    refused = chat(gateway.url, api_key, {"model": alias, "messages": "not a list"})
    assert refused.status_code == 400
    time.sleep(0.2)  # the stream's record is written as it ends
    drain()

    scrape = scrape_metrics(gateway.url)
    served = {"model": alias, "provider": provider, "cache_tier": "miss"}
    assert scrape.value("sentinel_requests_total", model=alias, provider=provider, status="200", code="") == 3
    assert scrape.value("sentinel_request_duration_seconds_count", **served) == 3
    assert scrape.value("sentinel_gateway_overhead_seconds_count", **served) == 3
    assert scrape.value("sentinel_time_to_first_token_seconds_count", **served) == 1
    assert scrape.value("sentinel_upstream_attempts_total", provider=provider, code="") == 3

    rows = list(LedgerEntry.objects.filter(tenant=tenant, status_code=200))
    assert len(rows) == 3
    money = {"tenant": tenant.slug, "model": alias}
    assert scrape.value("sentinel_tokens_total", **money, type="completion") == 120
    assert scrape.value("sentinel_tokens_total", **money, type="prompt") == sum(r.prompt_tokens for r in rows)
    cost = sum((r.cost_usd for r in rows), Decimal(0))
    assert cost > 0
    assert scrape.value("sentinel_cost_usd_total", **money) == pytest.approx(float(cost), rel=1e-9)
    # No key label unless SENTINEL_METRICS_KEY_LABELS is on.
    assert {frozenset(s) for s in scrape.series("sentinel_cost_usd_total")} == {frozenset({"tenant", "model"})}


def test_a_request_refused_before_routing_gets_no_model_label(gateway, api_key):
    """A client's made-up model name must not become a series of its own."""
    before = scrape_metrics(gateway.url)
    response = chat(gateway.url, api_key, {"model": "made-up-model-name", "messages": ask("x")})
    assert response.status_code == 404
    after = scrape_metrics(gateway.url)
    labels = {"model": "", "provider": "", "status": "404", "code": "model_not_found"}
    assert after.value("sentinel_requests_total", **labels) - before.value("sentinel_requests_total", **labels) == 1
    assert not [s for s in after.series("sentinel_requests_total") if s["model"] == "made-up-model-name"]


def test_unauthenticated_refusals_are_counted(gateway, model):
    labels = {"model": "", "provider": "", "status": "401", "code": "invalid_api_key"}
    before = scrape_metrics(gateway.url).value("sentinel_requests_total", **labels)
    for key in ("sk-sen-wrong", ""):
        response = httpx.post(
            f"{gateway.base_url}/chat/completions",
            headers={"authorization": f"Bearer {key}"} if key else {},
            json={"model": model[0], "messages": ask("x")},
        )
        assert response.status_code == 401
    assert scrape_metrics(gateway.url).value("sentinel_requests_total", **labels) - before == 2


def test_a_failing_provider_shows_in_its_attempts(gateway, api_key, make_model, mock_provider):
    alias, (primary, secondary) = make_model(chain_length=2)
    mock_provider.control(primary, error_rate=1.0, error_status=503)
    response = chat(gateway.url, api_key, {"model": alias, "messages": ask("fail over")})
    assert response.status_code == 200
    assert response.headers["x-sentinel-provider"] == secondary

    scrape = scrape_metrics(gateway.url)
    # The first call and its one retry failed, then the secondary answered.
    assert scrape.value("sentinel_upstream_attempts_total", provider=primary, code="provider_error_503") == 2
    assert scrape.value("sentinel_upstream_attempts_total", provider=primary, code="") == 0
    assert scrape.value("sentinel_upstream_attempts_total", provider=secondary, code="") == 1
    assert scrape.value("sentinel_requests_total", model=alias, provider=secondary, status="200", code="") == 1


def test_overhead_leaves_out_the_time_spent_waiting_on_the_provider(gateway, api_key, model, mock_provider):
    alias, (provider,) = model
    mock_provider.control(provider, slow_ms=300)
    assert chat(gateway.url, api_key, {"model": alias, "messages": ask("slow")}).status_code == 200

    scrape = scrape_metrics(gateway.url)
    labels = {"model": alias, "provider": provider, "cache_tier": "miss"}
    # The answer took over 300 ms; the gateway's own share of it well under 100 ms.
    assert scrape.value("sentinel_request_duration_seconds_bucket", **labels, le="0.25") == 0
    assert scrape.value("sentinel_request_duration_seconds_bucket", **labels, le="0.5") == 1
    assert scrape.value("sentinel_gateway_overhead_seconds_bucket", **labels, le="0.1") == 1


# --- several workers: one scrape adds them up ---------------------------------------------------


def pids_with_requests(metrics_dir: Path, alias: str) -> set[str]:
    """The worker processes whose own metric files hold requests for this model."""
    pids = set()
    for path in metrics_dir.glob("counter_*.db"):
        for family in MultiProcessCollector.merge([str(path)]):
            if any(s.name == "sentinel_requests_total" and s.labels.get("model") == alias for s in family.samples):
                pids.add(path.stem.split("_", 1)[1])
    return pids


@pytest.fixture(scope="module")
def two_workers(test_database_name, mock_provider):
    server = start_gateway(test_database_name, workers=2, env={"SENTINEL_METRICS_KEY_LABELS": "true"})
    yield server
    server.stop()


def test_one_scrape_adds_up_every_worker(two_workers, tenant, make_key, model, live_db):
    from tenants.models import VirtualKey

    alias, _ = model
    key = make_key(tenant)

    async def burst(n: int) -> list[int]:
        # New connections each, in parallel, so both workers accept some.
        async def one(i: int) -> int:
            async with httpx.AsyncClient(timeout=30) as client:
                response = await client.post(
                    f"{two_workers.base_url}/chat/completions",
                    headers={"authorization": f"Bearer {key}"},
                    json={"model": alias, "messages": ask(f"worker {i}")},
                )
                return response.status_code

        return await asyncio.gather(*(one(i) for i in range(n)))

    sent = 0
    for _ in range(10):
        statuses = asyncio.run(burst(16))
        assert statuses == [200] * 16
        sent += 16
        if len(pids_with_requests(two_workers.metrics_dir, alias)) == 2:
            break
    assert len(pids_with_requests(two_workers.metrics_dir, alias)) == 2, "one worker served every request"

    scrape = scrape_metrics(two_workers.url)
    assert (
        sum(
            v
            for (name, labels), v in scrape.samples.items()
            if name == "sentinel_requests_total" and dict(labels).get("model") == alias
        )
        == sent
    )
    key_id = str(VirtualKey.objects.get(tenant=tenant).pk)
    assert scrape.value("sentinel_tokens_total", tenant=tenant.slug, model=alias, key=key_id, type="completion") == (
        40 * sent
    )


# --- the recording functions on their own (this process's registry) ----------------------------


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_breaker_transitions_count_by_state_entered():
    before = sample("sentinel_breaker_transitions_total", deployment="dep-unit", state="open")
    metrics.breaker_transition("dep-unit", "open")
    metrics.breaker_transition("dep-unit", "half_open")
    metrics.breaker_transition("dep-unit", "open")
    assert sample("sentinel_breaker_transitions_total", deployment="dep-unit", state="open") - before == 2


def test_breaker_states_are_read_from_redis_when_scraped(gateway, make_model, live_db):
    """Whoever changed a breaker, every process's scrape shows its state now (not what it last saw)."""
    from gateway.models import Deployment
    from gateway.upstream.breakers import breaker_force

    _, (name,) = make_model()
    deployment = Deployment.objects.get(name=name)
    assert scrape_metrics(gateway.url).samples[("sentinel_breaker_state", frozenset({("deployment", name)}))] == 0
    breaker_force(deployment=deployment, state="open", actor=None, reason="metrics test")
    assert scrape_metrics(gateway.url).value("sentinel_breaker_state", deployment=name) == 2
    breaker_force(deployment=deployment, state="", actor=None, reason="metrics test")
    assert scrape_metrics(gateway.url).value("sentinel_breaker_state", deployment=name) == 0


def test_admission_rejections_by_limit():
    before = sample("sentinel_admission_rejections_total", limit="requests_per_minute")
    metrics.admission_rejected("requests_per_minute")
    metrics.admission_rejected("requests_per_minute")
    assert sample("sentinel_admission_rejections_total", limit="requests_per_minute") - before == 2


def test_a_cache_hit_counts_by_tier_and_saved_cost():
    record = LedgerRecord(
        request_id="r",
        tenant_id=1,
        key_id=1,
        model_requested="unit-model",
        status_code=200,
        cache_tier="hit-semantic",
        saved_cost_usd="0.0000250000",
    )
    before = sample("sentinel_cache_requests_total", tier="hit-semantic")
    metrics.request_finished(record, tenant="unit", elapsed_seconds=0.004, upstream_seconds=0.0)
    assert sample("sentinel_cache_requests_total", tier="hit-semantic") - before == 1
    assert sample("sentinel_saved_cost_usd_total", tenant="unit", model="unit-model") == pytest.approx(0.000025)
    assert sample("sentinel_cost_usd_total", tenant="unit", model="unit-model") == 0
    labels = {"model": "unit-model", "provider": "", "cache_tier": "hit-semantic"}
    assert sample("sentinel_gateway_overhead_seconds_bucket", **labels, le="0.005") == 1
    assert sample("sentinel_gateway_overhead_seconds_bucket", **labels, le="0.003") == 0


def test_exported_names_are_what_a_scrape_shows(gateway):
    shown = {name for name, _ in scrape_metrics(gateway.url).samples if name.startswith("sentinel_")}
    assert shown <= metrics.exported_names()
