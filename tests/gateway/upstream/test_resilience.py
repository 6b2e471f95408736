"""Resilience with the mock provider's fault switches over real HTTP: failover, circuit breakers
shared by every gateway process, retries versus failover, deadlines, manual controls, kill switches."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from channels.layers import get_channel_layer
from openai import OpenAI

from gateway.mock_provider import answer_text
from gateway.models import BreakerPolicy, BreakerTransition, ControlAction, Deployment, ModelAlias
from gateway.services import kill_switch_set
from gateway.upstream.breakers import breaker_force, breaker_snapshot, keys_for
from sentinel.redis_clients import sync_redis
from tests.conftest import unique
from tests.servers import start_gateway


@pytest.fixture
def chain(make_model, live_db):
    """A model served by primary then secondary, both with a breaker policy small enough to test."""

    def make(length: int = 2, **policy):
        model, providers = make_model(chain_length=length)
        fields = {
            "window_seconds": 30,
            "minimum_calls": 4,
            "failure_rate_percent": 50,
            "slow_call_seconds": 5,
            "slow_rate_percent": 50,
            "open_seconds": 30,
            "max_open_seconds": 60,
            "half_open_probes": 2,
        }
        fields.update(policy)
        breaker = BreakerPolicy.objects.create(name=unique("policy"), **fields)
        Deployment.objects.filter(name__in=providers).update(breaker_policy=breaker)
        return model, providers

    return make


def post(gateway, key: str, model: str, prompt: str = "hi", **body) -> httpx.Response:
    """These tests are about providers: the cache stays out of the way."""
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"},
        json={"model": model, "messages": [{"role": "user", "content": prompt}], **body},
        timeout=30,
    )


def calls(mock_provider, provider: str) -> int:
    return mock_provider.stats(provider)["calls"]


def state(provider: str) -> str:
    return breaker_snapshot(Deployment.objects.get(name=provider).pk)["state"]


def test_failing_primary_fails_over_and_its_breaker_opens(gateway, api_key, chain, mock_provider):
    model, (primary, secondary) = chain()
    mock_provider.control(primary, error_rate=1.0, error_status=503)
    responses = [post(gateway, api_key, model, f"p{i}") for i in range(10)]

    assert [r.status_code for r in responses] == [200] * 10  # no client-visible failure
    assert all(r.json()["choices"][0]["message"]["content"] == answer_text(f"p{i}") for i, r in enumerate(responses))
    assert {r.headers["x-sentinel-provider"] for r in responses} == {secondary}
    # Two attempts per request (one retry) until 4 failures opened the breaker; then no call at all.
    assert calls(mock_provider, primary) == 4
    assert state(primary) == "open"
    assert responses[0].headers["x-sentinel-fallbacks"] == "1"
    transition = BreakerTransition.objects.get(deployment__name=primary)
    assert (transition.from_state, transition.to_state) == ("closed", "open")
    assert "4/4 failed" in transition.reason


def test_stalled_primary_fails_over_within_the_attempt_timeout(gateway, api_key, chain, mock_provider):
    from gateway.models import Provider

    model, (primary, secondary) = chain()
    Provider.objects.filter(name=primary).update(timeout_seconds=0.5, first_token_timeout_seconds=0.5)
    mock_provider.control(primary, stall_ms=10_000)
    for stream in (False, True):
        response = post(gateway, api_key, model, "stall", stream=stream)
        assert response.status_code == 200
        # The stall outlasts the 10 s test: the secondary's answer means the 0.5 s timeout cut it.
        assert response.headers["x-sentinel-provider"] == secondary
    assert calls(mock_provider, primary) == 2  # one timeout waited out per request, no retry on the dead one


def test_slow_primary_opens_on_slow_call_rate(gateway, api_key, chain, mock_provider):
    model, (primary, secondary) = chain(slow_call_seconds=0.2, minimum_calls=3)
    mock_provider.control(primary, slow_ms=300)
    served = [post(gateway, api_key, model, f"s{i}").headers["x-sentinel-provider"] for i in range(5)]
    assert served == [primary, primary, primary, secondary, secondary]
    assert state(primary) == "open"
    assert "3/3 slow" in BreakerTransition.objects.get(deployment__name=primary).reason


def test_half_open_lets_only_the_configured_probes_through_then_closes(gateway, api_key, chain, mock_provider):
    model, (primary, _secondary) = chain(open_seconds=1, half_open_probes=3, slow_call_seconds=10)
    mock_provider.control(primary, error_rate=1.0)
    for i in range(3):
        post(gateway, api_key, model, f"o{i}")
    assert state(primary) == "open"
    # Fault cleared; the primary answers slowly, so the probes are still in flight while the whole
    # burst arrives, even on a loaded machine (a request after the probes succeed may rightly go there:
    # with 2 s probes a full CI run once had a burst take longer, and a fourth request went there).
    mock_provider.control(primary, error_rate=0.0, slow_ms=6000, reset_counters=True)
    time.sleep(1.1)

    async def burst():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{gateway.base_url}/chat/completions",
                        headers={"authorization": f"Bearer {api_key}"},
                        json={"model": model, "messages": [{"role": "user", "content": f"b{i}"}]},
                    )
                    for i in range(20)
                )
            )

    started = time.monotonic()
    responses = asyncio.run(burst())
    took = time.monotonic() - started
    assert [r.status_code for r in responses] == [200] * 20
    # Exactly the probes, under 20 concurrent requests (the burst's time says whether the probes were
    # still in flight when its last request was routed).
    assert calls(mock_provider, primary) == 3, f"the burst took {took:.1f} s"
    assert sum(r.headers["x-sentinel-provider"] == primary for r in responses) == 3
    assert state(primary) == "closed"
    assert post(gateway, api_key, model, "after").headers["x-sentinel-provider"] == primary
    states = list(
        BreakerTransition.objects.filter(deployment__name=primary)
        .order_by("created_at")
        .values_list("to_state", flat=True)
    )
    assert states == ["open", "half_open", "closed"]


def test_repeated_openings_stay_open_longer(gateway, api_key, chain, mock_provider):
    model, (primary, _) = chain(open_seconds=0.5, half_open_probes=1)
    mock_provider.control(primary, error_rate=1.0)
    for i in range(2):
        post(gateway, api_key, model, f"r{i}")
    time.sleep(0.6)
    before = time.time()
    post(gateway, api_key, model, "probe")  # the probe fails: open again, for twice as long
    after = time.time()
    deployment_id = Deployment.objects.get(name=primary).pk
    reopened = breaker_snapshot(deployment_id)
    assert reopened["state"] == "open" and reopened["openings"] == 2
    # Reopened at some moment between `before` and `after` (Valkey's clock, in whole ms), until 2 x 0.5 s
    # after it: what is stored, not what is left of it by the time this line runs.
    open_until = int(sync_redis().hget(keys_for(deployment_id)[0], "open_until")) / 1000
    assert before + 1.0 - 0.001 <= open_until <= after + 1.0


def test_mid_stream_drop_ends_with_an_error_event(gateway, api_key, chain, mock_provider):
    model, (primary, _) = chain()
    mock_provider.control(primary, drop_after=3, tpt_ms=10)
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0)
    text = []
    with pytest.raises(openai.APIError, match="broke off"):
        for chunk in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "drop"}], stream=True
        ):
            text.append(chunk.choices[0].delta.content or "")
    assert "".join(text) == answer_text("drop", 3)
    assert calls(mock_provider, primary) == 1  # no failover after the first token


def test_every_provider_down_is_a_clear_503_within_the_deadline(
    test_database_name, make_tenant, make_key, chain, mock_provider, live_db
):
    from gateway.models import Provider

    gateway = start_gateway(test_database_name, env={"SENTINEL_CHAIN_DEADLINE_SECONDS": "1.0"})
    try:
        model, providers = chain(length=3)
        Provider.objects.filter(name__in=providers).update(timeout_seconds=0.45, first_token_timeout_seconds=0.45)
        for name in providers:
            mock_provider.control(name, stall_ms=5000)
        key = make_key(make_tenant())
        response = post(gateway, key, model)
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "all_providers_unavailable"
        # Three 0.45 s timeouts would take 1.35 s: the message says the 1 s deadline ended it first.
        assert "deadline" in response.json()["error"]["message"]
    finally:
        gateway.stop()


def test_retry_after_is_honored_on_the_same_deployment(gateway, api_key, chain, mock_provider):
    model, (primary, _) = chain()
    # The mock spaces errors evenly: with a rate of 0.5 every second call fails.
    mock_provider.control(primary, error_rate=0.5, error_status=429, retry_after=0.3)
    assert post(gateway, api_key, model, "first").headers["x-sentinel-provider"] == primary  # call 1 works
    started = time.monotonic()
    response = post(gateway, api_key, model)
    assert response.headers["x-sentinel-provider"] == primary
    assert response.headers["x-sentinel-fallbacks"] == "0"
    assert time.monotonic() - started >= 0.3  # call 2 said "retry after 0.3 s" and was waited out; call 3 worked
    assert calls(mock_provider, primary) == 3


def test_a_long_retry_after_fails_over_instead_of_waiting(gateway, api_key, chain, mock_provider):
    model, (primary, secondary) = chain()
    mock_provider.control(primary, error_rate=1.0, error_status=429, retry_after=30)
    response = post(gateway, api_key, model)
    assert response.headers["x-sentinel-provider"] == secondary
    assert calls(mock_provider, primary) == 1  # not retried after 30 s: failed over at once


def test_errors_retrying_cannot_fix_go_back_and_trip_nothing(gateway, api_key, chain, mock_provider):
    model, (primary, secondary) = chain(minimum_calls=1)
    for status, code in ((400, "invalid_request"), (401, "provider_authentication_failed")):
        mock_provider.control(primary, error_rate=1.0, error_status=status)
        response = post(gateway, api_key, model)
        assert response.json()["error"]["code"] == code
    assert calls(mock_provider, primary) == 2  # no retries
    assert calls(mock_provider, secondary) == 0  # no failover
    assert state(primary) == "closed"
    assert not BreakerTransition.objects.filter(deployment__name=primary).exists()


def test_breakers_are_shared_by_every_gateway_process(
    test_database_name, make_tenant, make_key, chain, mock_provider, live_db
):
    gateways = [start_gateway(test_database_name) for _ in range(3)]
    try:
        model, (primary, secondary) = chain()
        key = make_key(make_tenant())
        mock_provider.control(primary, error_rate=1.0)
        post(gateways[0], key, model, "a")
        post(gateways[0], key, model, "b")  # 4 failed calls in process 0: open
        before = calls(mock_provider, primary)
        for gateway in gateways[1:]:
            assert post(gateway, key, model, "c").headers["x-sentinel-provider"] == secondary
        assert calls(mock_provider, primary) == before  # the other processes never called it
    finally:
        for gateway in gateways:
            gateway.stop()


def test_forcing_a_breaker_is_audited_and_obeyed(gateway, api_key, chain, mock_provider, tenancy):
    model, (primary, secondary) = chain()
    deployment = Deployment.objects.get(name=primary)
    breaker_force(deployment=deployment, state="open", actor=tenancy.superuser, reason="provider incident #42")
    assert post(gateway, api_key, model).headers["x-sentinel-provider"] == secondary
    assert calls(mock_provider, primary) == 0
    action = ControlAction.objects.get(subject=f"deployment {primary}")
    assert (action.action, action.actor, action.reason) == ("force_open", tenancy.superuser, "provider incident #42")
    transition = BreakerTransition.objects.get(deployment=deployment)
    assert (transition.to_state, transition.actor) == ("forced_open", tenancy.superuser)

    # Forced closed: tried even while failing, and never opened by those failures.
    breaker_force(deployment=deployment, state="closed", actor=tenancy.superuser, reason="testing")
    mock_provider.control(primary, error_rate=1.0)
    for i in range(4):
        post(gateway, api_key, model, f"f{i}")
    assert calls(mock_provider, primary) == 8
    assert state(primary) == "forced_closed"
    breaker_force(deployment=deployment, state="", actor=tenancy.superuser, reason="done")
    assert state(primary) == "closed"


def test_kill_switch_per_tenant_and_global(gateway, tenancy, make_key, make_model, mock_provider):
    model, (normal,) = make_model()
    fallback, (safe,) = make_model()
    fallback_alias = ModelAlias.objects.get(name=fallback)
    key_a, key_b = make_key(tenancy.tenant), make_key(tenancy.other)

    kill_switch_set(
        tenant=tenancy.tenant, fallback=fallback_alias, active=True, actor=tenancy.superuser, reason="A's incident"
    )
    assert post(gateway, key_a, model).headers["x-sentinel-provider"] == safe
    assert post(gateway, key_b, model).headers["x-sentinel-provider"] == normal
    kill_switch_set(tenant=None, fallback=fallback_alias, active=True, actor=tenancy.superuser, reason="everyone")
    assert post(gateway, key_b, model).headers["x-sentinel-provider"] == safe
    kill_switch_set(tenant=None, fallback=fallback_alias, active=False, actor=tenancy.superuser, reason="over")
    kill_switch_set(
        tenant=tenancy.tenant, fallback=fallback_alias, active=False, actor=tenancy.superuser, reason="over"
    )
    assert post(gateway, key_a, model).headers["x-sentinel-provider"] == normal
    audit = list(
        ControlAction.objects.filter(action__startswith="kill_switch")
        .order_by("created_at")
        .values_list("action", "subject", "reason")
    )
    assert audit[-4:] == [
        ("kill_switch_on", f"tenant {tenancy.tenant.slug}", "A's incident"),
        ("kill_switch_on", "all tenants", "everyone"),
        ("kill_switch_off", "all tenants", "over"),
        ("kill_switch_off", f"tenant {tenancy.tenant.slug}", "over"),
    ]


def test_transitions_reach_the_live_view_group(gateway, api_key, chain, mock_provider):
    model, (primary, _) = chain()

    async def listen():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add("circuits", channel)
        mock_provider.control(primary, error_rate=1.0)
        async with httpx.AsyncClient(timeout=30) as client:
            for i in range(2):
                await client.post(
                    f"{gateway.base_url}/chat/completions",
                    headers={"authorization": f"Bearer {api_key}"},
                    json={"model": model, "messages": [{"role": "user", "content": f"l{i}"}]},
                )
        while True:  # pushed as it happens: nothing polls, so waiting longer would not help
            message = await asyncio.wait_for(layer.receive(channel), 5.0)
            if message.get("deployment") == primary:
                return message

    message = asyncio.run(listen())
    assert (message["type"], message["from"], message["to"]) == ("circuit.transition", "closed", "open")


@pytest.fixture(scope="module")
def webhook_worker(test_database_name):
    from tests.servers import start_celery_worker

    worker = start_celery_worker(test_database_name, name="breaker-webhooks")
    yield worker
    worker.stop()


def test_a_transition_seen_on_the_request_path_reaches_operators_webhooks_signed(
    gateway, api_key, chain, mock_provider, webhook_worker, tenancy
):
    """The breaker a gateway process opens is announced to operator endpoints subscribed to
    breaker.transition (signed, delivered by a Celery worker); a tenant's endpoint hears nothing of
    the operators' infrastructure."""
    import json

    from tenants.models import WebhookDelivery, WebhookEndpoint
    from tenants.webhooks import sign
    from tests.servers import Listener

    operators, tenant_receiver = Listener(), Listener()
    try:
        endpoint = WebhookEndpoint(tenant=None, url=operators.url("/hook"), events=["breaker.transition"])
        endpoint.set_secret("whsec-ops")
        endpoint.save()
        tenants_endpoint = WebhookEndpoint(tenant=tenancy.tenant, url=tenant_receiver.url("/hook"), events=[])
        tenants_endpoint.set_secret("whsec-tenant")
        tenants_endpoint.save()
        model, (primary, _) = chain()
        mock_provider.control(primary, error_rate=1.0, error_status=503)
        assert [post(gateway, api_key, model, f"w{i}").status_code for i in range(4)] == [200] * 4
        deadline = time.monotonic() + 20
        while not WebhookDelivery.objects.filter(endpoint=endpoint, status="delivered").exists():
            assert time.monotonic() < deadline, "the transition was never delivered"
            time.sleep(0.1)
        _, headers, body = operators.requests[0]
        assert headers["x-sentinel-event"] == "breaker.transition"
        assert headers["x-sentinel-signature"] == sign("whsec-ops", headers["x-sentinel-timestamp"], body)
        data = json.loads(body)["data"]
        assert (data["deployment"], data["from"], data["to"]) == (primary, "closed", "open")
        assert "failed" in data["reason"]
        time.sleep(0.5)
        assert tenant_receiver.requests == [] and not WebhookDelivery.objects.filter(endpoint=tenants_endpoint)
    finally:
        WebhookEndpoint.objects.filter(url__in=[operators.url("/hook"), tenant_receiver.url("/hook")]).delete()
        operators.close()
        tenant_receiver.close()


