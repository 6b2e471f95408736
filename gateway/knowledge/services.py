"""Writes and searches of the knowledge bases: stores, their files (ingested by a worker), hybrid
search (docs/knowledge.md)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import orjson
from celery import signature
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from gateway.batches.models import BatchFile
from gateway.call import Retrieval
from gateway.knowledge import documents
from gateway.knowledge.models import TEXT_SEARCH_CONFIG, Chunk, VectorStore, VectorStoreFile
from tenants.models import Tenant

log = logging.getLogger(__name__)

INGEST_FILE = "gateway.knowledge.tasks.ingest_file"
EMBED_BATCH = 32
# A chunk this close (cosine) to one kept before it in the same file says nothing new: dropped.
NEAR_DUPLICATE = 0.98
# Each side of a hybrid search ranks this many chunks before they are fused.
CANDIDATES = 50
RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al. 2009)
# At most this many of a store's chunks holding every word of a query are ranked, and as many of those
# holding any of its words when the first are fewer than CANDIDATES (see search()).
KEYWORD_SCAN = 1_000
EVERY_WORD = "plainto_tsquery(%(config)s, %(query)s)"
ANY_WORD = "to_tsquery('simple', replace(plainto_tsquery(%(config)s, %(query)s)::text, ' & ', ' | '))"


def store_create(*, tenant_id: int, name: str, metadata: dict, description: str = "") -> VectorStore:
    return VectorStore.objects.create(tenant_id=tenant_id, name=name, description=description, metadata=metadata)


def store_delete(*, store: VectorStore) -> None:
    with transaction.atomic():
        waited_for_ingestion(VectorStoreFile.objects.filter(store=store))
        store.delete()  # its files' entries and chunks with it; the uploaded files stay


def waited_for_ingestion(entries) -> None:
    """Lock the store-file entries about to be deleted (call inside the deleting transaction). An
    ingestion writes an entry's chunks holding its row locked (ingest); without this a delete could
    remove the chunks it saw, wait for the row, and find at its commit the chunks committed meanwhile
    still pointing at the entry (a foreign-key error, a 500). Locked first, the delete sees them; an
    ingestion that starts after finds the entry gone and writes nothing."""
    list(entries.select_for_update().order_by("pk").values_list("pk", flat=True))


class QuotaExceeded(ValueError):
    """The tenant's stores would hold more than its quota (quota_of); the text says by how much."""


def quota_of(tenant: Tenant) -> int:
    """The bytes of files the tenant's stores may hold: its own quota, else the deployment's."""
    own = tenant.knowledge_quota_bytes
    return settings.KNOWLEDGE_QUOTA_BYTES if own is None else own


def storage_used(tenant_id: int) -> int:
    """The bytes of the distinct files in the tenant's stores."""
    in_stores = VectorStoreFile.objects.filter(store__tenant_id=tenant_id).values("file_id")
    return BatchFile.objects.filter(pk__in=in_stores).aggregate(total=Sum("bytes"))["total"] or 0


@transaction.atomic
def file_add(*, store: VectorStore, file: BatchFile, attributes: dict) -> VectorStoreFile:
    """The file in the store (again, if it was: its chunks are made anew), ingested by a worker.
    Raises QuotaExceeded when the tenant's stores would outgrow its storage."""
    # One add at a time per tenant: two at once must not both fit in the last of the quota.
    tenant = Tenant.objects.select_for_update().only("knowledge_quota_bytes").get(pk=store.tenant_id)
    already = VectorStoreFile.objects.filter(store__tenant_id=store.tenant_id, file=file).exists()
    used = storage_used(store.tenant_id)
    quota = quota_of(tenant)
    if not already and used + file.bytes > quota:
        raise QuotaExceeded(
            f"The tenant's vector stores hold {used} bytes of files of the {quota} they may hold; "
            f"this file's {file.bytes} do not fit."
        )
    entry, _ = VectorStoreFile.objects.update_or_create(
        store=store,
        file=file,
        defaults={"status": VectorStoreFile.Status.IN_PROGRESS, "last_error": None, "attributes": attributes},
    )
    transaction.on_commit(lambda: signature(INGEST_FILE).delay(entry.pk))
    return entry


def file_remove(*, entry: VectorStoreFile) -> None:
    with transaction.atomic():
        waited_for_ingestion(VectorStoreFile.objects.filter(pk=entry.pk))
        entry.delete()  # every chunk of it with it (on_delete CASCADE)


