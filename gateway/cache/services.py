"""Writes to the cache operators and tenant admins make: invalidation and pruning."""

from __future__ import annotations

import time

from django.db.models import QuerySet
from django.utils import timezone

from gateway.cache.engine import exact_redis_key
from gateway.models import CacheEntry
from sentinel import redis_keys
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


# How long a clear is remembered for the answers still in flight: longer than any request takes.
CLEARED_MEMORY_SECONDS = 86_400


def cache_invalidate_tenant(*, tenant) -> int:
    """Forget every entry of the tenant, and the answers of requests received before now that are
    still to be filed (in flight upstream, or waiting to be written): the time is set first, so a
    store either sees it or wrote its row before the entries were read for deletion."""
    sync_redis().set(redis_keys.cache_tenant_cleared(tenant.pk), repr(time.time()), ex=CLEARED_MEMORY_SECONDS)
    return cache_invalidate(entries=CacheEntry.objects.filter(tenant=tenant))


def cache_prune_expired() -> int:
    """Drop rows past their TTL (Redis expires the exact keys by itself)."""
    removed, _ = CacheEntry.objects.filter(expires_at__lte=timezone.now()).delete()
    return removed