def test_deployments_sharing_a_position_split_traffic_by_weight(gateway, api_key, make_model, mock_provider):
    """Equals in a chain (same position) are picked by weight per request: 3:1 gives about 3/4 of the
    traffic to the first (here 200 requests: 150 expected, bounds at five standard deviations)."""
    from gateway.models import ChainEntry
    from sentinel.localstate import announce_change

    model, (heavy, light) = make_model(chain_length=2)
    ChainEntry.objects.filter(alias__name=model).update(position=0)
    Deployment.objects.filter(name=heavy).update(weight=3)
    Deployment.objects.filter(name=light).update(weight=1)
    announce_change()
    served = [post(gateway, api_key, model, f"wt{i}").headers["x-sentinel-provider"] for i in range(200)]
    assert set(served) == {heavy, light}
    assert 120 <= served.count(heavy) <= 180
    assert calls(mock_provider, heavy) + calls(mock_provider, light) == 200  # one call each, no fallback


def test_a_provider_that_refuses_connections_is_failed_over(gateway, api_key, chain, mock_provider):
    from gateway.models import Provider
    from sentinel.localstate import announce_change

    model, (primary, secondary) = chain()
    Provider.objects.filter(name=primary).update(api_base="http://127.0.0.1:1/v1")  # nothing listens there
    announce_change()
    for stream in (False, True):
        response = post(gateway, api_key, model, "connect", stream=stream)
        assert response.status_code == 200
        assert (response.headers["x-sentinel-provider"], response.headers["x-sentinel-fallbacks"]) == (secondary, "1")
    assert calls(mock_provider, secondary) == 2
    text = post(gateway, api_key, model, "connect again").json()["choices"][0]["message"]["content"]
    assert text == answer_text("connect again")
