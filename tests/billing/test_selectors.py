"""Settled spend for budgets and spend reports for finance: every figure equals the sum of the ledger
rows it covers, whether the days are rolled up, not yet rolled up, or some of each."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

import pytest
from django.db.models import Count, Q, Sum

from billing.models import DailyRollup, LedgerEntry, RollupDue
from billing.selectors import DIMENSIONS, ledger_entries, spend_in_period, spend_report
from billing.services import spend_roll_up
from tests.billing.conftest import DAYS, drain_all, hand_off_all, record


def ledger_sum(**filters) -> Decimal:
    return LedgerEntry.objects.filter(**filters).aggregate(s=Sum("cost_usd"))["s"] or Decimal(0)


def at(day: date, hour: int = 0, minute: int = 0) -> datetime:
    return datetime.combine(day, time(hour, minute), tzinfo=UTC)


RANGES = [
    (at(DAYS[0]), at(DAYS[2]) + timedelta(days=1)),  # all three whole days
    (at(DAYS[0], 6), at(DAYS[2], 12)),  # partial first and last day
    (at(DAYS[1]), at(DAYS[2])),  # exactly one day
    (at(DAYS[0], 23), at(DAYS[0], 23, 59)),  # inside one day
    (at(DAYS[0]) - timedelta(days=30), at(DAYS[0]) - timedelta(days=1)),  # nothing
    (at(DAYS[0], 11, 30), at(DAYS[0], 11, 30)),  # empty range
]


@pytest.mark.parametrize("state", ["not rolled up", "rolled up", "partly rolled up"])
def test_spend_in_period_is_the_ledger_sum(spend_data, state):
    a = spend_data.tenancy.tenant
    if state != "not rolled up":
        spend_roll_up()
        assert not RollupDue.objects.filter(tenant=a).exists()
    if state == "partly rolled up":  # a late record for the middle day, not rolled up yet
        hand_off_all([record(a, key=spend_data.keys_a[0], at=at(DAYS[1], 5), cost="1.2345678901")])
        drain_all()
    for start, end in RANGES:
        in_range = {"tenant": a, "created_at__gte": start, "created_at__lt": end}
        assert spend_in_period(tenant_id=a.pk, start=start, end=end) == ledger_sum(**in_range), (start, end)
        key = spend_data.keys_a[0]
        assert spend_in_period(tenant_id=a.pk, key_id=key.pk, start=start, end=end) == ledger_sum(
            **in_range, key=key
        ), (start, end)
    assert spend_in_period(tenant_id=a.pk, start=RANGES[0][0], end=RANGES[0][1]) > 0


def test_spend_in_period_reads_rollups_for_rolled_up_days(spend_data):
    """Rolled-up whole days come from the rollups (checked by making them disagree with the ledger)."""
    a = spend_data.tenancy.tenant
    spend_roll_up()
    DailyRollup.objects.filter(tenant=a, day=DAYS[1]).update(cost_usd=0)
    whole = spend_in_period(tenant_id=a.pk, start=at(DAYS[0]), end=at(DAYS[2]) + timedelta(days=1))
    assert whole == ledger_sum(tenant=a) - ledger_sum(tenant=a, created_at__gte=at(DAYS[1]), created_at__lt=at(DAYS[2]))
    # A partial day is always read from the ledger.
    assert spend_in_period(tenant_id=a.pk, start=at(DAYS[1], 1), end=at(DAYS[2])) == ledger_sum(
        tenant=a, created_at__gte=at(DAYS[1], 1), created_at__lt=at(DAYS[2])
    )


LEDGER_FILTER = {
    "day": lambda v: {"created_at__gte": at(v), "created_at__lt": at(v) + timedelta(days=1)},
    "tenant": lambda v: {"tenant": v},
    "team": lambda v: {"team": v},
    "key": lambda v: {"key": v},
    "end_user": lambda v: {"end_user": v},
    "model": lambda v: {"model_requested": v},
    "price": lambda v: {"price": v},
}


def assert_reconciles(report, tenants) -> None:
    """Each row, and the totals, equal the ledger's sums for the same filter."""
    scope = {
        "tenant__in": tenants,
        "created_at__gte": at(report.start),
        "created_at__lt": at(report.end) + timedelta(days=1),
    }
    for row in report.rows + [report.totals]:
        filters = dict(scope)
        if row is not report.totals:
            for name in report.group_by:
                filters.update(LEDGER_FILTER[name](getattr(row, name)))
        expected = LedgerEntry.objects.filter(**filters).aggregate(
            requests=Count("id"),
            successful_requests=Count("id", filter=Q(status_code=200)),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
            cost_usd=Sum("cost_usd"),
            exact_hits=Count("id", filter=Q(cache_tier="hit-exact")),
            semantic_hits=Count("id", filter=Q(cache_tier="hit-semantic")),
            saved_cost_usd=Sum("saved_cost_usd"),
            cache_read_tokens=Sum("cache_read_tokens"),
            cache_write_tokens=Sum("cache_write_tokens"),
            reasoning_tokens=Sum("reasoning_tokens"),
            cache_read_cost_usd=Sum("cache_read_cost_usd"),
            cache_write_cost_usd=Sum("cache_write_cost_usd"),
            reasoning_cost_usd=Sum("reasoning_cost_usd"),
            images=Sum("images"),
        )
        assert row.metrics == expected, (row, filters)


