"""Writes to billing: price versions (history is never rewritten) and the daily spend rollups."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from datetime import date, datetime
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from billing import prices
from billing.models import (
    DailyLatency,
    DailyRollup,
    DailyTraffic,
    DailyUserTraffic,
    LedgerArchive,
    LedgerEntry,
    Price,
    RollupDue,
)
from billing.selectors import ANSWERED, LEDGER_TRAFFIC, TRAFFIC_MONEY, day_bounds, ledger_totals
from sentinel.localstate import announce_change

logger = logging.getLogger(__name__)

# pg advisory lock id: one rollup job at a time (two would delete each other's fresh rows).
ROLLUP_LOCK_ID = 0x5E_B111
# Markers folded per run, at most; a backlog is worked off over several runs.
ROLLUP_MARKERS_PER_RUN = 100_000


def price_validate_effective_from(*, model: str, effective_from: datetime) -> None:
    """A ledger row's price is the version in force when it was created. A version that took
    effect before rows already billed at another version would contradict them, so it is refused."""
    latest = (
        LedgerEntry.objects.filter(price__model=model, created_at__gte=effective_from)
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    if latest is not None:
        raise ValidationError(
            f"Requests to {model} were already billed at {latest:%Y-%m-%d %H:%M:%S} UTC at another price; "
            "a new price can only take effect after that.",
            code="price_history",
        )
    if Price.objects.filter(model=model, effective_from=effective_from).exists():
        raise ValidationError(f"{model} already has a price taking effect at that moment.", code="price_exists")


def _announce() -> None:
    """Every gateway process re-reads prices on its next request; this one at once."""
    transaction.on_commit(prices.clear_cache)
    announce_change()


@transaction.atomic
def price_create(
    *,
    model: str,
    input_per_token: Decimal,
    output_per_token: Decimal,
    effective_from: datetime | None = None,
    source: str = "manual",
    kind_prices: Mapping[str, Decimal | None] | None = None,
) -> Price:
    """A new price version for `model`, in force from `effective_from` (now by default), with the
    other kinds' prices (`kind_prices`, by column: prices.KIND_COLUMNS) where given."""
    effective_from = effective_from or timezone.now()
    price_validate_effective_from(model=model, effective_from=effective_from)
    price = Price.objects.create(
        model=model,
        input_per_token=input_per_token,
        output_per_token=output_per_token,
        effective_from=effective_from,
        source=source,
        **_kinds(kind_prices),
    )
    _announce()
    return price


def _kinds(kind_prices: Mapping[str, Decimal | None] | None) -> dict[str, Decimal | None]:
    """Every kind's column: the given price, else none (the kind falls back)."""
    kind_prices = kind_prices or {}
    unknown = set(kind_prices) - set(prices.KIND_COLUMNS)
    if unknown:
        raise ValueError(f"not kinds of price: {', '.join(sorted(unknown))}")
    return {column: kind_prices.get(column) for column in prices.KIND_COLUMNS}


def price_is_used(*, price: Price) -> bool:
    return LedgerEntry.objects.filter(price=price).exists()


@transaction.atomic
def price_change(
    *,
    price: Price,
    model: str,
    input_per_token: Decimal,
    output_per_token: Decimal,
    effective_from: datetime,
    kind_prices: Mapping[str, Decimal | None] | None = None,
) -> Price:
    """Edit a price. While no ledger row refers to it, in place; once one does, the edit becomes a
    new version (from now, unless a later moment is given) and the old one stays as it was.
    Returns the version that now holds the edit. Without `kind_prices`, the other kinds' prices
    stay as they were."""
    if kind_prices is None:
        kind_prices = {column: getattr(price, column) for column in prices.KIND_COLUMNS}
    if price_is_used(price=price):
        if effective_from == price.effective_from:
            effective_from = timezone.now()
        return price_create(
            model=model,
            input_per_token=input_per_token,
            output_per_token=output_per_token,
            effective_from=effective_from,
            source="manual",
            kind_prices=kind_prices,
        )
    if (model, effective_from) != (price.model, price.effective_from):
        price_validate_effective_from(model=model, effective_from=effective_from)
    Price.objects.filter(pk=price.pk).update(
        model=model,
        input_per_token=input_per_token,
        output_per_token=output_per_token,
        effective_from=effective_from,
        **_kinds(kind_prices),
    )
    price.refresh_from_db()
    _announce()
    return price


