"""Celery tasks of the gateway app."""

from celery import shared_task

from gateway.cache.services import cache_prune_expired


@shared_task(ignore_result=True)
def prune_cache() -> int:
    """Remove expired cache entries (beat runs this every few minutes)."""
    return cache_prune_expired()