def ingest(entry_id: int) -> None:
    """Read, chunk and embed one file of a store; its chunks replace the ones it had, at once."""
    entry = VectorStoreFile.objects.select_related("file").filter(pk=entry_id).first()
    if entry is None:
        return  # removed meanwhile
    try:
        pieces = documents.chunks(documents.text_of(entry.file.filename, bytes(entry.file.content)))
        if not pieces:
            raise documents.DocumentError("The file holds no text.")
    except documents.DocumentError as exc:
        _failed(entry_id, "invalid_file", str(exc))
        return
    vectors = _embedded(pieces)
    kept, kept_vectors = _distinct(pieces, vectors)
    with transaction.atomic():
        if not VectorStoreFile.objects.select_for_update().filter(pk=entry_id).exists():
            return
        Chunk.objects.filter(store_file_id=entry_id).delete()
        Chunk.objects.bulk_create(
            [
                Chunk(store_id=entry.store_id, store_file_id=entry_id, position=index, text=text, embedding=vector)
                for index, (text, vector) in enumerate(zip(kept, kept_vectors, strict=True))
            ],
            batch_size=500,
        )
        VectorStoreFile.objects.filter(pk=entry_id).update(
            status=VectorStoreFile.Status.COMPLETED,
            last_error=None,
            chunks=len(kept),
            usage_bytes=sum(len(text.encode()) for text in kept),
        )
        VectorStore.objects.filter(pk=entry.store_id).update(last_active_at=timezone.now())


def _failed(entry_id: int, code: str, message: str) -> None:
    with transaction.atomic():
        Chunk.objects.filter(store_file_id=entry_id).delete()
        VectorStoreFile.objects.filter(pk=entry_id).update(
            status=VectorStoreFile.Status.FAILED, last_error={"code": code, "message": message}, chunks=0, usage_bytes=0
        )


def _embedded(texts: list[str]) -> np.ndarray:
    from gateway.cache.engine import shared_embedder

    embedder = shared_embedder()
    return np.concatenate([embedder.embed(texts[i : i + EMBED_BATCH]) for i in range(0, len(texts), EMBED_BATCH)])


