"""Self-hosted deployments' load (gateway.upstream.load): the mock provider's vLLM-style /metrics is
sampled over real HTTP through the egress guard, saturation and recovery (with hysteresis) steer
requests through the gateway, and a tenant either rejects fast or queues with a deadline."""

from __future__ import annotations

import threading
import time

import httpx
import orjson
import pytest
from django.core.exceptions import ValidationError

from gateway.models import Deployment
from gateway.tasks import sample_deployment_load
from gateway.upstream.load import (
    Load,
    Thresholds,
    describe_load,
    judge,
    load_snapshot,
    parse_ollama,
    parse_queue_depth,
    parse_vllm,
    sample_deployments,
)
from sentinel import redis_keys
from sentinel.localstate import announce_change
from sentinel.redis_clients import sync_redis
from tests.conftest import wait_for
from tests.servers import scrape_metrics


@pytest.fixture
def self_hosted(make_model, mock_provider):
    """A chain of a self-hosted deployment (vLLM's: saturated at 4 waiting or 90% KV cache, back below
    half of that; or the load source and thresholds given) and a cloud fallback; `length=1` leaves the
    fallback out."""

    def make(length: int = 2, queue_limit: int = 100, path: str = "metrics", **source):
        model, providers = make_model(chain_length=length)
        thresholds = source or {"saturated_waiting": 4, "saturated_kv_cache_percent": 90}
        Deployment.objects.filter(name=providers[0]).update(
            self_hosted=True,
            load_metrics_url=f"{mock_provider.url}/p/{providers[0]}/{path}",
            recover_percent=50,
            saturation_queue_limit=queue_limit,
            **thresholds,
        )
        announce_change()
        return model, providers

    return make


def post(gateway, key: str, model: str, prompt: str = "hi") -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"},
        json={"model": model, "messages": [{"role": "user", "content": prompt}]},
        timeout=30,
    )


def set_load(mock_provider, provider: str, **load) -> None:
    """Set the server's load, then run ticks of the sampler (beat's task, called in this process)
    until one has read this server. A tick that could not read it (the scrape's 1 s timeout, with the
    mock provider held up by a busy machine) leaves the last sample standing, as it should in
    production; here the next tick is what beat would do a few seconds later."""
    mock_provider.control(provider, **load)
    asked = time.time()
    snapshot = sample_read(Deployment.objects.get(name=provider).pk)
    assert snapshot["error"] == "" and float(snapshot["sampled_at"]) >= asked, snapshot


def sample_read(pk: int) -> dict:
    """Ticks of the sampler until one reached the deployment's server (an answer, read or not), and
    what it stored."""

    def tick() -> dict | None:
        sample_deployment_load()
        snapshot = load_snapshot(pk)
        return None if snapshot.get("error", "").startswith("unreadable: TimeoutError") else snapshot

    return wait_for(tick, what="the deployment's server to answer the sampler")


def test_vllm_metrics_are_read_and_judged_with_hysteresis():
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 7.0\n'
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.5\n'
    )
    assert parse_vllm(text) == Load(running=5.0, waiting=7.0, kv_cache_percent=50.0)
    limits = Thresholds(running=None, waiting=4, kv_cache_percent=90.0, recover_percent=50)
    assert judge(Load(0, 4, 0), limits, was_saturated=False) is True
    assert judge(Load(0, 3, 89), limits, was_saturated=False) is False
    assert judge(Load(0, 3, 0), limits, was_saturated=True) is True  # not below half of 4 yet
    assert judge(Load(0, 1, 44), limits, was_saturated=True) is False
    assert judge(Load(0, 1, 45), limits, was_saturated=True) is True


