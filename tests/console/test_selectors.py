"""The dashboard's figures, exact: traffic, latency percentiles, cache, providers and spend against
budgets, for the tenants asked for only."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from sentinel.console.selectors import dashboard
from tenants.models import Budget
from tests.billing.conftest import drain_all, hand_off_all, record
from tests.conftest import unique
from tests.console.conftest import as_user


def test_figures_cover_the_window_and_the_tenants_asked_for(tenancy):
    a, b = tenancy.tenant, tenancy.other
    now = timezone.now()
    at = now - timedelta(minutes=10)
    hand_off_all(
        [
            record(a, at=at, provider="p1", latency_ms=100, cost="0.001", request_id="d1"),
            record(a, at=at, provider="p1", latency_ms=200, cost="0.002", request_id="d2"),
            record(a, at=at, provider="p1", latency_ms=300, cost="0.003", request_id="d3"),
            record(a, at=at, provider="p2", latency_ms=400, cost="0.004", request_id="d4"),
            record(a, at=at, provider="p1", status=503, cost="0", latency_ms=9000, request_id="d5"),
            record(
                a,
                at=at,
                provider="cache",
                cache_tier="hit-exact",
                latency_ms=10,
                cost="0",
                saved_cost_usd="0.5",
                request_id="d6",
            ),
            record(a, at=now - timedelta(hours=2), provider="p1", latency_ms=5, cost="0.01", request_id="old"),
            record(b, at=at, provider="p1", latency_ms=1, cost="7", request_id="other"),
        ]
    )
    drain_all()
    Budget.objects.create(tenant=a, period="daily", limit_usd=Decimal("1"))
    Budget.objects.create(tenant=a, period="monthly", limit_usd=Decimal("10"))
    Budget.objects.create(tenant=a, period="monthly", limit_usd=Decimal("5"))

    data = dashboard(tenant_ids=[a.pk], spend_tenants=[a], window="1h", now=now)

    assert {name: data.totals[name] for name in ("requests", "errors", "server_errors")} == {
        "requests": 6,
        "errors": 1,
        "server_errors": 1,
    }
    assert (data.totals["exact_hits"], data.totals["semantic_hits"], data.totals["misses"]) == (1, 0, 4)
    # Answered latencies 10, 100, 200, 300, 400 (the failed request's 9 s is not among them).
    assert (data.totals["p50"], data.totals["p95"], data.totals["p99"]) == (200, 380, 396)
    assert data.totals["cost_usd"] == Decimal("0.01") and data.totals["saved_usd"] == Decimal("0.5")
    assert data.hit_ratio == 0.2 and data.error_rate == 1 / 6
    assert [(p.provider, p.requests, p.server_errors, p.share) for p in data.providers] == [
        ("p1", 4, 1, 4 / 6),
        ("cache", 1, 0, 1 / 6),
        ("p2", 1, 0, 1 / 6),
    ]
    assert len(data.series) == (61 if (now.second, now.microsecond) != (0, 0) else 60)  # every minute, zeros too
    assert sum(point["requests"] for point in data.series) == 6
    assert sum(point["errors"] for point in data.series) == 1
    (spend,) = data.spend
    # A's rows: 0.01 ten minutes ago and 0.01 two hours ago; each counts where it shares today's UTC date or
    # month with now (a run just after midnight puts even the ten-minute-old rows on yesterday).
    rows = [(at, Decimal("0.01")), (now - timedelta(hours=2), Decimal("0.01"))]
    assert spend.tenant == a
    assert spend.today == sum((cost for when, cost in rows if when.date() == now.date()), Decimal(0))
    assert spend.month == sum(
        (cost for when, cost in rows if (when.year, when.month) == (now.year, now.month)), Decimal(0)
    )
    assert (spend.daily_budget, spend.monthly_budget) == (Decimal("1"), Decimal("5"))

    day = dashboard(tenant_ids=[a.pk], spend_tenants=None, window="24h", now=now)
    assert day.totals["requests"] == 7 and day.spend is None
    assert len(day.series) == (25 if (now.minute, now.second, now.microsecond) != (0, 0, 0) else 24)


def test_models_and_prices_show_what_a_tenant_may_call(tenancy):
    """The page every member of a tenant reads: the aliases on its allowlist (not the others), each
    with the first deployment's context window (litellm's map) and its prices per million tokens,
    exact (an override wins over the price table). Another tenant's page is not theirs to read."""
    from decimal import Decimal

    from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
    from tests.conftest import unique
    from tests.console.conftest import as_user

    provider = Provider.objects.create(name=unique("p"), kind="openai", api_base="http://127.0.0.1:9/v1")
    first = Deployment.objects.create(
        name=unique("d"),
        provider=provider,
        litellm_model="openai/gpt-4o-mini",
        input_price_override=Decimal("0.00000015"),
        output_price_override=Decimal("0.0001"),
    )
    spare = Deployment.objects.create(name=unique("d"), provider=provider, litellm_model="openai/gpt-4o")
    offered = ModelAlias.objects.create(name=unique("mini"), description="small and quick")
    ChainEntry.objects.create(alias=offered, deployment=first, position=0)
    ChainEntry.objects.create(alias=offered, deployment=spare, position=1)
    hidden = ModelAlias.objects.create(name=unique("other"))
    ChainEntry.objects.create(alias=hidden, deployment=spare, position=0)
    tenant = tenancy.tenant
    tenant.allowed_models = [offered.name]
    tenant.save()

    page = as_user(tenancy.viewer).get("/admin/models/")
    assert page.status_code == 200
    (offer,) = page.context["offers"]
    assert (offer.name, offer.served_by, offer.fallbacks) == (offered.name, first.name, 1)
    assert (offer.context_window, offer.max_output) == (128000, 16384)
    assert (offer.input_per_million, offer.output_per_million) == ("0.15", "100")
    html = page.content.decode()
    assert hidden.name not in html and "small and quick" in html
    assert as_user(tenancy.viewer).get("/admin/models/", {"tenant": tenancy.other.slug}).status_code == 404


