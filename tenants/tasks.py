"""Celery tasks of the tenants app: webhook deliveries, budget alerts and the audit log's retention."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

from celery import shared_task
from django.utils import timezone

from tenants.models import Budget, BudgetAlert, WebhookDelivery
from tenants.periods import period_bounds
from tenants.webhooks import MAX_ATTEMPTS, webhook_attempt, webhook_publish


class DeliveryFailed(Exception):
    pass


@shared_task(
    bind=True,
    ignore_result=True,
    autoretry_for=(DeliveryFailed,),
    retry_backoff=2,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=MAX_ATTEMPTS - 1,
)
def deliver_webhook(self, delivery_id: int) -> None:
    delivery = (
        WebhookDelivery.objects.select_related("endpoint")
        .filter(pk=delivery_id, status=WebhookDelivery.Status.PENDING)
        .first()
    )
    if delivery is None:  # delivered already, or given up
        return
    if not webhook_attempt(delivery=delivery):
        raise DeliveryFailed(delivery_id)


@shared_task(ignore_result=True)
def budget_alert(budget_id: int, period_start: str, spent_usd: str) -> None:
    """A soft threshold was crossed: record it once per budget and period, and tell the webhooks."""
    budget = Budget.objects.select_related("tenant", "key").filter(pk=budget_id).first()
    if budget is None:
        return
    _alert, created = BudgetAlert.objects.get_or_create(
        budget=budget, period_start=date.fromisoformat(period_start), defaults={"spent_usd": Decimal(spent_usd)}
    )
    if not created:
        return
    webhook_publish(
        event="budget.threshold",
        tenant_id=budget.tenant_id,
        payload={
            "tenant": budget.tenant.slug,
            "key": budget.key.prefix if budget.key_id else None,
            "team": budget.team.name if budget.team_id else None,
            "period": budget.period,
            "period_start": period_start,
            "limit_usd": str(budget.limit_usd),
            "alert_at_percent": budget.alert_at_percent,
            "spent_usd": spent_usd,
        },
    )


@shared_task(ignore_result=True)
def budget_check(budget_id: int) -> None:
    """A budget was saved: alert now if its period's settled spend is at its threshold already. The
    gateway alerts when a request settles at or past the threshold; a budget created (or lowered)
    after the spend passed it may see no such request this period (a hard budget already over its
    limit admits none)."""
    from billing.selectors import spend_in_period

    budget = Budget.objects.filter(pk=budget_id).first()
    if budget is None or budget.alert_at_percent is None:
        return
    start, end = period_bounds(budget.period, timezone.now())
    spent = spend_in_period(
        tenant_id=budget.tenant_id,
        key_id=budget.key_id,
        team_id=budget.team_id,
        start=datetime.combine(start, datetime.min.time(), UTC),
        end=end,
    )
    if spent * 100 >= budget.limit_usd * budget.alert_at_percent:
        budget_alert(budget.pk, start.isoformat(), str(spent))


@shared_task(ignore_result=True)
def prune_audit_log() -> int:
    """Beat, daily: the audit entries older than SENTINEL_AUDIT_RETENTION_DAYS go (0: kept forever)."""
    from django.conf import settings

    from tenants.audit import audit_prune

    if not settings.AUDIT_RETENTION_DAYS:
        return 0
    return audit_prune(days=settings.AUDIT_RETENTION_DAYS)
