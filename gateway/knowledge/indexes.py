"""HNSW indexes per large vector store, kept by beat as the semantic cache's partitions are
(gateway.cache.indexes, whose reasoning holds here: one index over every tenant's chunks makes a
store's search discard almost all it walks).

A store under SENTINEL_KNOWLEDGE_INDEX_ROWS chunks is searched exactly (its btree finds its rows and
every distance is computed); a larger one gets a partial HNSW index `WHERE store_id = <id>`, which
the planner uses for that store's searches (Django sends the id as a literal, so each search is
planned with it). Built and dropped CONCURRENTLY; one run at a time.
"""

from __future__ import annotations

from django.conf import settings

from gateway.cache.indexes import Outcome, index_partitions

TABLE = "gateway_chunk"
PREFIX = "chunk_hnsw_s"
_LOCK = 0x5E17_C4B5  # pg_advisory_lock key, not the cache's


def index_stores(*, rows: int | None = None, concurrently: bool = True) -> Outcome:
    return index_partitions(
        rows=rows if rows is not None else settings.KNOWLEDGE_INDEX_ROWS,
        table=TABLE,
        prefix=PREFIX,
        column="store_id",
        vector="embedding",
        lock=_LOCK,
        concurrently=concurrently,
    )
