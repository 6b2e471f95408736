"""Celery tasks of the console (beat runs publish_live every SENTINEL_LIVE_SECONDS)."""

from celery import shared_task

from sentinel.console.live import live_publish


@shared_task(ignore_result=True)
def publish_live() -> int:
    """Push each active tenant's last-minute figures to the live dashboards."""
    return len(live_publish())
