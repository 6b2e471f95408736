"""Writes to the cache operators and tenant admins make: invalidation and pruning."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from gateway.cache.engine import exact_redis_key
from gateway.models import CacheEntry
from sentinel.localstate import announce_change
from sentinel.redis_clients import sync_redis


def cache_invalidate(*, entries: QuerySet[CacheEntry]) -> int:
    """Forget these entries everywhere: rows, exact keys in Redis, and (through the configuration
    generation) every gateway process's in-memory copy. Returns how many were removed."""
    digests = list(entries.values_list("exact_digest", "partition"))
    removed, _ = entries.delete()
    if digests:
        # On a cluster the keys are in many slots: the cluster client deletes them slot by slot.
        sync_redis().delete(*(exact_redis_key(digest, partition) for digest, partition in digests))
    announce_change()
    return removed


def cache_invalidate_tenant(*, tenant) -> int:
    return cache_invalidate(entries=CacheEntry.objects.filter(tenant=tenant))


def cache_prune_expired() -> int:
    """Drop rows past their TTL (Redis expires the exact keys by itself)."""
    removed, _ = CacheEntry.objects.filter(expires_at__lte=timezone.now()).delete()
    return removed