def test_longer_windows_and_the_busiest_keys_models_and_users(tenancy):
    """Seven and thirty days, a bucket a UTC day; the busiest keys, models and end users of the
    window with their requests, failures and exact cost, and the busiest keys' and models' requests
    and spend day by day, the tenant's own only."""
    from tenants.services import key_create

    a, b = tenancy.tenant, tenancy.other
    now = timezone.now()
    busy, _ = key_create(tenant=a, name=unique("busy"))
    quiet, _ = key_create(tenant=a, name=unique("quiet"))
    theirs, _ = key_create(tenant=b, name=unique("theirs"))

    def row(tenant, key, days: int, model: str, cost: str, status: int = 200, user: str = ""):
        when = now - timedelta(days=days)
        return record(
            tenant, key=key, at=when, model=model, cost=cost, status=status, request_id=unique("w"), end_user=user
        )

    rows = [
        row(a, busy, 3, "m-big", "0.25", user="alice"),
        row(a, busy, 1, "m-big", "0.5", user="alice"),
        row(a, busy, 2, "m-big", "0.5", user="bob"),
        row(a, quiet, 20, "m-small", "0", status=500),
        row(b, theirs, 1, "m-theirs", "9", user="alice"),
    ]
    hand_off_all(rows)
    drain_all()

    week = dashboard(tenant_ids=[a.pk], spend_tenants=[a], window="7d", now=now)
    assert len(week.series) in (7, 8) and sum(p["requests"] for p in week.series) == 3
    assert [(k["key__name"], k["requests"], k["errors"], k["cost_usd"]) for k in week.top_keys] == [
        (busy.name, 3, 0, Decimal("1.25"))
    ]
    assert [(u["end_user"], u["requests"], u["cost_usd"]) for u in week.top_users] == [
        ("alice", 2, Decimal("0.75")),
        ("bob", 1, Decimal("0.5")),
    ]
    days = [point["at"][:10] for point in week.series]

    def on(days_ago: int) -> int:
        return days.index((now - timedelta(days=days_ago)).date().isoformat())

    (line,) = week.keys_over_time
    assert line["name"] == busy.name and sum(line["requests"]) == 3
    assert [line["requests"][on(d)] for d in (1, 2, 3)] == [1, 1, 1]
    assert [line["cost_usd"][on(d)] for d in (1, 2, 3)] == [Decimal("0.5"), Decimal("0.5"), Decimal("0.25")]
    assert [week.series[on(d)]["cost_usd"] for d in (1, 2, 3)] == [Decimal("0.5"), Decimal("0.5"), Decimal("0.25")]
    assert [(m["name"], sum(m["requests"])) for m in week.models_over_time] == [("m-big", 3)]
    month = dashboard(tenant_ids=[a.pk], spend_tenants=[a], window="30d", now=now)
    assert [(m["model_requested"], m["requests"], m["errors"]) for m in month.top_models] == [
        ("m-big", 3, 0),
        ("m-small", 1, 1),
    ]
    page = as_user(tenancy.owner).get("/admin/dashboard/", {"window": "30d"})
    html = page.content.decode()
    assert page.status_code == 200 and busy.name in html and quiet.name in html and theirs.name not in html
    charts = page.context["charts"]
    assert [(m["name"], sum(m["requests"])) for m in charts["models"]] == [("m-big", 3), ("m-small", 1)]
    assert sum(Decimal(p["cost_usd"]) for p in charts["series"]) == Decimal("1.25")
    # A viewer sees requests over time but no money, in the page or its chart data.
    seen = as_user(tenancy.viewer).get("/admin/dashboard/", {"window": "30d"}).context["charts"]
    assert [sum(k["requests"]) for k in seen["keys"]] == [3, 1]
    assert "cost_usd" not in seen["keys"][0] and "cost_usd" not in seen["series"][0]
