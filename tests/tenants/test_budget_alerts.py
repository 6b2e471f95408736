"""Soft budget thresholds: an alert once per period, as a signed webhook delivered with retries."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import httpx
import pytest

from gateway.models import Deployment
from tenants.models import Budget, BudgetAlert, WebhookDelivery, WebhookEndpoint
from tenants.webhooks import sign
from tests.servers import WebhookReceiver, start_celery_worker


@pytest.fixture(scope="module")
def celery_worker(test_database_name):
    worker = start_celery_worker(test_database_name, name="alerts")
    yield worker
    worker.stop()


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def test_threshold_alerts_once_with_a_signed_webhook(gateway, celery_worker, tenant, make_key, make_model, live_db):
    receiver = WebhookReceiver(failures=1)
    try:
        endpoint = WebhookEndpoint(tenant=tenant, url=receiver.url, events=["budget.threshold"])
        endpoint.set_secret("whsec-test")
        endpoint.save()
        model, (provider,) = make_model()
        Deployment.objects.filter(name=provider).update(
            input_price_override=0, output_price_override=Decimal("0.00025")
        )
        budget = Budget.objects.create(tenant=tenant, period="daily", limit_usd=Decimal("0.05"), alert_at_percent=60)
        key = make_key(tenant)

        def ask(i: int) -> int:
            body = {"model": model, "messages": [{"role": "user", "content": f"b{i}"}], "max_tokens": 40}
            return httpx.post(
                f"{gateway.base_url}/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body
            ).status_code

        assert [ask(i) for i in range(5)] == [200] * 5  # $0.01 each: the 3rd crosses 60%
        assert ask(5) == 402  # the hard limit
        wait_for(lambda: WebhookDelivery.objects.filter(endpoint=endpoint, status="delivered").exists())

        alert = BudgetAlert.objects.get(budget=budget)
        assert alert.spent_usd == Decimal("0.03")
        delivery = WebhookDelivery.objects.get(endpoint=endpoint)
        assert (delivery.event, delivery.attempts) == ("budget.threshold", 2)  # first attempt got a 500
        assert len(receiver.requests) == 2
        headers, body = receiver.requests[-1]
        assert headers["x-sentinel-signature"] == sign("whsec-test", headers["x-sentinel-timestamp"], body)
        payload = json.loads(body)
        assert payload["event"] == "budget.threshold"
        assert payload["data"]["tenant"] == tenant.slug
        assert payload["data"]["spent_usd"] == "0.0300000000"
        assert payload["data"]["limit_usd"] == "0.0500"
    finally:
        receiver.close()


def test_an_endpoint_of_another_tenant_hears_nothing(gateway, celery_worker, tenancy, make_key, make_model, live_db):
    receiver = WebhookReceiver()
    try:
        outsider_endpoint = WebhookEndpoint(tenant=tenancy.other, url=receiver.url)
        outsider_endpoint.set_secret("other")
        outsider_endpoint.save()
        model, (provider,) = make_model()
        Deployment.objects.filter(name=provider).update(
            input_price_override=0, output_price_override=Decimal("0.00025")
        )
        budget = Budget.objects.create(
            tenant=tenancy.tenant, period="daily", limit_usd=Decimal("0.01"), alert_at_percent=50
        )
        key = make_key(tenancy.tenant)
        body = {"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 40}
        httpx.post(f"{gateway.base_url}/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body)
        wait_for(lambda: BudgetAlert.objects.filter(budget=budget).exists())
        time.sleep(1.0)
        assert receiver.requests == []
        assert not WebhookDelivery.objects.filter(endpoint=outsider_endpoint).exists()
    finally:
        receiver.close()
