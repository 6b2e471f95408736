"""Reads for the screening report: decisions and outages per tenant and check, from the ledger
(every request's row records what screening did)."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from billing.models import LedgerEntry
from tenants.models import Tenant

_TABLE = LedgerEntry._meta.db_table
_TENANTS = Tenant._meta.db_table


def _counts(field: str, *, since: datetime, tenant_ids: list[int]) -> list[tuple]:
    if not tenant_ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.slug, item->>0, item->>1, item->>2, count(*) "  # noqa: S608 - names are ours, not input
            f"FROM {_TABLE} l JOIN {_TENANTS} t ON t.id = l.tenant_id, "
            f"jsonb_array_elements(l.screening->'{field}') AS item "
            "WHERE l.screening IS NOT NULL AND l.created_at >= %s AND l.tenant_id = ANY(%s) "
            "GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4",
            [since, tenant_ids],
        )
        return cursor.fetchall()


def screening_decisions(*, since: datetime, tenant_ids: list[int]) -> list[dict]:
    """[{tenant, check, direction, action, requests}]: requests where a check fired, and what it did."""
    return [
        {"tenant": slug, "check": check, "direction": direction, "action": action, "requests": count}
        for slug, check, direction, action, count in _counts("fired", since=since, tenant_ids=tenant_ids)
    ]


def screening_outages(*, since: datetime, tenant_ids: list[int]) -> list[dict]:
    """[{tenant, check, direction, outcome, requests}]: requests a screening service failed, and
    whether they went through (open) or not (closed)."""
    return [
        {"tenant": slug, "check": check, "direction": direction, "outcome": outcome, "requests": count}
        for slug, check, direction, outcome, count in _counts("outages", since=since, tenant_ids=tenant_ids)
    ]
