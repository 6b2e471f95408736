"""Live figures for the console's dashboards, pushed over Channels.

The request path publishes nothing (a channel-layer send per request would cost a Redis round trip
each): beat runs `live_publish` every SENTINEL_LIVE_SECONDS, which reads the ledger's last minute
once for all tenants and sends each active tenant's summary to its group ("tenant-<id>") and all of
them to the operators' group. The consumer (console.consumers) forwards each summary to the sockets
allowed to see it, without money for members whose role does not include spend.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from billing.models import LedgerEntry
from billing.money import ZERO, format_usd
from sentinel.console.selectors import deployment_latency, tenant_spend, tidy, traffic_totals
from tenants.models import Tenant

WINDOW = timedelta(seconds=60)
OPERATORS_GROUP = "operators"
MONEY_FIELDS = frozenset({"cost_usd", "saved_usd", "spend_today_usd"})


def tenant_group(tenant_id: int) -> str:
    return f"tenant-{tenant_id}"


def tenant_summaries(*, now: datetime | None = None) -> list[dict]:
    """One summary per tenant with requests in the last minute, or in the minute before (its figures
    drop to zero once, rather than stay frozen on its last busy minute)."""
    now = now or timezone.now()
    since = now - WINDOW
    recent = LedgerEntry.objects.filter(created_at__gte=now - 2 * WINDOW, created_at__lt=now)
    active = set(recent.values_list("tenant_id", flat=True).distinct().order_by())
    if not active:
        return []
    rows = {
        row["tenant_id"]: row
        for row in recent.filter(created_at__gte=since).order_by().values("tenant_id").annotate(**traffic_totals())
    }
    tenants = Tenant.objects.in_bulk(active)
    spend = {line.tenant.pk: line.today for line in tenant_spend(tenants=list(tenants.values()), now=now)}
    summaries = []
    for tenant_id in sorted(active):
        row = tidy(
            rows.get(
                tenant_id,
                {"requests": 0, "errors": 0, "server_errors": 0, "exact_hits": 0, "semantic_hits": 0, "misses": 0},
            )
        )
        summaries.append(
            {
                "type": "tenant.summary",
                "tenant": tenants[tenant_id].slug,
                "tenant_id": tenant_id,
                "at": now.isoformat(),
                "window_seconds": int(WINDOW.total_seconds()),
                "requests": row["requests"],
                "errors": row["errors"],
                "server_errors": row["server_errors"],
                "exact_hits": row["exact_hits"],
                "semantic_hits": row["semantic_hits"],
                "misses": row["misses"],
                "p50_ms": row.get("p50"),
                "p95_ms": row.get("p95"),
                "p99_ms": row.get("p99"),
                "cost_usd": format_usd(row["cost_usd"]),
                "saved_usd": format_usd(row["saved_usd"]),
                "spend_today_usd": format_usd(spend.get(tenant_id, ZERO)),
            }
        )
    return summaries


def without_money(summary: dict) -> dict:
    return {name: value for name, value in summary.items() if name not in MONEY_FIELDS}


def live_publish(*, now: datetime | None = None) -> list[dict]:
    """Send the current summaries to their tenants' groups and to the operators, and the deployments'
    latency to the operators (the circuits page) while any was answered lately; returns the summaries."""
    summaries = tenant_summaries(now=now)
    latencies = deployment_latency(now=now)
    if summaries or latencies:
        async_to_sync(_send)(summaries, latencies)
    return summaries


async def _send(summaries: list[dict], latencies: dict[str, str]) -> None:
    layer = get_channel_layer()
    for summary in summaries:
        await layer.group_send(tenant_group(summary["tenant_id"]), {"type": "tenant.summary", "summary": summary})
    if summaries:
        await layer.group_send(OPERATORS_GROUP, {"type": "tenant.summaries", "summaries": summaries})
    if latencies:
        await layer.group_send(OPERATORS_GROUP, {"type": "circuit.latency", "latencies": latencies})
