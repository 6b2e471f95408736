"""Knowledge bases at scale (issue #24, part 1; `bench retrieval` runs it after the labeled set):
search latency over a million chunks and PDF ingestion in pages per second.

The chunks are generated, not ingested (embedding a million chunks here would take hours): a pool of
real sentences (the retrieval documents, the screening set, the cache bench's prompts) is embedded
once with the gateway's embedder; each chunk is four sentences of it, and its vector the mean of
theirs with a little noise, renormalised (so chunks sharing sentences sit near each other, as a
document's chunks do). They fill stores of 1k to 300k chunks (`LAYOUT`, scaled to `--chunks`) of one
tenant, loaded with COPY; the stores over SENTINEL_KNOWLEDGE_INDEX_ROWS get their own HNSW index as
beat gives them (gateway.knowledge.indexes). The data is kept between runs (tenant
`bench-retrieval-scale`), built again when its size or DATA_VERSION changes.

Queries: a sentence of a chunk of the store, searched for as the API does (services.search, hybrid,
top 10), per store size; the semantic side's recall@10 against an exact search of the same store.
Ingestion: a generated PDF of PAGES pages of the retrieval documents' text, read, chunked, embedded and
stored as a worker does.
"""

from __future__ import annotations

import re
import statistics
import time

import numpy as np
import orjson

from bench.report import percentile

DATA_VERSION = 1
SLUG = "bench-retrieval-scale"
# Store sizes in chunks (count, size) for a million; scaled for other totals.
LAYOUT = ((1, 300_000), (2, 100_000), (5, 50_000), (10, 10_000), (100, 1_000))
CHUNKS_PER_FILE = 1_000
SENTENCES_PER_CHUNK = 4
QUERIES = 100  # per store size
# --quick (what CI runs) checks that the scenario works, not how fast: a few thousand chunks from a
# few hundred sentences, its largest store indexed as a large one would be.
QUICK_SENTENCES = 300
QUICK_INDEX_ROWS = 500
RECALL_QUERIES = 20  # per store size, checked against an exact search
PAGES = 30


def layout(total: int) -> list[int]:
    """The store sizes for `total` chunks."""
    share = total / sum(count * size for count, size in LAYOUT)
    sizes: list[int] = []
    for count, size in LAYOUT:
        scaled = round(size * share)
        if scaled >= 100:
            sizes += [scaled] * count
        else:  # fewer stores of 100 chunks, rather than stores of a handful
            sizes += [100] * max(1, round(count * size * share / 100))
    sizes[0] += total - sum(sizes)
    return sizes


