"""Helpers for billing tests: ledger records handed off through the real Redis stream and drained
into Postgres the way workers do it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal

import pytest

from billing.ledger import LedgerRecord, drain, hand_off, pending_count
from tenants.models import VirtualKey


async def _hand_off_all(records: list[LedgerRecord]) -> None:
    # As many at once as a busy gateway process would (its Redis pool holds 512 connections).
    for start in range(0, len(records), 200):
        await asyncio.gather(*(hand_off(record) for record in records[start : start + 200]))


def hand_off_all(records: list[LedgerRecord]) -> None:
    asyncio.run(_hand_off_all(records))


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
