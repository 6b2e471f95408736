"""HNSW indexes per large cache partition, kept by beat.

A semantic lookup searches one partition (tenant + model + parameters + context + namespace). One HNSW
index over the whole table serves that badly: its graph holds every tenant's vectors, so a partition
filter discards almost every candidate it walks and iterative scans wander (p99 over 100 ms at 100k
entries in `bench cache_scale`), while without iterative scans small partitions are missed. So:

- a partition under `CACHE_PARTITION_INDEX_ROWS` entries is searched exactly: its btree finds its rows,
  every distance is computed (a few hundred 384-d distances take well under a millisecond, and the
  answer is exact);
- a partition over it gets its own partial HNSW index (`WHERE partition = '<digest>'`), which the
  planner uses for that partition only (lookups plan with their parameters' values:
  `plan_cache_mode = force_custom_plan`);
- an index whose partition has shrunk under half the threshold (eviction, expiry, invalidation) is
  dropped, and one left invalid by an interrupted build is dropped and built again.

Indexes are built and dropped CONCURRENTLY, so lookups and stores never wait for them. One beat run at a
time (an advisory lock). Embeddings are stored PLAIN (gateway migration 0007): a TOASTed vector would
cost a detoast per row in every exact scan.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection

log = logging.getLogger("sentinel.cache")

TABLE = "gateway_cacheentry"
PREFIX = "cache_hnsw_p"
_DIGEST = re.compile(r"[0-9a-f]{64}")
_LOCK = 0x5E17_CAC7  # pg_advisory_lock key: one run at a time
_PREFIX_CHARS = 40  # of the partition digest in the index name (63 characters at most)
# The column the semantic tier searches: the static first stage's vectors (gateway/cache/static.py).
VECTOR = "static_embedding"


def hnsw_method(vector: str = VECTOR) -> str:
    """How every HNSW index here is built (bench/cache_scale.py builds its comparison one alike)."""
    if vector not in ("static_embedding", "embedding"):
        raise ValueError(f"not a vector column: {vector!r}")
    return f"using hnsw ({vector} vector_cosine_ops) with (m = 16, ef_construction = 64)"


@dataclass
class Outcome:
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    indexed: int = 0  # partitions with a valid index after the run
    skipped: bool = False  # another run held the lock


def index_name(partition: str | int, *, prefix: str = PREFIX) -> str:
    return f"{prefix}_{str(partition)[:_PREFIX_CHARS]}"


def partition_indexes(cursor, *, table: str = TABLE, prefix: str = PREFIX) -> dict[str, bool]:
    """This table's partition indexes: name → valid."""
    cursor.execute(
        "select c.relname, i.indisvalid from pg_index i join pg_class c on c.oid = i.indexrelid "
        "where i.indrelid = %s::regclass and c.relname like %s",
        [table, prefix.replace("_", r"\_") + r"\_%"],
    )
    return dict(cursor.fetchall())


def create_index_sql(
    partition: str | int,
    *,
    table: str = TABLE,
    prefix: str = PREFIX,
    column: str = "partition",
    vector: str = VECTOR,
    concurrently: bool = True,
) -> str:
    # The partition goes into SQL as a literal: a digest or an integer id, never anything else.
    if type(partition) is int:
        literal = str(partition)
    elif isinstance(partition, str) and _DIGEST.fullmatch(partition):
        literal = f"'{partition}'"
    else:
        raise ValueError(f"not a partition digest or id: {partition!r}")
    return (
        f"create index {'concurrently ' if concurrently else ''}if not exists {index_name(partition, prefix=prefix)} "
        f"on {table} {hnsw_method(vector)} where {column} = {literal}"
    )


def index_partitions(
    *,
    rows: int | None = None,
    table: str = TABLE,
    prefix: str = PREFIX,
    column: str = "partition",
    vector: str = VECTOR,
    lock: int = _LOCK,
    concurrently: bool = True,
    using=None,
) -> Outcome:
    """Bring the partition indexes in line with the partitions' sizes (see the module's docstring).
    The knowledge bases' chunks are kept the same way, partitioned by store (gateway.knowledge.indexes)."""
    threshold = max(1, int(rows if rows is not None else settings.CACHE_PARTITION_INDEX_ROWS))
    conn = using or connection
    outcome = Outcome()
    with conn.cursor() as cursor:
        cursor.execute("select pg_try_advisory_lock(%s)", [lock])
        if not cursor.fetchone()[0]:
            outcome.skipped = True
            return outcome
        try:
            # An index-only scan of the partition btree; only partitions that matter either way.
            cursor.execute(
                f"select {column}, count(*) from {table} where {vector} is not null "  # noqa: S608 - our table
                f"group by {column} having count(*) >= %s",
                [max(1, threshold // 2)],
            )
            sizes = dict(cursor.fetchall())
            wanted = {index_name(p, prefix=prefix): p for p, n in sizes.items() if n >= threshold}
            keep = {index_name(p, prefix=prefix) for p in sizes}  # at least half the threshold: hysteresis
            existing = partition_indexes(cursor, table=table, prefix=prefix)
            for name, valid in sorted(existing.items()):
                if name not in keep or not valid:
                    cursor.execute(f"drop index {'concurrently ' if concurrently else ''}if exists {name}")
                    outcome.dropped.append(name)
                    existing.pop(name)
            for name, partition in sorted(wanted.items()):
                if name in existing:
                    continue
                try:
                    cursor.execute(
                        create_index_sql(
                            partition,
                            table=table,
                            prefix=prefix,
                            column=column,
                            vector=vector,
                            concurrently=concurrently,
                        )
                    )
                    outcome.created.append(name)
                except Exception as exc:  # noqa: BLE001 - the next run drops what was left invalid and retries
                    log.warning("partition index %s not built: %s: %s", name, type(exc).__name__, exc)
            outcome.indexed = len(existing) + len(outcome.created)  # what is left of `existing` is valid
        finally:
            cursor.execute("select pg_advisory_unlock(%s)", [lock])
    if outcome.created or outcome.dropped:
        log.info(
            "%s partition indexes: %d built, %d dropped, %d in use",
            table,
            len(outcome.created),
            len(outcome.dropped),
            outcome.indexed,
        )
    return outcome
