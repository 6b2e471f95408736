"""Helpers for billing tests: ledger records handed off through the real Redis stream and drained
into Postgres the way workers do it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal

import pytest

from billing.ledger import STREAM, LedgerRecord, drain, pending_count
from billing.models import Price
from sentinel.redis_clients import sync_redis
from tenants.models import VirtualKey
from tests.conftest import unique


def hand_off_all(records: list[LedgerRecord]) -> None:
    """Queue the records in the ledger's stream exactly as `billing.ledger.hand_off` does (one XADD
    each), through the sync client: the request path's client gives up on a Redis silent for 100 ms
    and writes straight to Postgres, which on a loaded machine took some of a test's records past
    the stream it meant to fill (tests/billing/test_ledger.py counts what the stream holds).
    `hand_off` itself, fallback included, has its own tests."""
    with sync_redis().pipeline(transaction=False) as pipe:
        for record in records:
            pipe.xadd(STREAM, {"r": record.encode()})
        pipe.execute()


def drain_all() -> None:
    """Drain until nothing is queued (records a dead consumer holds are not this process's to take)."""
    while drain():
        pass


def record(
    tenant,
    *,
    key: VirtualKey | None = None,
    at: datetime | None = None,
    model: str = "gpt-4o-mini",
    cost: str = "0.0000123456",
    price_id: int | None = None,
    status: int = 200,
    **fields,
) -> LedgerRecord:
    extra = {"created_at": at.timestamp()} if at is not None else {}
    return LedgerRecord(
        request_id=fields.pop("request_id", "req_test"),
        tenant_id=tenant.pk,
        key_id=key.pk if key else None,
        model_requested=model,
        status_code=status,
        cost_usd=str(Decimal(cost)),
        price_id=price_id,
        prompt_tokens=fields.pop("prompt_tokens", 11),
        completion_tokens=fields.pop("completion_tokens", 40),
        **extra,
        **fields,
    )


@pytest.fixture
def make_virtual_key(make_key) -> Callable[..., VirtualKey]:
    def make(tenant, **fields) -> VirtualKey:
        make_key(tenant, **fields)
        return VirtualKey.objects.filter(tenant=tenant).order_by("-id").first()

    return make


@pytest.fixture
def empty_queue(live_db):
    """Start from an empty ledger queue, so a batch holds this test's records only."""
    drain_all()
    assert pending_count() == 0


DAYS = [date(2026, 3, 1), date(2026, 3, 2), date(2026, 3, 3)]
HOURS = [0, 11, 23]


@dataclass
class SpendData:
    """Ledger rows over DAYS for tenant A (two keys, and rows without a key) and tenant B, two
    models, a price that changes at noon on the second day, some cache hits."""

    tenancy: object
    keys_a: list
    key_b: object
    old_price: Price
    new_price: Price
    records: list[LedgerRecord]


def varied_cost(i: int) -> str:
    return f"0.{(i * 7_919_993) % 10**10:010d}"


@pytest.fixture
def spend_data(tenancy, make_virtual_key, empty_queue) -> SpendData:
    a, b = tenancy.tenant, tenancy.other
    keys_a = [make_virtual_key(a), make_virtual_key(a)]
    key_b = make_virtual_key(b)
    model = unique("priced")
    old = Price.objects.create(
        model=model,
        input_per_token=Decimal("0.000001"),
        output_per_token=Decimal("0.000002"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
    )
    new = Price.objects.create(
        model=model,
        input_per_token=Decimal("0.0000015"),
        output_per_token=Decimal("0.0000025"),
        effective_from=datetime(2026, 3, 2, 12, tzinfo=UTC),
    )
    tiers = ["miss", "miss", "hit-exact", "hit-semantic", "bypass"]
    records, i = [], 0
    for day in DAYS:
        for hour in HOURS:
            at = datetime.combine(day, time(hour, 30), tzinfo=UTC)
            price = new if at >= new.effective_from else old
            for tenant, key in [(a, keys_a[0]), (a, keys_a[1]), (a, None), (b, key_b)]:
                for alias in ("fast", "smart"):
                    i += 1
                    tier = tiers[i % len(tiers)]
                    hit = tier.startswith("hit")
                    records.append(
                        record(
                            tenant,
                            key=key,
                            at=at,
                            model=alias,
                            price_id=None if hit else price.pk,
                            cost="0" if hit else varied_cost(i),
                            cache_tier=tier,
                            saved_cost_usd=varied_cost(i + 1) if hit else "0",
                            status=200 if i % 7 else 503,
                            prompt_tokens=i,
                            completion_tokens=2 * i,
                            # Of them, cached and reasoning tokens and their part of the cost.
                            cache_read_tokens=i // 2,
                            cache_write_tokens=i // 3,
                            reasoning_tokens=i % 5,
                            cache_read_cost_usd="0" if hit else varied_cost(i + 2)[:6],
                            cache_write_cost_usd="0" if hit else varied_cost(i + 3)[:6],
                            reasoning_cost_usd="0" if hit else varied_cost(i + 4)[:6],
                            images=0 if hit else i % 3,  # as if an image model too
                            request_id=f"spend-{i}",
                        )
                    )
    hand_off_all(records)
    drain_all()
    return SpendData(tenancy=tenancy, keys_a=keys_a, key_b=key_b, old_price=old, new_price=new, records=records)
