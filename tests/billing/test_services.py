"""Price versions (history is never rewritten) and the rollup job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from billing import prices
from billing.models import DailyLatency, DailyRollup, LedgerEntry, Price, RollupDue
from billing.services import ROLLUP_LOCK_ID, price_change, price_create, spend_roll_up
from sentinel.localstate import GENERATION_KEY
from sentinel.redis_clients import sync_redis
from tests.billing.conftest import DAYS, drain_all, hand_off_all, record
from tests.billing.test_ledger import rollups_match_ledger
from tests.conftest import unique
from tests.servers import database_url_for


def used_price(tenant, **fields) -> Price:
    """A price some ledger row was billed at."""
    price = Price.objects.create(
        model=fields.pop("model", unique("used")),
        input_per_token=Decimal("0.000001"),
        output_per_token=Decimal("0.000002"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
    )
    hand_off_all([record(tenant, price_id=price.pk, at=datetime(2026, 2, 1, tzinfo=UTC), **fields)])
    drain_all()
    return price


def snapshot(price: Price) -> tuple:
    price.refresh_from_db()
    return (price.model, price.input_per_token, price.output_per_token, price.effective_from)


def test_changing_a_used_price_makes_a_new_version(empty_queue, tenant):
    old = used_price(tenant)
    before = snapshot(old)
    generation = int(sync_redis().get(GENERATION_KEY) or 0)

    new = price_change(
        price=old,
        model=old.model,
        input_per_token=Decimal("0.000003"),
        output_per_token=Decimal("0.000004"),
        effective_from=old.effective_from,
    )

    assert new.pk != old.pk
    assert snapshot(old) == before  # history untouched
    assert (new.model, new.input_per_token, new.output_per_token) == (
        old.model,
        Decimal("0.000003"),
        Decimal("0.000004"),
    )
    assert timezone.now() - new.effective_from < timedelta(seconds=5)
    assert int(sync_redis().get(GENERATION_KEY)) == generation + 1  # every gateway re-reads prices
    assert prices.price_at(f"openai/{old.model}").id == new.pk
    assert prices.price_at(f"openai/{old.model}", datetime(2026, 2, 1, tzinfo=UTC)).id == old.pk


def test_changing_an_unused_price_edits_it_in_place(live_db):
    price = price_create(model=unique("fresh"), input_per_token=Decimal("0.1"), output_per_token=Decimal("0.2"))
    changed = price_change(
        price=price,
        model=price.model,
        input_per_token=Decimal("0.3"),
        output_per_token=Decimal("0.4"),
        effective_from=price.effective_from,
    )
    assert changed.pk == price.pk
    assert Price.objects.filter(model=price.model).count() == 1
    assert snapshot(price)[1:3] == (Decimal("0.3"), Decimal("0.4"))


def test_a_price_cannot_take_effect_before_requests_already_billed(empty_queue, tenant):
    old = used_price(tenant)
    versions = Price.objects.filter(model=old.model).count()
    with pytest.raises(ValidationError, match="already billed"):
        price_create(
            model=old.model,
            input_per_token=Decimal("1"),
            output_per_token=Decimal("1"),
            effective_from=datetime(2026, 1, 15, tzinfo=UTC),
        )
    with pytest.raises(ValidationError, match="already billed"):
        price_change(
            price=old,
            model=old.model,
            input_per_token=Decimal("1"),
            output_per_token=Decimal("1"),
            effective_from=datetime(2026, 1, 31, tzinfo=UTC),
        )
    assert Price.objects.filter(model=old.model).count() == versions
    # After the last billed request, or in the future, it can.
    later = price_create(
        model=old.model,
        input_per_token=Decimal("1"),
        output_per_token=Decimal("1"),
        effective_from=datetime(2026, 2, 1, 0, 0, 1, tzinfo=UTC),
    )
    assert later.pk


def test_price_cache_is_dropped_when_any_process_announces_a_change(live_db):
    """The gateway keeps prices in memory; a change elsewhere reaches it through the generation."""
    from sentinel.localstate import observe_generation

    model = unique("cached")
    first = Price.objects.create(model=model, input_per_token=1, output_per_token=1)
    assert prices.price_at(model).id == first.pk
    second = Price.objects.create(model=model, input_per_token=2, output_per_token=2)  # behind the cache's back
    assert prices.price_at(model).id == first.pk
    observe_generation(b"seen")
    observe_generation(b"changed elsewhere")
    assert prices.price_at(model).id == second.pk


# --- rollups -----------------------------------------------------------------------------------


def test_rollups_count_cache_hits_and_saved_cost(empty_queue, tenant):
    day = datetime(2026, 4, 1, 9, tzinfo=UTC)
    hand_off_all(
        [
            record(tenant, at=day, cache_tier="miss", cost="0.0100000001"),
            record(tenant, at=day, cache_tier="hit-exact", cost="0", saved_cost_usd="0.0200000002"),
            record(tenant, at=day, cache_tier="hit-exact", cost="0", saved_cost_usd="0.0300000003"),
            record(tenant, at=day, cache_tier="hit-semantic", cost="0", saved_cost_usd="0.0400000004"),
            record(tenant, at=day, cache_tier="bypass", cost="0.05", status=503),
        ]
    )
    drain_all()
    assert spend_roll_up() >= 1

    (rollup,) = DailyRollup.objects.filter(tenant=tenant)
    assert (rollup.day, rollup.model, rollup.key_id, rollup.price_id) == (day.date(), "gpt-4o-mini", None, None)
    assert (rollup.requests, rollup.successful_requests, rollup.exact_hits, rollup.semantic_hits) == (5, 4, 2, 1)
    assert rollup.saved_cost_usd == Decimal("0.0900000009")
    assert rollup.cost_usd == Decimal("0.0600000001")
    assert (rollup.prompt_tokens, rollup.completion_tokens) == (55, 200)
    assert not RollupDue.objects.filter(tenant=tenant).exists()


def test_rollup_counts_each_answered_latency_of_the_day_once(empty_queue, tenant, make_tenant):
    """DailyLatency: a tenant's day of answered requests by latency_ms, distinct values ascending with
    their counts; failures and other tenants and days left out; a day rolled up again is replaced."""
    day = datetime(2026, 4, 2, tzinfo=UTC)
    other = make_tenant()
    latencies = [250, 7, 250, 1000, 7, 250, 0, 31_000]
    hand_off_all(
        [
            *(record(tenant, at=day + timedelta(hours=i), latency_ms=ms) for i, ms in enumerate(latencies)),
            record(tenant, at=day + timedelta(hours=23, minutes=59), latency_ms=8, status=503),
            record(tenant, at=day + timedelta(hours=23, minutes=59), latency_ms=9, status=429),
            record(tenant, at=day + timedelta(days=1), latency_ms=5),
            record(other, at=day, latency_ms=6),
        ]
    )
    drain_all()
    while spend_roll_up():
        pass

    def histogram() -> list[tuple]:
        return list(DailyLatency.objects.filter(tenant=tenant, day=day.date()).values_list("latencies", "counts"))

    assert histogram() == [([0, 7, 250, 1000, 31_000], [1, 2, 3, 1, 1])]
    RollupDue.objects.create(tenant=tenant, day=day.date())
    assert spend_roll_up() == 1
    assert histogram() == [([0, 7, 250, 1000, 31_000], [1, 2, 3, 1, 1])]  # replaced, not added to
    hand_off_all([record(tenant, at=day + timedelta(hours=12), latency_ms=7)])
    drain_all()
    assert spend_roll_up() == 1
    assert histogram() == [([0, 7, 250, 1000, 31_000], [1, 3, 3, 1, 1])]
    assert DailyLatency.objects.get(tenant=other, day=day.date()).counts == [1]


def test_rollup_recomputes_only_days_with_new_rows(spend_data):
    a = spend_data.tenancy.tenant
    spend_roll_up()
    rollups_match_ledger(a)
    computed = dict(DailyRollup.objects.filter(tenant=a).values_list("id", "computed_at"))
    assert spend_roll_up() == 0  # nothing new

    late = datetime.combine(DAYS[0], datetime.min.time(), tzinfo=UTC) + timedelta(hours=3)
    hand_off_all([record(a, key=spend_data.keys_a[0], at=late, model="fast", cost="0.7")])
    drain_all()
    assert set(RollupDue.objects.filter(tenant=a).values_list("day", flat=True)) == {DAYS[0]}
    assert spend_roll_up() == 1

    rollups_match_ledger(a)
    unchanged = DailyRollup.objects.filter(tenant=a, day__in=DAYS[1:])
    assert all(computed[r.id] == r.computed_at for r in unchanged)  # other days untouched


def test_rollup_runs_one_at_a_time(spend_data, test_database_name):
    a = spend_data.tenancy.tenant
    markers = RollupDue.objects.filter(tenant=a).count()
    with psycopg.connect(database_url_for(test_database_name)) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [ROLLUP_LOCK_ID])
        assert spend_roll_up() == 0
        other.execute("SELECT pg_advisory_unlock(%s)", [ROLLUP_LOCK_ID])
    assert RollupDue.objects.filter(tenant=a).count() == markers  # nothing taken
    assert not DailyRollup.objects.filter(tenant=a).exists()
    assert spend_roll_up() >= len(DAYS)
    assert LedgerEntry.objects.filter(tenant=a).count() == sum(
        DailyRollup.objects.filter(tenant=a).values_list("requests", flat=True)
    )