def spend_roll_up() -> int:
    """Recompute the rollups of every tenant's day that got ledger rows since the last run; returns
    how many tenant-days were recomputed.

    Taking the markers (DELETE ... RETURNING) and rewriting those days happen in one transaction.
    Rows committed before the DELETE are all seen by the recomputation after it; rows committed
    later come with markers the DELETE did not see, which stay for the next run.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ROLLUP_LOCK_ID])
            if not cursor.fetchone()[0]:
                return 0  # another run is at it
            table = RollupDue._meta.db_table
            cursor.execute(
                f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT %s) "  # noqa: S608
                "RETURNING tenant_id, day",
                [ROLLUP_MARKERS_PER_RUN],
            )
            due = set(cursor.fetchall())
        due = _skip_archived(due)
        tenants_by_day: dict[date, set[int]] = defaultdict(set)
        for tenant_id, day in due:
            tenants_by_day[day].add(tenant_id)
        for day, tenant_ids in sorted(tenants_by_day.items()):
            _roll_up_day(day, tenant_ids)
    return len(due)


def _skip_archived(due: set[tuple[int, date]]) -> set[tuple[int, date]]:
    """The tenant-days whose month is still in the ledger. An archived month's rollups were made
    from all its rows, now in the archive file; recomputing them from the ledger would leave only a
    row that came late (it waits in the default partition until `ledger_archive` runs again)."""
    if not due:
        return due
    archived = set(LedgerArchive.objects.values_list("month", flat=True))
    late = {pair for pair in due if pair[1].replace(day=1) in archived}
    if late:
        logger.warning(
            "rollups: %d tenant-day(s) of archived months got rows late; their rollups stay as archived "
            "(the rows wait in the ledger's default partition for the next ledger_archive)",
            len(late),
        )
    return due - late


def _roll_up_day(day: date, tenant_ids: set[int]) -> None:
    start, end = day_bounds(day)
    entries = LedgerEntry.objects.filter(tenant_id__in=tenant_ids, created_at__gte=start, created_at__lt=end)
    totals = ledger_totals(entries, ["tenant_id", "key_id", "model_requested", "price_id"])
    _roll_up_traffic(day, tenant_ids, entries.order_by())
    DailyRollup.objects.filter(day=day, tenant_id__in=tenant_ids).delete()
    now = timezone.now()
    DailyRollup.objects.bulk_create(
        [
            DailyRollup(
                day=day,
                tenant_id=row.pop("tenant_id"),
                key_id=row.pop("key_id"),
                model=row.pop("model_requested"),
                price_id=row.pop("price_id"),
                computed_at=now,
                **row,
            )
            for row in totals
        ],
        batch_size=1000,
    )


def _roll_up_traffic(day: date, tenant_ids: set[int], entries) -> None:
    """The dashboard's figures of the day (DailyTraffic, DailyUserTraffic, DailyLatency) from the same rows."""
    DailyTraffic.objects.filter(day=day, tenant_id__in=tenant_ids).delete()
    DailyTraffic.objects.bulk_create(
        [
            DailyTraffic(
                day=day,
                tenant_id=row.pop("tenant_id"),
                key_id=row.pop("key_id"),
                model=row.pop("model_requested"),
                provider=row.pop("provider"),
                **{name: value or (Decimal(0) if name in TRAFFIC_MONEY else 0) for name, value in row.items()},
            )
            for row in entries.values("tenant_id", "key_id", "model_requested", "provider").annotate(**LEDGER_TRAFFIC)
        ],
        batch_size=1000,
    )
    DailyUserTraffic.objects.filter(day=day, tenant_id__in=tenant_ids).delete()
    users = entries.exclude(end_user="").values("tenant_id", "end_user")
    DailyUserTraffic.objects.bulk_create(
        [
            DailyUserTraffic(day=day, **row)
            for row in users.annotate(
                requests=LEDGER_TRAFFIC["requests"],
                errors=LEDGER_TRAFFIC["errors"],
                cost_usd=LEDGER_TRAFFIC["cost_usd"],
            )
        ],
        batch_size=1000,
    )
    _roll_up_latency(day, tenant_ids, entries)


def _roll_up_latency(day: date, tenant_ids: set[int], entries) -> None:
    """Each tenant's answered requests of the day counted by latency_ms (DailyLatency), built in
    PostgreSQL: a busy tenant's day holds thousands of distinct latencies, none of which need to
    travel to this process."""
    DailyLatency.objects.filter(day=day, tenant_id__in=tenant_ids).delete()
    counted = entries.filter(ANSWERED).values("tenant_id", "latency_ms").annotate(requests=Count("id"))
    sql, params = counted.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {DailyLatency._meta.db_table} (day, tenant_id, latencies, counts) "  # noqa: S608
            "SELECT %s, tenant_id, array_agg(latency_ms ORDER BY latency_ms), array_agg(requests ORDER BY latency_ms) "
            f"FROM ({sql}) AS counted GROUP BY tenant_id",
            [day, *params],
        )
