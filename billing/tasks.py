"""Celery tasks of the billing app (beat runs them)."""

from celery import shared_task

from billing import ledger, partitions, services


@shared_task(ignore_result=True)
def drain_ledger() -> int:
    """Move queued ledger records to Postgres (every second)."""
    return ledger.drain()


@shared_task(ignore_result=True)
def roll_up_spend() -> int:
    """Fold new ledger rows into the daily rollups (every minute)."""
    return services.spend_roll_up()


@shared_task(ignore_result=True)
def ensure_ledger_partitions() -> list[str]:
    """Make the ledger's partitions for this month and the next ones where missing (daily)."""
    return partitions.ensure_partitions()
