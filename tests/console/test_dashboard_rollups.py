"""The dashboard's long windows read the daily rollups for their whole days and the ledger for the rest,
to exactly the figures the ledger alone gives; the keys' own budgets are on it, for their tenant only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.models import DailyTraffic
from billing.services import spend_roll_up
from sentinel.console.selectors import _sources, dashboard
from tenants.models import Budget
from tenants.services import key_create
from tests.billing.conftest import drain_all, hand_off_all, record
from tests.conftest import unique
from tests.console.conftest import as_user

# A fixed moment mid-day, so the windows' first and last days are partial whatever the clock says.
NOW = datetime(2026, 11, 20, 15, 30, tzinfo=UTC)


def roll_up() -> None:
    while spend_roll_up():
        pass


@pytest.fixture
def traffic(tenancy):
    """A month of tenant A's requests of every kind (and one of B's), rolled up, then one more row on a
    rolled-up day that the rollup job has not seen yet."""
    a, b = tenancy.tenant, tenancy.other
    k1, _ = key_create(tenant=a, name=unique("k1"))
    k2, _ = key_create(tenant=a, name=unique("k2"))
    kb, _ = key_create(tenant=b, name=unique("kb"))
    kinds = [
        {"status": 200, "cache_tier": "miss", "provider": "p1", "latency_ms": 100},
        {"status": 200, "cache_tier": "hit-exact", "provider": "cache", "saved_cost_usd": "0.25", "cost": "0"},
        {"status": 200, "cache_tier": "hit-semantic", "provider": "cache", "saved_cost_usd": "0.125", "cost": "0"},
        {"status": 503, "cache_tier": "miss", "provider": "p2", "cost": "0"},
        {"status": 429, "cache_tier": "bypass", "provider": "", "cost": "0"},
        {"status": 200, "cache_tier": "bypass", "provider": "p2", "latency_ms": 300},
    ]
    # Hours back from NOW: today's part, whole days, the first day's part inside the window and the
    # same day's part outside it (30 days = 720 h), and days outside the window.
    hours = [1, 14, 16, 40, 100, 170, 200, 400, 700, 718, 721, 800]
    records = []
    for i, back in enumerate(hours):
        for j, kind in enumerate(kinds):
            kind = dict(kind)
            records.append(
                record(
                    a,
                    key=[k1, k2, None][(i + j) % 3],
                    at=NOW - timedelta(hours=back, minutes=j),
                    model=["m1", "m2"][(i * j) % 2],
                    cost=kind.pop("cost", f"0.00{i}{j}123456"),
                    end_user=["", "alice", "bob"][(i + 2 * j) % 3],
                    request_id=f"r{i}-{j}",
                    **kind,
                )
            )
    records.append(record(b, key=kb, at=NOW - timedelta(hours=40), cost="7", request_id="b1"))
    hand_off_all(records)
    drain_all()
    roll_up()
    late = record(a, key=k1, at=NOW - timedelta(hours=100, minutes=30), cost="0.5", request_id="late")
    hand_off_all([late])
    drain_all()
    return {"a": a, "b": b, "k1": k1, "k2": k2, "kb": kb, "rows": records, "late": late}


def test_long_windows_from_rollups_equal_the_ledger_alone(tenancy, traffic):
    for window in ("7d", "30d"):
        for scope in ("tenant", "everyone"):
            check_window(traffic, window, scope)


def check_window(traffic, window: str, scope: str) -> None:
    a = traffic["a"]
    tenant_ids = [a.pk] if scope == "tenant" else None
    fast = dashboard(tenant_ids=tenant_ids, spend_tenants=[a], window=window, now=NOW)
    slow = dashboard(tenant_ids=tenant_ids, spend_tenants=[a], window=window, now=NOW, rollups=False)
    assert fast == slow, (window, scope)  # every figure, money to the last Decimal place
    since = NOW - (timedelta(days=7) if window == "7d" else timedelta(days=30))
    late = datetime.fromtimestamp(traffic["late"].created_at, UTC)
    inside = [r for r in traffic["rows"] if since.timestamp() <= r.created_at and r.tenant_id == a.pk]
    if scope == "tenant":
        assert fast.totals["requests"] == len(inside) + 1  # and the late row
        assert fast.totals["cost_usd"] == sum((Decimal(r.cost_usd) for r in inside), Decimal("0.5"))
        assert fast.totals["errors"] == sum(1 for r in inside if r.status_code != 200)
        assert fast.totals["saved_usd"] == sum((Decimal(r.saved_cost_usd) for r in inside), Decimal(0))
        # Every part was compared with something in it.
        assert {row["end_user"] for row in fast.top_users} == {"alice", "bob"}
        assert {p.provider for p in fast.providers} == {"p1", "p2", "cache"}
        assert {row["model_requested"] for row in fast.top_models} == {"m1", "m2", "gpt-4o-mini"}  # the late row's
        assert len(fast.keys_over_time) == 2 and fast.totals["exact_hits"] and fast.totals["misses"]

    # The rollups were read: the ledger part is only the window's first and last day, and the day
    # with a row the rollup job has not folded in yet.
    sources = _sources(tenant_ids, fast.since, fast.until, rollups=True)
    partial = {since.date(), NOW.date(), late.date()}
    days = {datetime.fromtimestamp(r.created_at, UTC).date() for r in inside} | {late.date()}
    read = {at.date() for at in sources.entries.filter(tenant_id=a.pk).values_list("created_at", flat=True)}
    assert read == days & partial
    assert sources.traffic.filter(tenant_id=a.pk).exists()
    assert not sources.traffic.filter(tenant_id=a.pk, day__in=partial).exists()
    assert DailyTraffic.objects.filter(tenant_id=traffic["b"].pk).exists()


def test_key_budgets_show_spent_against_limit_for_the_tenant_only(tenancy):
    a, b = tenancy.tenant, tenancy.other
    (k1, _), (k2, _), (kb, _) = (key_create(tenant=t, name=unique("key")) for t in (a, a, b))
    now = datetime.now(UTC)
    hand_off_all(
        [
            record(a, key=k1, at=now - timedelta(seconds=5), cost="0.75", request_id="kb-1"),
            record(a, key=k2, at=now - timedelta(seconds=5), cost="2", request_id="kb-2"),
            record(b, key=kb, at=now - timedelta(seconds=5), cost="9", request_id="kb-3"),
        ]
    )
    drain_all()
    Budget.objects.create(tenant=a, key=k1, period="daily", limit_usd=Decimal("1"))
    Budget.objects.create(tenant=a, key=k2, period="monthly", limit_usd=Decimal("10"))
    Budget.objects.create(tenant=b, key=kb, period="daily", limit_usd=Decimal("5"))

    data = dashboard(tenant_ids=[a.pk], spend_tenants=[a], window="24h", now=now)
    assert [(line.key, line.period, line.limit_usd, line.spent) for line in data.key_budgets] == [
        (k1, "daily", Decimal("1"), Decimal("0.75")),
        (k2, "monthly", Decimal("10"), Decimal("2")),
    ]
    assert data.key_budget_count == 2

    page = as_user(tenancy.owner).get("/admin/dashboard/?window=24h").content.decode()
    assert 'id="key-budget-table"' in page
    assert k1.name in page and k2.name in page and kb.name not in page
    assert "$0.7500" in page and "$0.2500" in page  # spent and left of k1's daily budget
    # Viewers see no money: no budgets either; B's admin sees B's key only.
    assert 'id="key-budget-table"' not in as_user(tenancy.viewer).get("/admin/dashboard/").content.decode()
    other = as_user(tenancy.outsider).get("/admin/dashboard/").content.decode()
    assert kb.name in other and k1.name not in other and k2.name not in other
