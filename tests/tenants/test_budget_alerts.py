"""Soft budget thresholds: an alert once per period, as a signed webhook delivered with retries; also
for a budget created (or lowered) after its period's spend had passed the threshold."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import httpx
import pytest
from django.utils import timezone

from gateway.models import Deployment
from tenants.models import Budget, BudgetAlert, WebhookDelivery, WebhookEndpoint
from tenants.webhooks import sign
from tests.billing.conftest import drain_all, hand_off_all, record
from tests.conftest import unique, wait_for
from tests.console.conftest import as_user
from tests.servers import Listener, start_celery_worker


@pytest.fixture(scope="module")
def celery_worker(test_database_name):
    worker = start_celery_worker(test_database_name, name="alerts")
    yield worker
    worker.stop()


def test_threshold_alerts_once_with_a_signed_webhook(gateway, celery_worker, tenant, make_key, make_model, live_db):
    receiver = Listener(failures=1)
    try:
        endpoint = WebhookEndpoint(tenant=tenant, url=receiver.url("/hook"), events=["budget.threshold"])
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
        _, headers, body = receiver.requests[-1]
        assert headers["x-sentinel-signature"] == sign("whsec-test", headers["x-sentinel-timestamp"], body)
        payload = json.loads(body)
        assert payload["event"] == "budget.threshold"
        assert payload["data"]["tenant"] == tenant.slug
        assert payload["data"]["spent_usd"] == "0.0300000000"
        assert payload["data"]["limit_usd"] == "0.0500"
    finally:
        receiver.close()


def test_an_endpoint_of_another_tenant_hears_nothing(gateway, celery_worker, tenancy, make_key, make_model, live_db):
    receiver = Listener()
    try:
        outsider_endpoint = WebhookEndpoint(tenant=tenancy.other, url=receiver.url("/hook"))
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


def spend_today(tenant, cost: str) -> None:
    """Settled spend of the tenant today, through the ledger as the gateway records it."""
    hand_off_all([record(tenant, cost=cost, request_id=unique("spent"))])
    drain_all()


def test_a_budget_created_past_its_threshold_alerts_at_once(celery_worker, tenancy, live_db):
    """Spend already over the threshold (here over the limit too: the hard budget admits no request
    that could alert) when the budget is created in the console: the alert comes right away."""
    spend_today(tenancy.tenant, "0.06")
    owner = as_user(tenancy.owner)
    saved = owner.post(
        "/admin/tenants/budget/add/",
        {"tenant": tenancy.tenant.pk, "period": "daily", "limit_usd": "0.05", "alert_at_percent": "80", "hard": "on"},
    )
    assert saved.status_code == 302
    budget = Budget.objects.get(tenant=tenancy.tenant)
    wait_for(lambda: BudgetAlert.objects.filter(budget=budget).exists(), timeout=60)  # worker start included
    alert = BudgetAlert.objects.get(budget=budget)
    assert (alert.period_start, alert.spent_usd) == (timezone.now().date(), Decimal("0.06"))


def test_a_budget_under_its_threshold_does_not_alert_when_saved(celery_worker, tenancy, live_db):
    spend_today(tenancy.tenant, "0.01")
    spend_today(tenancy.other, "0.05")
    for tenant, admin in ((tenancy.tenant, tenancy.owner), (tenancy.other, tenancy.outsider)):
        saved = as_user(admin).post(
            "/admin/tenants/budget/add/",
            {"tenant": tenant.pk, "period": "daily", "limit_usd": "0.05", "alert_at_percent": "80", "hard": "on"},
        )
        assert saved.status_code == 302
    # The worker takes its tasks in order: once B's alert is there, A's budget was checked too.
    wait_for(lambda: BudgetAlert.objects.filter(budget__tenant=tenancy.other).exists(), timeout=60)
    assert not BudgetAlert.objects.filter(budget__tenant=tenancy.tenant).exists()


def test_a_budget_past_its_threshold_alerts_on_the_next_request(gateway, celery_worker, tenant, make_key, make_model):
    """A budget the console did not save (or one whose alert the save did not send): the gateway
    alerts when a request settles at or past the threshold, not only when one crosses it."""
    spend_today(tenant, "0.04")
    model, (provider,) = make_model()
    Deployment.objects.filter(name=provider).update(input_price_override=0, output_price_override=Decimal("0.00025"))
    budget = Budget.objects.create(tenant=tenant, period="daily", limit_usd=Decimal("0.10"), alert_at_percent=30)
    key = make_key(tenant)
    body = {"model": model, "messages": [{"role": "user", "content": "past"}], "max_tokens": 40}
    answered = httpx.post(f"{gateway.base_url}/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body)
    assert answered.status_code == 200
    wait_for(lambda: BudgetAlert.objects.filter(budget=budget).exists(), timeout=60)  # worker start included
    assert BudgetAlert.objects.get(budget=budget).spent_usd == Decimal("0.05")
