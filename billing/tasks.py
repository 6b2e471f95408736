"""Celery tasks of the billing app."""

from celery import shared_task

from billing import ledger


@shared_task(ignore_result=True)
def drain_ledger() -> int:
    """Move queued ledger records to Postgres (beat runs this every second)."""
    return ledger.drain()