def _distinct(texts: list[str], vectors: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    kept: list[str] = []
    kept_vectors: list[np.ndarray] = []
    for text, vector in zip(texts, vectors, strict=True):
        if kept_vectors and float(np.max(np.stack(kept_vectors) @ vector)) >= NEAR_DUPLICATE:
            continue
        kept.append(text)
        kept_vectors.append(vector)
    return kept, kept_vectors


# --- search ---------------------------------------------------------------------------------------


def retrieval_used(query: str) -> Retrieval:
    """What one search for `query` used and costs (one search, however many stores it names)."""
    from gateway.cache.engine import shared_embedder

    return Retrieval(
        tokens=shared_embedder().count_tokens(query), cost=settings.KNOWLEDGE_USD_PER_THOUSAND_SEARCHES / 1000
    )


# A store's last_active_at is written at most this often by searches (a write on the read path).
ACTIVE_RESOLUTION = timedelta(minutes=1)


def touched(stores: list[VectorStore]) -> None:
    """The stores' last_active_at now, unless it was set within ACTIVE_RESOLUTION: one UPDATE that
    changes no row (and takes no row lock) for stores searched a moment ago."""
    now = timezone.now()
    stale = [store.pk for store in stores if now - store.last_active_at >= ACTIVE_RESOLUTION]
    if stale:
        VectorStore.objects.filter(pk__in=stale, last_active_at__lt=now - ACTIVE_RESOLUTION).update(last_active_at=now)


@dataclass(frozen=True)
class Hit:
    chunk_id: int
    file_id: str
    filename: str
    attributes: dict
    text: str
    score: float  # the fused score, 1.0 for a chunk first in both rankings


def search(
    *,
    stores: list[VectorStore],
    query: str,
    vector: np.ndarray,
    limit: int,
    mode: str = "hybrid",
    where: tuple[str, dict] | None = None,
) -> list[Hit]:
    """The chunks of `stores` best matching `query`, in one statement: for each store, the CANDIDATES
    nearest embeddings (through the store's own HNSW index when it has one: gateway.knowledge.indexes)
    and the CANDIDATES best full-text matches (any of the query's words, stemmed), fused by reciprocal
    rank; `mode` "semantic" or "keyword" uses one side alone. `where` (gateway.knowledge.filters.to_sql)
    keeps the chunks of files whose attributes match, before either side ranks them."""
    sides: list[str] = []
    ctes: list[str] = []
    params: dict = {
        "vector": "[" + ",".join(f"{value:.8g}" for value in vector.tolist()) + "]",
        "candidates": CANDIDATES,
        "scan": KEYWORD_SCAN,
        "config": TEXT_SEARCH_CONFIG,
        "query": query,
        "limit": limit,
        **(where[1] if where is not None else {}),
    }
    for n, store in enumerate(stores):
        params[f"store{n}"] = store.pk
        # The filter's SQL comes from filters.to_sql: its keys and values are parameters.
        files = (
            f"AND store_file_id IN (SELECT e.id FROM gateway_vectorstorefile e WHERE e.store_id = %(store{n})s::bigint "  # noqa: S608
            f"AND ({where[0]})) "
            if where is not None
            else ""
        )
        if mode in ("hybrid", "semantic"):
            # Ranked on the distance the inner query returns: an HNSW scan may return its rows a little
            # out of order (relaxed iterative scans, below).
            sides.append(
                "SELECT id, row_number() OVER (ORDER BY distance, id) AS rank FROM ("  # noqa: S608
                "SELECT id, embedding <=> %(vector)s::vector AS distance FROM gateway_chunk "
                f"WHERE store_id = %(store{n})s::bigint {files}ORDER BY embedding <=> %(vector)s::vector "
                "LIMIT %(candidates)s) AS nearest"
            )
        if mode in ("hybrid", "keyword"):
            # Chunks holding every word of the query first (plainto_tsquery stems them and joins them
            # with &), ranked by cover density; then, only when those are fewer than the candidates,
            # chunks holding any of them (| read back with the 'simple' configuration, which leaves the
            # stems as they are), ranked by frequency (ts_rank: cover density over a query of many
            # alternatives cost 45 ms a thousand chunks, this 2.5). Of each, at most KEYWORD_SCAN
            # are ranked: in a large store a common word is in tens of thousands of chunks, and
            # ranking them all cost 40 ms at 3,000 (bench retrieval).
            ctes.append(
                f"every{n} AS MATERIALIZED (SELECT matched.id, ts_rank_cd(matched.search, query) AS score FROM ("  # noqa: S608
                f"SELECT id, search FROM gateway_chunk, {EVERY_WORD} AS query "
                f"WHERE store_id = %(store{n})s::bigint AND search @@ query {files}LIMIT %(scan)s"
                f") AS matched, {EVERY_WORD} AS query ORDER BY score DESC, matched.id LIMIT %(candidates)s)"
            )
            ctes.append(
                f"some{n} AS MATERIALIZED (SELECT matched.id, ts_rank(matched.search, query) AS score FROM ("  # noqa: S608
                f"SELECT id, search FROM gateway_chunk, {ANY_WORD} AS query "
                f"WHERE store_id = %(store{n})s::bigint AND search @@ query {files}"
                f"AND (SELECT count(*) FROM every{n}) < %(candidates)s LIMIT %(scan)s"
                f") AS matched, {ANY_WORD} AS query WHERE matched.id NOT IN (SELECT id FROM every{n}) "
                "ORDER BY score DESC, matched.id LIMIT %(candidates)s)"
            )
            sides.append(
                "SELECT id, row_number() OVER (ORDER BY tier, score DESC, id) AS rank FROM ("  # noqa: S608
                f"SELECT id, 0 AS tier, score FROM every{n} UNION ALL SELECT id, 1, score FROM some{n}"
                ") AS worded ORDER BY tier, score DESC, id LIMIT %(candidates)s"
            )
    if not sides:
        return []
    # A chunk first on both sides of its store scores 1.0.
    params["best"] = (2 if mode == "hybrid" else 1) / (RRF_K + 1)
    ranked = " UNION ALL ".join(f"({side})" for side in sides)
    with_clause = f"WITH {', '.join(ctes)} " if ctes else ""
    sql = (
        f"{with_clause}SELECT c.id, c.text, f.public_id, f.filename, e.attributes, fused.score FROM ("  # noqa: S608
        f"  SELECT id, sum(1.0 / ({RRF_K} + rank)) / %(best)s AS score FROM ({ranked}) AS ranked GROUP BY id"
        ") AS fused JOIN gateway_chunk c ON c.id = fused.id "
        "JOIN gateway_vectorstorefile e ON e.id = c.store_file_id JOIN gateway_batchfile f ON f.id = e.file_id "
        "ORDER BY fused.score DESC, c.id LIMIT %(limit)s"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        # ef_search at least the candidates wanted (its default, 40, would cap them); relaxed iterative
        # scans so an attribute filter that discards most of what the graph walks still fills them.
        cursor.execute(f"SET LOCAL hnsw.ef_search = {max(100, 2 * CANDIDATES)}")
        cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    touched(stores)
    return [
        Hit(
            chunk_id=row[0],
            text=row[1],
            file_id=row[2],
            filename=row[3],
            # Django has psycopg hand jsonb back as text (its fields decode it); so here.
            attributes=orjson.loads(row[4]) if isinstance(row[4], str) else row[4] or {},
            score=float(row[5]),
        )
        for row in rows
    ]
