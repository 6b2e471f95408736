"""Celery tasks of the knowledge bases (queued by name: gateway.knowledge.services.INGEST_FILE)."""

from celery import shared_task

from gateway.knowledge import services


@shared_task(ignore_result=True, acks_late=True)
def ingest_file(entry_id: int) -> None:
    """Read, chunk and embed one file of a vector store."""
    services.ingest(entry_id)
