"""Reads of spend."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import Sum

from billing.models import LedgerEntry


def spend_in_period(*, tenant_id: int, key_id: int | None = None, start: datetime, end: datetime) -> Decimal:
    """Settled spend of a tenant (or one of its keys) in [start, end), from the ledger."""
    rows = LedgerEntry.objects.filter(tenant_id=tenant_id, created_at__gte=start, created_at__lt=end)
    if key_id is not None:
        rows = rows.filter(key_id=key_id)
    return rows.aggregate(total=Sum("cost_usd"))["total"] or Decimal(0)