def sentence_pool() -> list[str]:
    from bench import cache_data
    from bench.retrieval import DATA, DISTRACTORS

    found: list[str] = []
    for path in sorted(DATA.glob("*.md")):
        text = re.sub(r"[#*`>|-]+", " ", path.read_text())
        found += [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n{2,}", text) if len(s.split()) >= 5]
    found += [orjson.loads(line)["text"] for line in DISTRACTORS.read_text().splitlines() if line.strip()]
    found += cache_data.prompt_pool(2_000)[0]
    return sorted({" ".join(s.split()) for s in found if 20 <= len(s) <= 400})


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def _existing(total: int):
    from gateway.knowledge.models import VectorStore
    from tenants.models import Tenant

    tenant = Tenant.objects.filter(slug=SLUG).first()
    if tenant is None:
        return None
    if tenant.name != f"v{DATA_VERSION} {total}":
        VectorStore.objects.filter(tenant=tenant).delete()
        from gateway.batches.models import BatchFile

        BatchFile.objects.filter(tenant=tenant).delete()
        tenant.delete()
        return None
    return tenant


def build(total: int, pool: list[str], vectors: np.ndarray, *, index_rows: int | None = None) -> dict:
    """The stores, filled and indexed (or found from an earlier run); what it took."""
    from django.db import connection

    from gateway.batches.models import BatchFile
    from gateway.knowledge import services
    from gateway.knowledge.indexes import index_stores
    from gateway.knowledge.models import VectorStoreFile
    from tenants.models import Tenant

    if _existing(total) is not None:
        return {"reused": True}
    tenant = Tenant.objects.create(slug=SLUG, name=f"v{DATA_VERSION} {total}")
    rng = np.random.default_rng(24)
    started = time.perf_counter()
    for number, size in enumerate(layout(total)):
        store = services.store_create(tenant_id=tenant.pk, name=f"store {number} ({size} chunks)", metadata={})
        entries = []
        for first in range(0, size, CHUNKS_PER_FILE):
            file = BatchFile.objects.create(
                tenant=tenant, purpose="assistants", filename=f"s{number}-{first}.md", bytes=1, content=b"."
            )
            entries.append(VectorStoreFile.objects.create(store=store, file=file, status="completed"))
        picks = rng.integers(len(pool), size=(size, SENTENCES_PER_CHUNK))
        mixed = _unit(vectors[picks].mean(axis=1))
        mixed = _unit(mixed + rng.normal(0.0, 0.01, mixed.shape).astype(np.float32))
        with connection.cursor() as cursor:
            raw = cursor.connection
            from pgvector.psycopg import register_vector

            register_vector(raw)
            with (
                raw.cursor() as copying,
                copying.copy(
                    "COPY gateway_chunk (store_id, store_file_id, position, text, embedding) FROM STDIN (FORMAT BINARY)"
                ) as copy,
            ):
                copy.set_types(["int8", "int8", "int4", "text", "vector"])
                for row in range(size):
                    text = " ".join(pool[i] for i in picks[row])
                    copy.write_row(
                        (store.pk, entries[row // CHUNKS_PER_FILE].pk, row % CHUNKS_PER_FILE, text, mixed[row])
                    )
    loaded = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("analyze gateway_chunk")
        cursor.execute("set maintenance_work_mem = '2GB'")
        cursor.execute("set max_parallel_maintenance_workers = 2")
    started = time.perf_counter()
    outcome = index_stores(rows=index_rows, concurrently=False)
    return {
        "reused": False,
        "load_seconds": round(loaded, 1),
        "index_seconds": round(time.perf_counter() - started, 1),
        "indexes": len(outcome.created),
    }


def search_latency(pool: list[str], vectors: np.ndarray, *, queries: int, recall_queries: int) -> list[dict]:
    """Hybrid search p50/p99 per store size, and the semantic side's recall@10 against exact."""
    from django.db import connection, transaction

    from gateway.knowledge import services
    from gateway.knowledge.models import Chunk, VectorStore

    index = {text: n for n, text in enumerate(pool)}
    stores = list(VectorStore.objects.filter(tenant__slug=SLUG).order_by("id"))
    sizes = {s.pk: Chunk.objects.filter(store=s).count() for s in stores}
    rng = np.random.default_rng(7)
    by_size: dict[int, list] = {}
    for store in stores:
        by_size.setdefault(sizes[store.pk], []).append(store)
    rows = []
    for size, group in sorted(by_size.items(), reverse=True):
        timings, recalls = [], []
        for n in range(queries):
            store = group[n % len(group)]
            chunk = Chunk.objects.filter(store=store).order_by("id")[int(rng.integers(size))]
            sentence = next(s for s in pool if chunk.text.startswith(s))
            vector = vectors[index[sentence]]
            begun = time.perf_counter()
            services.search(stores=[store], query=sentence, vector=vector, limit=10)
            timings.append((time.perf_counter() - begun) * 1000)
            if n < recall_queries:
                found = {
                    h.chunk_id
                    for h in services.search(stores=[store], query="", vector=vector, limit=10, mode="semantic")
                }
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute("set local enable_indexscan = off")  # no HNSW: every distance, exact
                    cursor.execute("set local enable_bitmapscan = on")
                    cursor.execute(
                        "select id from gateway_chunk where store_id = %s order by embedding <=> %s::vector limit 10",
                        [store.pk, "[" + ",".join(f"{v:.8g}" for v in vector.tolist()) + "]"],
                    )
                    exact = {row[0] for row in cursor.fetchall()}
                recalls.append(len(found & exact) / len(exact))
        rows.append(
            {
                "store_chunks": size,
                "stores": len(group),
                "indexed": all(_indexed(store) for store in group),
                "queries": len(timings),
                "p50_ms": round(statistics.median(timings), 2),
                "p99_ms": round(percentile(timings, 0.99), 2),
                "semantic_recall_at_10": round(statistics.mean(recalls), 3),
            }
        )
    return rows


def _indexed(store) -> bool:
    """Whether the store has its own HNSW index (beat's, or the build's)."""
    from django.db import connection

    from gateway.knowledge.indexes import PREFIX

    with connection.cursor() as cursor:
        cursor.execute("select to_regclass(%s) is not null", [f"{PREFIX}_{int(store.pk)}"])
        return bool(cursor.fetchone()[0])


# --- PDF ingestion ------------------------------------------------------------------------------


def pdf(pages: list[list[str]]) -> bytes:
    """A PDF of these pages, each a list of lines of text (Helvetica), as a PDF writer makes them."""
    font = 3 + 2 * len(pages)
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{' '.join(f'{3 + 2 * n} 0 R' for n in range(len(pages)))}] /Count {len(pages)} >>",
    ]
    for n, lines in enumerate(pages):
        escaped = [line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for line in lines]
        content = "BT /F1 10 Tf 54 750 Td 12 TL " + " ".join(f"({line}) '" for line in escaped) + " ET"
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * n} 0 R "
            f"/Resources << /Font << /F1 {font} 0 R >> >> >>"
        )
        objects.append(f"<< /Length {len(content)} >>\nstream\n{content}\nendstream")
    objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out, offsets = "%PDF-1.4\n", []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n" + "".join(f"{o:010d} 00000 n \n" for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n"
    return out.encode("latin-1", "replace")


