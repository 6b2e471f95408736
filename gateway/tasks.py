"""Celery tasks of the gateway app (batches' are in gateway.batches.tasks, registered here)."""

from celery import shared_task

from gateway.batches import tasks as batch_tasks  # noqa: F401
from gateway.cache.services import cache_prune_expired


@shared_task(ignore_result=True)
def prune_cache() -> int:
    """Remove expired cache entries (beat runs this every few minutes)."""
    return cache_prune_expired()
