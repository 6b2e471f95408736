"""Per-partition HNSW indexes of the semantic cache (gateway/cache/indexes.py): a large partition gets
its own index and its lookups use it; a small one is searched exactly; a shrunk partition loses its
index; an index left invalid is built again; nothing but a digest ever reaches the SQL."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.conf import settings
from django.db import connection

from gateway.cache import indexes
from gateway.cache.indexes import index_name, index_partitions
from gateway.tasks import index_cache_partitions

# The lookup exactly as gateway/cache's semantic tier sends it.
LOOKUP = (
    "select id, prompt, answer, cost_usd, embedding, 1 - (static_embedding <=> %s::vector) as similarity "
    "from gateway_cacheentry where partition = %s and expires_at > now() "
    "and static_embedding is not null order by static_embedding <=> %s::vector limit 8"
)
DIMENSION = 256  # the static first stage's vectors (gateway/cache/static.py), which lookups search


def digest(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def fill(tenant, partition: str, vectors: np.ndarray) -> list[int]:
    expires = datetime.now(UTC) + timedelta(days=1)
    with connection.cursor() as cursor:
        ids = []
        for vector in vectors:
            cursor.execute(
                "insert into gateway_cacheentry (tenant_id, partition, exact_digest, model, prompt, "
                "static_embedding, answer, cost_usd, created_at, expires_at, hits) "
                "values (%s, %s, %s, 'm', 'p', %s::vector, '{}', 0, now(), %s, 0) returning id",
                [tenant.pk, partition, digest(str(vector[:4])), "[" + ",".join(map(str, vector)) + "]", expires],
            )
            ids.append(cursor.fetchone()[0])
    return ids


def ours(names) -> set[str]:
    return {name for name in names if name in OURS}


OURS: set[str] = set()


def plan(partition: str, vector: np.ndarray) -> str:
    text = "[" + ",".join(map(str, vector)) + "]"
    with connection.cursor() as cursor:
        cursor.execute("set plan_cache_mode = force_custom_plan")
        cursor.execute("set hnsw.iterative_scan = relaxed_order")
        cursor.execute("explain " + LOOKUP, [text, partition, text])
        return "\n".join(row[0] for row in cursor.fetchall())


def nearest(partition: str, vector: np.ndarray) -> int:
    text = "[" + ",".join(map(str, vector)) + "]"
    with connection.cursor() as cursor:
        cursor.execute("set hnsw.iterative_scan = relaxed_order")
        cursor.execute(f"set hnsw.ef_search = {settings.CACHE_EF_SEARCH}")
        cursor.execute(LOOKUP, [text, partition, text])
        return cursor.fetchone()[0]


@pytest.fixture
def partitions(tenant):
    big, small = digest(f"{tenant.pk}-big"), digest(f"{tenant.pk}-small")
    OURS.update({index_name(big), index_name(small)})
    yield big, small
    with connection.cursor() as cursor:
        for name in (index_name(big), index_name(small)):
            cursor.execute(f"drop index if exists {name}")
        cursor.execute("delete from gateway_cacheentry where partition in (%s, %s)", [big, small])


def test_a_large_partition_gets_its_own_index_and_its_lookups_use_it(tenant, partitions):
    big, small = partitions
    rng = np.random.default_rng(7)
    big_vectors = unit(rng.normal(size=(2000, DIMENSION)).astype(np.float32))
    big_ids = fill(tenant, big, big_vectors)
    fill(tenant, small, unit(rng.normal(size=(50, DIMENSION)).astype(np.float32)))
    with connection.cursor() as cursor:
        cursor.execute("analyze gateway_cacheentry")

    outcome = index_partitions(rows=1000)

    assert ours(outcome.created) == {index_name(big)} and ours(outcome.dropped) == set()
    with connection.cursor() as cursor:
        cursor.execute("select indexdef from pg_indexes where indexname = %s", [index_name(big)])
        (definition,) = cursor.fetchone()
    assert "USING hnsw (static_embedding vector_cosine_ops)" in definition
    assert f"WHERE ((partition)::text = '{big}'::text)" in definition
    # The planner takes the partition's own index for it, and the btree (exact search) for the other.
    probe = unit(big_vectors[:1] + 0.01 * rng.normal(size=(1, DIMENSION)).astype(np.float32))[0]
    assert index_name(big) in plan(big, probe)
    assert "cache_hnsw_p" not in plan(small, probe) and "gateway_cacheentry_partition" in plan(small, probe)
    # And finds the true nearest entry: 20 near-copies of stored entries, each found.
    for row in range(20):
        query = unit(big_vectors[row : row + 1] + 0.02 * rng.normal(size=(1, DIMENSION)).astype(np.float32))[0]
        assert nearest(big, query) == big_ids[row]

    # A second run changes nothing.
    again = index_partitions(rows=1000)
    assert ours(again.created) == set() and ours(again.dropped) == set()


def test_a_shrunk_partition_loses_its_index_below_half_the_threshold(tenant, partitions):
    big, _ = partitions
    rng = np.random.default_rng(8)
    ids = fill(tenant, big, unit(rng.normal(size=(120, DIMENSION)).astype(np.float32)))
    assert ours(index_partitions(rows=100).created) == {index_name(big)}

    with connection.cursor() as cursor:  # 70 left: under the threshold, over half of it; kept
        cursor.execute("delete from gateway_cacheentry where id = any(%s)", [ids[:50]])
    kept = index_partitions(rows=100)
    assert ours(kept.dropped) == set() and ours(kept.created) == set()
    assert ours(indexes.partition_indexes(connection.cursor())) == {index_name(big)}

    with connection.cursor() as cursor:  # 40 left: dropped
        cursor.execute("delete from gateway_cacheentry where id = any(%s)", [ids[50:80]])
    shrunk = index_partitions(rows=100)
    assert ours(shrunk.dropped) == {index_name(big)} and ours(shrunk.created) == set()
    assert ours(indexes.partition_indexes(connection.cursor())) == set()


def test_an_index_left_invalid_is_built_again(tenant, partitions):
    big, _ = partitions
    rng = np.random.default_rng(9)
    fill(tenant, big, unit(rng.normal(size=(30, DIMENSION)).astype(np.float32)))
    # What an interrupted concurrent build leaves: an invalid index under the partition's name.
    with connection.cursor() as cursor, pytest.raises(Exception, match="could not create unique index"):
        cursor.execute(
            f"create unique index concurrently {index_name(big)} on gateway_cacheentry (tenant_id) "
            f"where partition = '{big}'"
        )
    assert indexes.partition_indexes(connection.cursor())[index_name(big)] is False

    outcome = index_partitions(rows=20)

    assert ours(outcome.dropped) == {index_name(big)} and ours(outcome.created) == {index_name(big)}
    assert indexes.partition_indexes(connection.cursor())[index_name(big)] is True
    with connection.cursor() as cursor:
        cursor.execute("select indexdef from pg_indexes where indexname = %s", [index_name(big)])
        assert "USING hnsw" in cursor.fetchone()[0]


def test_only_a_digest_reaches_the_sql():
    for bad in ("x' or '1'='1", "A" * 64, digest("a")[:63], digest("a") + "'"):
        with pytest.raises(ValueError, match="not a partition digest"):
            indexes.create_index_sql(bad)


def test_beat_runs_it(live_db):
    entry = settings.CELERY_BEAT_SCHEDULE["index-cache-partitions"]
    assert entry["task"] == "gateway.tasks.index_cache_partitions" and entry["schedule"] == 120.0
    assert set(index_cache_partitions()) == {"created", "dropped", "indexed"}