def pdf_ingestion(pool: list[str], pages: int) -> dict:
    """A PDF of `pages` pages (about 3,000 characters each) ingested as a worker does."""
    import textwrap

    from django.utils.crypto import get_random_string

    from gateway.batches.models import BatchFile
    from gateway.knowledge import services
    from gateway.knowledge.models import VectorStoreFile
    from tenants.models import Tenant

    rng = np.random.default_rng(3)
    made = []
    for _ in range(pages):
        text = " ".join(pool[i] for i in rng.integers(len(pool), size=60))
        made.append(textwrap.wrap(text, 95)[:50])
    content = pdf(made)
    tenant = Tenant.objects.create(slug=f"bench-retrieval-pdf-{get_random_string(8).lower()}", name="PDF bench")
    try:
        store = services.store_create(tenant_id=tenant.pk, name="pdf", metadata={})
        file = BatchFile.objects.create(
            tenant=tenant, purpose="assistants", filename="manual.pdf", bytes=len(content), content=content
        )
        entry = VectorStoreFile.objects.create(store=store, file=file)
        started = time.perf_counter()
        services.ingest(entry.pk)
        seconds = time.perf_counter() - started
        entry.refresh_from_db()
        return {
            "pages": pages,
            "characters": sum(len(line) + 1 for page in made for line in page),
            "status": entry.status,
            "chunks": entry.chunks,
            "seconds": round(seconds, 2),
            "pages_per_s": round(pages / seconds, 2),
        }
    finally:
        store.delete()
        BatchFile.objects.filter(tenant=tenant).delete()
        tenant.delete()


def drop() -> None:
    from django.db import connection

    from gateway.batches.models import BatchFile
    from gateway.knowledge.indexes import PREFIX
    from gateway.knowledge.models import VectorStore
    from tenants.models import Tenant

    stores = list(VectorStore.objects.filter(tenant__slug=SLUG).values_list("pk", flat=True))
    with connection.cursor() as cursor:
        for pk in stores:
            cursor.execute(f"drop index if exists {PREFIX}_{int(pk)}")
    VectorStore.objects.filter(pk__in=stores).delete()
    BatchFile.objects.filter(tenant__slug=SLUG).delete()
    Tenant.objects.filter(slug=SLUG).delete()


def run(total: int, *, quick: bool, keep: bool = True) -> dict:
    """The scale figures; the generated stores are kept for the next run unless `keep` is false."""
    from gateway.cache.engine import shared_embedder

    pool = sentence_pool()
    if quick:
        pool = pool[:: max(1, len(pool) // QUICK_SENTENCES)]
    embedder = shared_embedder()
    vectors = np.concatenate([embedder.embed(pool[i : i + 64]) for i in range(0, len(pool), 64)])
    try:
        built = build(total, pool, vectors, index_rows=QUICK_INDEX_ROWS if quick else None)
        latency = search_latency(
            pool, vectors, queries=5 if quick else QUERIES, recall_queries=2 if quick else RECALL_QUERIES
        )
    finally:
        if not keep:
            drop()
    return {
        "chunks": total,
        "sentences": len(pool),
        "build": built,
        "search": latency,
        "pdf": pdf_ingestion(pool, 3 if quick else PAGES),
    }
