"""Celery tasks of the gateway app (batches' and knowledge bases' are in their own tasks modules, registered here)."""

from celery import shared_task

from gateway.batches import tasks as batch_tasks  # noqa: F401
from gateway.cache.indexes import index_partitions
from gateway.cache.services import cache_prune_expired
from gateway.knowledge import tasks as knowledge_tasks  # noqa: F401


@shared_task(ignore_result=True)
def prune_cache() -> int:
    """Remove expired cache entries (beat runs this every few minutes)."""
    return cache_prune_expired()


@shared_task(ignore_result=True)
def prune_responses() -> int:
    """Beat, hourly: stored responses older than SENTINEL_RESPONSES_RETENTION_DAYS go (0: kept)."""
    from django.conf import settings

    from gateway.responses.store import responses_prune

    if not settings.RESPONSES_RETENTION_DAYS:
        return 0
    return responses_prune(days=settings.RESPONSES_RETENTION_DAYS)


@shared_task(ignore_result=True)
def index_cache_partitions() -> dict:
    """Give large semantic-cache partitions their own HNSW index; drop those of shrunk ones."""
    outcome = index_partitions()
    return {"created": len(outcome.created), "dropped": len(outcome.dropped), "indexed": outcome.indexed}


@shared_task(ignore_result=True)
def index_knowledge_stores() -> dict:
    """Give large vector stores their own HNSW index; drop those of shrunk ones."""
    from gateway.knowledge.indexes import index_stores

    outcome = index_stores()
    return {"created": len(outcome.created), "dropped": len(outcome.dropped), "indexed": outcome.indexed}


@shared_task(ignore_result=True)
def sample_deployment_load() -> int:
    """Read every self-hosted deployment's load and share it through Redis (beat, every few seconds)."""
    from gateway.upstream.load import sample_deployments

    return sample_deployments()