def test_ollama_and_generic_queue_depth_documents_are_read():
    size = 1000
    ps = {"models": [{"name": "a", "size": size, "size_vram": size}, {"name": "b", "size": size, "size_vram": 500}]}
    assert parse_ollama(orjson.dumps(ps)) == Load(running=2.0, waiting=0.0, kv_cache_percent=25.0)
    assert parse_ollama(b'{"models": []}') == Load(0.0, 0.0, 0.0)
    depth = b'{"queue_depth": 12, "running": 4, "engine": {"queue": {"depth": 3}}}'
    assert parse_queue_depth(depth, running_field="running", waiting_field="queue_depth") == Load(4.0, 12.0, 0.0)
    assert parse_queue_depth(depth, running_field="", waiting_field="engine.queue.depth") == Load(0.0, 3.0, 0.0)
    for bad, message in (
        (b"vllm:num_requests_running 1", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"running": "4"}', "running is not a number"),
        (b'{"running": 4}', "no field queue_depth"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_queue_depth(bad, running_field="running", waiting_field="queue_depth")
    with pytest.raises(ValueError, match="no list of models"):
        parse_ollama(b'{"models": {"a": 1}}')


# source: (the deployment's load source and thresholds, [(the mock's load, served by the GPU?, the admin's
# load column)]). Ollama: saturated at 3 models loaded or half their memory outside VRAM; generic: at
# 4 queued; both back below half of that.
SOURCES = {
    "ollama": (
        {"path": "api/ps", "load_source": "ollama", "saturated_running": 3, "saturated_kv_cache_percent": 50},
        [
            ({"load_models": 1}, True, "ok: 1 models loaded, 0% of their memory outside VRAM"),
            ({"load_models": 3}, False, "saturated: 3 models loaded, 0% of their memory outside VRAM"),
            ({"load_models": 2}, False, "saturated: 2 models loaded, 0% of their memory outside VRAM"),
            ({"load_models": 1}, True, "ok: 1 models loaded, 0% of their memory outside VRAM"),
            ({"load_offloaded": 0.6}, False, "saturated: 1 models loaded, 60% of their memory outside VRAM"),
            ({"load_offloaded": 0.1}, True, "ok: 1 models loaded, 10% of their memory outside VRAM"),
        ],
    ),
    "generic": (
        {
            "path": "load",
            "load_source": "json",
            "load_running_field": "running",
            "load_waiting_field": "queue.depth",
            "saturated_waiting": 4,
        },
        [
            ({"load_waiting": 1}, True, "ok: 0 running, 1 waiting"),
            ({"load_waiting": 9}, False, "saturated: 0 running, 9 waiting"),
            ({"load_waiting": 3}, False, "saturated: 0 running, 3 waiting"),
            ({"load_waiting": 1}, True, "ok: 0 running, 1 waiting"),
        ],
    ),
}


@pytest.mark.parametrize("source", list(SOURCES))
def test_ollama_and_generic_sources_saturate_and_recover(gateway, api_key, self_hosted, mock_provider, source):
    settings, steps = SOURCES[source]
    model, (gpu, cloud) = self_hosted(**settings)
    deployment = Deployment.objects.get(name=gpu)
    for load, on_gpu, described in steps:
        set_load(mock_provider, gpu, **load)
        assert describe_load(deployment) == described
        response = post(gateway, api_key, model)
        assert response.headers["x-sentinel-provider"] == (gpu if on_gpu else cloud), load
        assert response.headers.get("x-sentinel-fallback-reasons") == (None if on_gpu else f"{gpu}=saturated")
    served_by_gpu = sum(on_gpu for _, on_gpu, _ in steps)
    assert (mock_provider.stats(gpu)["calls"], mock_provider.stats(cloud)["calls"]) == (
        served_by_gpu,
        len(steps) - served_by_gpu,
    )
    # Pointed at a document of another kind: why it could not be read, and the last verdict stands.
    Deployment.objects.filter(pk=deployment.pk).update(load_metrics_url=f"{mock_provider.url}/p/{gpu}/metrics")
    snapshot = sample_read(deployment.pk)
    assert snapshot["error"].startswith(f"not {deployment.get_load_source_display()}: not JSON")
    assert snapshot["saturated"] == "0"


def test_saturation_sends_requests_to_the_fallback_and_recovery_brings_them_back(
    gateway, api_key, self_hosted, mock_provider
):
    model, (gpu, cloud) = self_hosted()
    pk = Deployment.objects.get(name=gpu).pk
    set_load(mock_provider, gpu, load_waiting=1)
    assert post(gateway, api_key, model).headers["x-sentinel-provider"] == gpu

    set_load(mock_provider, gpu, load_waiting=9)
    response = post(gateway, api_key, model)
    assert (response.headers["x-sentinel-provider"], response.headers["x-sentinel-fallbacks"]) == (cloud, "1")
    assert response.headers["x-sentinel-fallback-reasons"] == f"{gpu}=saturated"
    scrape = scrape_metrics(gateway.url)
    assert scrape.value("sentinel_deployment_saturated", deployment=gpu) == 1
    assert scrape.value("sentinel_deployment_load", deployment=gpu, signal="waiting") == 9

    set_load(mock_provider, gpu, load_waiting=3)  # below the threshold, not below half of it: still saturated
    assert post(gateway, api_key, model).headers["x-sentinel-provider"] == cloud
    set_load(mock_provider, gpu, load_waiting=0, load_kv_cache=0.95)  # the KV cache alone saturates it
    assert post(gateway, api_key, model).headers["x-sentinel-provider"] == cloud
    set_load(mock_provider, gpu, load_waiting=1, load_kv_cache=0.2)
    response = post(gateway, api_key, model)
    assert (response.headers["x-sentinel-provider"], response.headers["x-sentinel-fallbacks"]) == (gpu, "0")
    assert "x-sentinel-fallback-reasons" not in response.headers
    assert mock_provider.stats(gpu)["calls"] == 2
    assert mock_provider.stats(cloud)["calls"] == 3
    assert load_snapshot(pk)["saturated"] == "0"
    assert scrape_metrics(gateway.url).value("sentinel_deployment_saturated", deployment=gpu) == 0


def test_reject_fast_without_a_fallback_is_an_immediate_503(gateway, api_key, self_hosted, mock_provider):
    model, (gpu,) = self_hosted(length=1)
    set_load(mock_provider, gpu, load_waiting=10)
    response = post(gateway, api_key, model)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "all_providers_unavailable"
    assert "saturated" in response.json()["error"]["message"]
    assert "x-sentinel-queued-ms" not in response.headers
    assert mock_provider.stats(gpu)["calls"] == 0


def test_a_queueing_tenant_waits_for_recovery(gateway, tenant, make_key, self_hosted, mock_provider):
    tenant.on_saturation, tenant.saturation_wait_ms = "queue", 20_000
    tenant.save()
    key = make_key(tenant)
    model, (gpu, cloud) = self_hosted()
    set_load(mock_provider, gpu, load_waiting=10)
    pk = Deployment.objects.get(name=gpu).pk
    result = {}
    waiter = threading.Thread(target=lambda: result.update(response=post(gateway, key, model)))
    waiter.start()
    # The request waits in the deployment's queue until the sampler sees the server recover.
    wait_for(lambda: sync_redis().zcard(redis_keys.saturation_queue(pk)) == 1, what="the request to queue")
    set_load(mock_provider, gpu, load_waiting=0)
    waiter.join(30)
    response = result["response"]
    assert (response.headers["x-sentinel-provider"], response.headers["x-sentinel-fallbacks"]) == (gpu, "0")
    assert int(response.headers["x-sentinel-queued-ms"]) > 0
    assert mock_provider.stats(cloud)["calls"] == 0
    assert sync_redis().zcard(redis_keys.saturation_queue(pk)) == 0


@pytest.mark.parametrize("queue_limit", [0, 100], ids=["queue-full", "deadline-passed"])
def test_a_queueing_tenant_goes_on_when_the_queue_is_full_or_its_deadline_passes(
    gateway, tenant, make_key, self_hosted, mock_provider, queue_limit
):
    tenant.on_saturation, tenant.saturation_wait_ms = "queue", 150
    tenant.save()
    key = make_key(tenant)
    model, (gpu, cloud) = self_hosted(queue_limit=queue_limit)
    set_load(mock_provider, gpu, load_kv_cache=0.99)
    response = post(gateway, key, model)
    assert (response.headers["x-sentinel-provider"], response.headers["x-sentinel-fallbacks"]) == (cloud, "1")
    assert response.headers["x-sentinel-fallback-reasons"] == f"{gpu}=saturated"
    assert mock_provider.stats(gpu)["calls"] == 0
    assert sync_redis().zcard(redis_keys.saturation_queue(Deployment.objects.get(name=gpu).pk)) == 0


def test_metrics_urls_go_through_the_egress_guard(self_hosted, mock_provider):
    _, (gpu, _) = self_hosted()
    deployment = Deployment.objects.get(name=gpu)
    deployment.load_metrics_url = "http://10.0.0.5:8000/metrics"
    with pytest.raises(ValidationError) as refused:
        deployment.full_clean()
    assert "private address 10.0.0.5" in str(refused.value)
    deployment.load_metrics_url = ""
    with pytest.raises(ValidationError, match="needs the URL of its metrics"):
        deployment.full_clean()
    deployment.load_metrics_url, deployment.load_source = f"{mock_provider.url}/p/{gpu}/load", "json"
    with pytest.raises(ValidationError, match="needs the field of its queue depth"):
        deployment.full_clean()
    # Saved past the form (or a name that resolves elsewhere later): refused when sampled, nothing judged.
    port = mock_provider.url.rsplit(":", 1)[1]
    Deployment.objects.filter(pk=deployment.pk).update(load_metrics_url=f"http://localhost:{port}/p/{gpu}/metrics")
    mock_provider.control(gpu, load_waiting=50)
    sample_deployments()
    snapshot = load_snapshot(deployment.pk)
    assert snapshot["error"].startswith("refused by the egress guard")
    assert "saturated" not in snapshot
    assert mock_provider.stats(gpu)["calls"] == 0
