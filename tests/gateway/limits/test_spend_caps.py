"""Provider spend caps: what each provider is paid per UTC day is counted in Redis when requests
settle; once a provider's daily cap is reached its deployments are skipped like an open breaker,
traffic moves to the next deployment in the chain, and the admin shows the day's spend against it."""

from __future__ import annotations

from decimal import Decimal

import httpx
from django.db.models import Sum
from django.test import Client

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.limits.admission import provider_spend_today
from gateway.models import Deployment, Provider

PRICE = Decimal("0.00001")  # per token, both ways: a request of ~50 tokens costs about $0.0005


def capped_at(provider: str, cap: str) -> None:
    Provider.objects.filter(name=provider).update(daily_spend_cap_usd=Decimal(cap))
    Deployment.objects.filter(name=provider).update(input_price_override=PRICE, output_price_override=PRICE)


def post(gateway, key: str, model: str, prompt: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"},
        json={"model": model, "messages": [{"role": "user", "content": prompt}]},
        timeout=30,
    )


def test_a_capped_provider_hands_traffic_to_the_next_deployment(gateway, tenant, api_key, make_model, mock_provider):
    alias, (capped, cheaper) = make_model(chain_length=2)
    capped_at(capped, "0.0010")  # about two requests
    responses = [post(gateway, api_key, alias, f"spend {i}") for i in range(5)]

    assert [r.status_code for r in responses] == [200] * 5  # moved on instead of failing
    served = [r.headers["x-sentinel-provider"] for r in responses]
    first_elsewhere = served.index(cheaper)
    assert first_elsewhere >= 1
    assert served == [capped] * first_elsewhere + [cheaper] * (5 - first_elsewhere)
    assert responses[-1].headers["x-sentinel-fallbacks"] == "1"
    assert mock_provider.stats(capped)["calls"] == first_elsewhere

    # Redis's count is exactly what the ledger billed at that provider today, and it reached the cap.
    drain()
    billed = LedgerEntry.objects.filter(tenant=tenant, provider=capped).aggregate(total=Sum("cost_usd"))["total"]
    provider = Provider.objects.get(name=capped)
    assert provider_spend_today(provider.pk) == billed
    assert billed >= provider.daily_spend_cap_usd
    assert provider_spend_today(Provider.objects.get(name=cheaper).pk) > 0  # counted without a cap too


def test_when_every_provider_is_capped_the_request_fails_without_a_call(gateway, api_key, make_model, mock_provider):
    alias, (only,) = make_model()
    capped_at(only, "0.0001")
    assert post(gateway, api_key, alias, "one").status_code == 200
    refused = post(gateway, api_key, alias, "two")
    assert refused.status_code == 503
    error = refused.json()["error"]
    assert error["code"] == "all_providers_unavailable"
    assert "spend cap" in error["message"]
    assert mock_provider.stats(only)["calls"] == 1


def test_the_admin_shows_todays_spend_against_the_cap(gateway, tenancy, make_key, make_model):
    alias, (capped,) = make_model()
    capped_at(capped, "0.0001")
    key = make_key(tenancy.tenant)
    assert post(gateway, key, alias, "for the admin").status_code == 200
    spent = provider_spend_today(Provider.objects.get(name=capped).pk)

    browser = Client()
    browser.force_login(tenancy.superuser)
    page = browser.get("/admin/gateway/provider/", {"q": capped})
    assert page.status_code == 200
    text = page.content.decode()
    assert f"${spent.normalize():f} of $0.0001 — cap reached, traffic moved on" in text
