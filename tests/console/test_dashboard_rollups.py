"""The dashboard's long windows read the daily rollups for their whole days and the ledger for the rest,
to exactly the figures the ledger alone gives (latency percentiles included: percentile_cont's own
values); the keys' own budgets are on it, for their tenant only."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection

from billing.models import DailyTraffic, LedgerEntry
from billing.services import spend_roll_up
from sentinel.console.selectors import PERCENTILES, PercentileCont, _latency, _sources, dashboard, percentile_cont
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


# --- latency percentiles from the daily histograms -------------------------------------------------

# Hand-made latency sets (ms): ties, even and odd counts, a single row. The rows of the k-th set are
# spread over LATENCY_HOURS (hours back from NOW) from its k-th: today's part, whole days, and the
# 30-day window's partial first day (718 h back).
LATENCY_SETS = {
    "single row": [777],  # today: read from the ledger
    "single row, a whole day": [777],  # 40 h back: read from the rollups
    "two rows": [10, 21],
    "ties": [5, 5, 5, 5, 8, 8, 13, 13, 13, 1000],
    "all equal": [300] * 7,
    "even count with ties": [(i * 37) % 101 for i in range(40)] + [50] * 6,
    "odd count, wide": [1, 2, 3, 60_000, 4, 5, 250, 250, 250, 7, 9_999, 0, 0],
}
LATENCY_HOURS = [1, 40, 14, 100, 718, 170, 400, 16, 700, 60]
# Windows ending at NOW: the dashboard's, and others whose first day is partial at other hours.
LATENCY_WINDOWS = [timedelta(days=7), timedelta(days=30), timedelta(hours=50), timedelta(hours=101), timedelta(days=2)]


def ledger_percentiles(tenant_ids, since: datetime, until: datetime) -> dict:
    """PostgreSQL's percentile_cont over the window's answered ledger rows: what the rollups must equal."""
    rows = LedgerEntry.objects.filter(created_at__gte=since, created_at__lt=until, status_code=200)
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=tenant_ids)
    return rows.aggregate(**{name: PercentileCont("latency_ms", f) for name, f in PERCENTILES.items()})


@pytest.fixture
def latency_sets(make_tenant):
    """A tenant per latency set, each with failed requests (excluded: any other status) much slower
    than any answer, and a neighbour tenant whose answers are slower still on the same days; rolled up."""
    neighbour = make_tenant()
    tenants, records = {}, []
    for k, (name, latencies) in enumerate(LATENCY_SETS.items()):
        tenant = tenants[name] = make_tenant()
        for i, latency in enumerate(latencies):
            at = NOW - timedelta(hours=LATENCY_HOURS[(i + k) % len(LATENCY_HOURS)], minutes=i)
            records.append(record(tenant, at=at, latency_ms=latency, request_id=f"{name}-{i}"))
        for i, hours in enumerate(LATENCY_HOURS):
            at = NOW - timedelta(hours=hours, minutes=30)
            records.append(record(tenant, at=at, latency_ms=500_000, status=503, request_id=f"{name}-failed-{i}"))
            records.append(record(neighbour, at=at, latency_ms=900_000 + i, request_id=f"{name}-neighbour-{i}"))
    hand_off_all(records)
    drain_all()
    roll_up()
    return {"tenants": tenants, "neighbour": neighbour}


def test_latency_percentiles_from_rollups_equal_percentile_cont_over_the_ledger(latency_sets):
    rolled_up = set()
    for name, tenant in latency_sets["tenants"].items():
        for length in LATENCY_WINDOWS:
            since = NOW - length
            sources = _sources([tenant.pk], since, NOW, rollups=True)
            if sources.latency is not None and sources.latency.exists():
                rolled_up.add(name)
            expected = ledger_percentiles([tenant.pk], since, NOW)
            assert _latency(sources) == expected, (name, length)  # the same doubles, not merely close
            assert expected["p50"] is None or expected["p99"] < 500_000  # neither failures nor the neighbour
    assert rolled_up == set(LATENCY_SETS) - {"single row"}  # which has no answered request on a whole day
    # A single answered row, read from the ledger (today) or from its day's histogram; no row at all.
    single, whole_day = latency_sets["tenants"]["single row"], latency_sets["tenants"]["single row, a whole day"]
    assert _latency(_sources([single.pk], NOW - timedelta(hours=30), NOW, rollups=True)) == dict.fromkeys(
        PERCENTILES, 777.0
    )
    sources = _sources([whole_day.pk], NOW - timedelta(days=7), NOW, rollups=True)
    assert not sources.entries.filter(status_code=200).exists() and sources.latency.exists()
    assert _latency(sources) == dict.fromkeys(PERCENTILES, 777.0)
    empty = _sources([single.pk], NOW - timedelta(days=3), NOW - timedelta(hours=50), rollups=True)
    assert _latency(empty) == dict.fromkeys(PERCENTILES)


def test_operator_and_several_tenants_percentiles_from_rollups_equal_the_ledger(latency_sets):
    tenants = latency_sets["tenants"]
    scopes = [[t.pk for t in tenants.values()], [tenants["ties"].pk, latency_sets["neighbour"].pk], None]
    for tenant_ids in scopes:
        for length in LATENCY_WINDOWS:
            sources = _sources(tenant_ids, NOW - length, NOW, rollups=True)
            assert _latency(sources) == ledger_percentiles(tenant_ids, NOW - length, NOW), (tenant_ids, length)


def test_dashboard_latency_is_the_tenants_own(latency_sets, tenancy):
    """A tenant's dashboard counts its own answered requests only, by whichever path it reads them."""
    ties = latency_sets["tenants"]["ties"]
    for window, length in (("24h", timedelta(hours=24)), ("7d", timedelta(days=7)), ("30d", timedelta(days=30))):
        expected = {name: round(value) for name, value in ledger_percentiles([ties.pk], NOW - length, NOW).items()}
        totals = dashboard(tenant_ids=[ties.pk], spend_tenants=None, window=window, now=NOW).totals
        assert {name: totals[name] for name in PERCENTILES} == expected, window
        assert totals["p99"] <= 1000
        both = dashboard(tenant_ids=[ties.pk, latency_sets["neighbour"].pk], spend_tenants=None, window=window, now=NOW)
        assert both.totals["p99"] >= 900_000  # the neighbour's rows are there to be left out


def test_percentile_cont_over_a_histogram_is_postgresqls_own(live_db):
    """The interpolation to the last bit of the double, over random multisets with many ties."""
    rng = random.Random(18)
    fractions = [*PERCENTILES.values(), 0.0, 1.0, 0.1, 1 / 3, 0.999]
    with connection.cursor() as cursor:
        for _ in range(200):
            values = [rng.choice([rng.randint(0, 20), rng.randint(0, 120_000)]) for _ in range(rng.randint(1, 60))]
            cursor.execute(
                "SELECT percentile_cont(%s::float8[]) WITHIN GROUP (ORDER BY v) FROM unnest(%s::int[]) AS v",
                [fractions, values],
            )
            expected = cursor.fetchone()[0]
            assert [percentile_cont(Counter(values), f) for f in fractions] == expected, values
