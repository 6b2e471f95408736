"""The cache engine in process (gateway/cache/engine.py), against the real PostgreSQL and Valkey: what
happens to answers stored without an embedding when their partition is asked again."""

from __future__ import annotations

import asyncio
from decimal import Decimal

from gateway.cache import engine
from gateway.cache.keys import cache_key
from gateway.models import CacheEntry


def test_deferred_entries_beyond_what_a_lookup_embeds_are_embedded_in_the_background(tenant, live_db, embedding_model):
    """Seven answers filed at once in a new partition (none had anything to find, so none was
    embedded): the next lookup embeds a few itself and the rest in the background, and afterwards
    every entry has its vector."""

    def key(prompt: str):
        body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
        return cache_key(tenant_id=tenant.pk, namespace="deferred", model_identity=("m",), body=body)

    async def store_seven() -> None:
        engine.shared_embedder()
        try:
            for i in range(7):
                await engine.store(
                    key(f"Question {i} about llamas"),
                    tenant_id=tenant.pk,
                    model="m",
                    answer={"content": f"answer {i}", "finish_reason": "stop", "usage": {}, "model": "m"},
                    cost_usd=Decimal("0.001"),
                    ttl=3600,
                    max_entries=1000,
                    semantic=True,
                )
        finally:
            await engine.close_pool()

    async def look_up() -> None:
        try:
            found = await engine.lookup(
                key("Tell me about alpacas"), tenant_id=tenant.pk, semantic=True, threshold=None
            )
            assert found.hit is None and found.embedding is not None
            await asyncio.gather(*engine._backfills)
        finally:
            await engine.close_pool()

    partition = key("any").partition

    def pending() -> int:
        return CacheEntry.objects.filter(partition=partition, embedding__isnull=True).count()

    asyncio.run(store_seven())
    assert pending() == 7
    asyncio.run(look_up())
    assert pending() == 0
    assert CacheEntry.objects.filter(partition=partition).count() == 7


def test_a_cold_partition_probes_less_often_the_longer_nothing_is_served(settings):
    """16 from the threshold, 32 from four times it, 64 from sixteen times it and beyond; 1 (every
    lookup) while warm; never with the threshold at 0."""
    settings.CACHE_COLD_AFTER, settings.CACHE_COLD_PROBE = 256, 16
    every = {misses: engine.Partition(1, misses).probe_every for misses in (0, 255, 256, 1023, 1024, 4095, 4096, 10**9)}
    assert every == {0: 1, 255: 1, 256: 16, 1023: 16, 1024: 32, 4095: 32, 4096: 64, 10**9: 64}
    settings.CACHE_COLD_AFTER = 0
    assert (engine.Partition(1, 10**9).cold, engine.Partition(1, 10**9).probe_every) == (False, 1)