@pytest.mark.parametrize("state", ["not rolled up", "rolled up", "partly rolled up"])
@pytest.mark.parametrize("group_by", [list(DIMENSIONS), ["tenant", "key", "model", "day"], ["model", "price"], []])
def test_spend_report_reconciles_with_the_ledger(spend_data, state, group_by):
    a, b = spend_data.tenancy.tenant, spend_data.tenancy.other
    if state != "not rolled up":
        spend_roll_up()
    if state == "partly rolled up":
        hand_off_all([record(a, key=spend_data.keys_a[1], at=at(DAYS[2], 8), model="fast", cost="0.5")])
        drain_all()
    report = spend_report(tenants=[a, b], start=DAYS[0], end=DAYS[2], group_by=group_by)
    assert report.rows or not group_by
    assert_reconciles(report, [a, b])
    # Narrower: one tenant, one day.
    assert_reconciles(spend_report(tenants=[b], start=DAYS[1], end=DAYS[1], group_by=group_by), [b])


def test_spend_report_shows_each_price_version(spend_data):
    a = spend_data.tenancy.tenant
    report = spend_report(tenants=[a], start=DAYS[1], end=DAYS[1], group_by=["day", "price"])
    versions = [row.price for row in report.rows]
    # Cache hits are unpriced; before noon the old price, after it the new one.
    assert versions == [None, spend_data.old_price, spend_data.new_price]
    assert_reconciles(report, [a])


def test_spend_report_rows_are_labelled_and_sorted(spend_data):
    a = spend_data.tenancy.tenant
    report = spend_report(tenants=[a], start=DAYS[0], end=DAYS[0], group_by=["tenant", "key", "model"])
    assert {row.tenant for row in report.rows} == {a}
    assert [(row.key.pk if row.key else None, row.model) for row in report.rows] == [
        (None, "fast"),
        (None, "smart"),
        (spend_data.keys_a[0].pk, "fast"),
        (spend_data.keys_a[0].pk, "smart"),
        (spend_data.keys_a[1].pk, "fast"),
        (spend_data.keys_a[1].pk, "smart"),
    ]


def test_request_log_filters(spend_data):
    a = spend_data.tenancy.tenant
    everything = ledger_entries(tenant_id=a.pk)
    assert everything.count() == LedgerEntry.objects.filter(tenant=a).count()
    assert all(entry.tenant_id == a.pk for entry in everything)
    created = list(everything.values_list("created_at", flat=True))
    assert created == sorted(created, reverse=True)
    assert (
        ledger_entries(tenant_id=a.pk, start=DAYS[1], end=DAYS[1]).count()
        == LedgerEntry.objects.filter(tenant=a, created_at__gte=at(DAYS[1]), created_at__lt=at(DAYS[2])).count()
    )
    narrow = ledger_entries(tenant_id=a.pk, status=200, model="fast", cache_tier="miss", key_id=spend_data.keys_a[0].pk)
    assert narrow.exists()
    assert {(e.status_code, e.model_requested, e.cache_tier, e.key_id) for e in narrow} == {
        (200, "fast", "miss", spend_data.keys_a[0].pk)
    }
    assert not ledger_entries(tenant_id=a.pk, provider="nobody").exists()
