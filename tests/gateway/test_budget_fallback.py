"""A hard budget nearly spent sends a tenant's requests to its cheaper alias, when it names one and
the key may use it (gateway.pipeline.cheaper_when_budget_nearly_spent): over real HTTP, with the
reservation made for the model called, so the budget stays exact."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest

from gateway.models import Deployment
from tenants.models import Budget
from tests.gateway.test_dialect_chains import ledger_rows

# 40 answer tokens (the mock's) at these prices: the dear model costs $0.40 a request, the cheap
# one $0.02. The budget takes one dear request ($0.40 is 91% of it), not two.
DEAR, CHEAP = Decimal("0.01"), Decimal("0.0005")
LIMIT = Decimal("0.44")


@pytest.fixture
def priced(make_model):
    """(dear alias, its deployment, cheap alias, its deployment), prices set per output token."""
    dear, (dear_deployment,) = make_model()
    cheap, (cheap_deployment,) = make_model()
    Deployment.objects.filter(name=dear_deployment).update(input_price_override=0, output_price_override=DEAR)
    Deployment.objects.filter(name=cheap_deployment).update(input_price_override=0, output_price_override=CHEAP)
    return dear, dear_deployment, cheap, cheap_deployment


def post(gateway, key: str, model: str, request_id: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={
            "authorization": f"Bearer {key}",
            "x-sentinel-request-id": request_id,
            "x-sentinel-cache-control": "no-cache, no-store",
        },
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40},
        timeout=30,
    )


def test_a_nearly_spent_budget_sends_requests_to_the_cheaper_alias(
    gateway, make_tenant, make_key, priced, mock_provider
):
    dear, dear_deployment, cheap, cheap_deployment = priced
    tenant = make_tenant(budget_fallback_model=cheap, budget_fallback_percent=90)
    Budget.objects.create(tenant=tenant, period="daily", limit_usd=LIMIT)
    key = make_key(tenant, allowed_models=[dear, cheap])
    ids = [f"req_budget_{i}_{tenant.slug}" for i in range(3)]

    first = post(gateway, key, dear, ids[0])  # $0 of $0.44 spent: the model asked for
    assert (first.status_code, first.headers["x-sentinel-deployment"]) == (200, dear_deployment)
    assert first.headers["x-sentinel-cost-usd"] == "0.4000000000"
    assert "x-sentinel-fallback-reasons" not in first.headers

    for request_id in ids[1:]:  # $0.40 spent, 91%: the cheaper alias, reserved and billed as such
        response = post(gateway, key, dear, request_id)
        assert response.status_code == 200, response.text
        assert response.headers["x-sentinel-deployment"] == cheap_deployment
        assert response.headers["x-sentinel-fallback-reasons"] == f"{dear}=budget"
        assert response.headers["x-sentinel-cost-usd"] == "0.0200000000"

    rows = ledger_rows(ids)
    assert [rows[i].fallback_reasons for i in ids] == ["", f"{dear}=budget", f"{dear}=budget"]
    assert [rows[i].model_requested for i in ids] == [dear] * 3
    assert [rows[i].deployment for i in ids] == [dear_deployment, cheap_deployment, cheap_deployment]
    assert sum(rows[i].cost_usd for i in ids) == LIMIT  # the budget, spent to the last cent
    assert mock_provider.stats(dear_deployment)["calls"] == 1
    # Spent to its limit: even the cheaper alias no longer fits, and nothing is called.
    refused = post(gateway, key, dear, f"req_budget_3_{tenant.slug}")
    assert (refused.status_code, refused.json()["error"]["code"]) == (402, "budget_exceeded")
    assert mock_provider.stats(cheap_deployment)["calls"] == 2


@pytest.mark.parametrize("case", ["off", "not-allowed"])
def test_without_the_setting_or_the_key_allowed_the_cheaper_alias_the_budget_refuses(
    gateway, make_tenant, make_key, priced, mock_provider, case
):
    dear, dear_deployment, cheap, cheap_deployment = priced
    tenant = make_tenant(budget_fallback_model="" if case == "off" else cheap)
    Budget.objects.create(tenant=tenant, period="daily", limit_usd=LIMIT)
    key = make_key(tenant, allowed_models=[dear] if case == "not-allowed" else [dear, cheap])
    ids = [f"req_nofallback_{i}_{tenant.slug}" for i in range(2)]
    assert post(gateway, key, dear, ids[0]).headers["x-sentinel-deployment"] == dear_deployment
    refused = post(gateway, key, dear, ids[1])
    assert (refused.status_code, refused.json()["error"]["code"]) == (402, "budget_exceeded")
    assert "x-sentinel-fallback-reasons" not in refused.headers
    rows = ledger_rows(ids)
    assert (rows[ids[1]].fallback_reasons, rows[ids[1]].cost_usd) == ("", Decimal("0"))
    assert mock_provider.stats(cheap_deployment)["calls"] == 0
    assert mock_provider.stats(dear_deployment)["calls"] == 1
