"""Knowledge-base retrieval (issue #24, part 1): recall@1, recall@5 and MRR of the vector store
search for vector-only, full-text-only and hybrid ranking, on a labeled set; ingestion throughput;
search latency. Uses the database, not the gateway's HTTP path (that is tested end to end).

    python -m bench retrieval [--rounds 5] [--quick] [--data-dir DIR]

The labeled set (bench/data/retrieval/): seven short support documents in Markdown and 36 questions,
each with the file and a phrase of the passage that answers it, written for this benchmark: plain
paraphrases ("How long until I get my money back"), terse keyword queries ("refund timeline"), and
codes no embedding knows ("ZX-4411", "E-7310"). Around them, as distractors, the 376 texts of
tests/data/screening_eval.jsonl, five to a document. A question is answered at rank r when the r-th
chunk returned is from its file and holds its phrase. Documents are ingested as a worker does
(gateway.knowledge.services.ingest, in this process); a store of the tenant `bench-retrieval-*` is
made and deleted. Writes bench/results/retrieval.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import orjson

from bench.report import envelope, percentile, table, write_json
from bench.stack import BASE_DIR, RESULTS_DIR, start_django

DATA = BASE_DIR / "bench" / "data" / "retrieval"
DISTRACTORS = BASE_DIR / "tests" / "data" / "screening_eval.jsonl"
MODES = ("semantic", "keyword", "hybrid")
TOP = 10


def documents() -> dict[str, bytes]:
    docs = {path.name: path.read_bytes() for path in sorted(DATA.glob("*.md"))}
    texts = [orjson.loads(line)["text"] for line in DISTRACTORS.read_text().splitlines() if line.strip()]
    for start in range(0, len(texts), 5):
        docs[f"distractor-{start // 5:03d}.md"] = "\n\n".join(texts[start : start + 5]).encode()
    return docs


def questions() -> list[dict]:
    return [orjson.loads(line) for line in (DATA / "questions.jsonl").read_text().splitlines() if line.strip()]


def build_store():
    """A store holding every document, ingested; returns it, the seconds ingesting took and its size."""
    from django.utils.crypto import get_random_string

    from gateway.batches.models import BatchFile
    from gateway.knowledge import services
    from gateway.knowledge.models import Chunk, VectorStoreFile
    from tenants.models import Tenant

    tenant = Tenant.objects.create(slug=f"bench-retrieval-{get_random_string(8).lower()}", name="Retrieval bench")
    store = services.store_create(tenant_id=tenant.pk, name="bench", metadata={})
    entries = []
    for name, content in documents().items():
        file = BatchFile.objects.create(
            tenant=tenant, purpose="assistants", filename=name, bytes=len(content), content=content
        )
        entries.append(VectorStoreFile.objects.create(store=store, file=file))
    from gateway.cache.engine import shared_embedder

    shared_embedder().embed(["warm up"])
    started = time.perf_counter()
    for entry in entries:
        services.ingest(entry.pk)
    seconds = time.perf_counter() - started
    chunks = Chunk.objects.filter(store=store).count()
    chars = sum(len(content) for content in documents().values())
    failed = VectorStoreFile.objects.filter(store=store).exclude(status="completed").count()
    return (
        tenant,
        store,
        {"files": len(entries), "failed": failed, "chunks": chunks, "chars": chars, "seconds": seconds},
    )


def evaluate(store, asked: list[dict], rounds: int) -> tuple[dict, dict]:
    from gateway.cache.engine import shared_embedder
    from gateway.knowledge import services

    embedder = shared_embedder()
    vectors = {item["q"]: embedder.embed([item["q"]])[0] for item in asked}
    quality = {}
    for mode in MODES:
        ranks = []
        for item in asked:
            hits = services.search(stores=[store], query=item["q"], vector=vectors[item["q"]], limit=TOP, mode=mode)
            rank = next(
                (n for n, hit in enumerate(hits, 1) if hit.filename == item["file"] and item["answer"] in hit.text),
                None,
            )
            ranks.append(rank)
        quality[mode] = {
            "recall_at_1": round(sum(r == 1 for r in ranks) / len(ranks), 3),
            "recall_at_5": round(sum(r is not None and r <= 5 for r in ranks) / len(ranks), 3),
            "mrr_at_10": round(sum(1 / r for r in ranks if r is not None) / len(ranks), 3),
            "missed_at_5": [item["q"] for item, r in zip(asked, ranks, strict=True) if r is None or r > 5],
        }
    embed_ms, search_ms = [], []
    for _ in range(rounds):
        for item in asked:
            started = time.perf_counter()
            vector = embedder.embed([item["q"]])[0]
            embed_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            services.search(stores=[store], query=item["q"], vector=vector, limit=TOP, mode="hybrid")
            search_ms.append((time.perf_counter() - started) * 1000)
    latency = {
        "searches": len(search_ms),
        "embed_p50_ms": round(statistics.median(embed_ms), 2),
        "search_p50_ms": round(statistics.median(search_ms), 2),
        "search_p99_ms": round(percentile(search_ms, 0.99), 2),
    }
    return quality, latency


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench retrieval", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="times each question is searched for the latency")
    parser.add_argument("--quick", action="store_true", help="one latency round")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for retrieval.json")
    parser.add_argument("--data-dir", type=Path, default=None, help="settings' data folder (default .data/bench)")
    parser.add_argument(
        "--chunks", type=int, default=None, help="chunks generated for the scale run (default 1,000,000; quick 3,000)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the quick run's generated stores")
    args = parser.parse_args(argv)
    start_django(args.data_dir, migrate=True)
    tenant, store, ingested = build_store()
    try:
        quality, latency = evaluate(store, questions(), 1 if args.quick else args.rounds)
    finally:
        from gateway.batches.models import BatchFile

        store.delete()
        BatchFile.objects.filter(tenant=tenant).delete()
    ingested["chars_per_s"] = round(ingested["chars"] / ingested["seconds"])
    ingested["chunks_per_s"] = round(ingested["chunks"] / ingested["seconds"], 1)
    ingested["seconds"] = round(ingested["seconds"], 2)
    print(
        table(
            ["ranking", "recall@1", "recall@5", "MRR@10", "missed at 5"],
            [
                [mode, q["recall_at_1"], q["recall_at_5"], q["mrr_at_10"], len(q["missed_at_5"])]
                for mode, q in quality.items()
            ],
            title=f"{len(questions())} questions over {ingested['files']} documents, {ingested['chunks']} chunks",
        )
    )
    print(
        f"ingested {ingested['chars']} characters in {ingested['seconds']} s "
        f"({ingested['chars_per_s']} chars/s, {ingested['chunks_per_s']} chunks/s); "
        f"query embedding p50 {latency['embed_p50_ms']} ms; hybrid search p50 {latency['search_p50_ms']} ms, "
        f"p99 {latency['search_p99_ms']} ms"
    )
    from bench import retrieval_scale

    chunks = args.chunks or (3_000 if args.quick else 1_000_000)
    scale = retrieval_scale.run(chunks, quick=args.quick, keep=args.keep or not args.quick)
    print(
        table(
            ["chunks in the store", "stores", "own HNSW index", "queries", "p50 ms", "p99 ms", "semantic recall@10"],
            [
                [r["store_chunks"], r["stores"], r["indexed"], r["queries"], r["p50_ms"], r["p99_ms"]]
                + [r["semantic_recall_at_10"]]
                for r in scale["search"]
            ],
            title=f"hybrid search, top 10, among {chunks:,} chunks ({scale['build']})",
        )
    )
    pdf = scale["pdf"]
    print(
        f"PDF ingestion: {pdf['pages']} pages ({pdf['characters']} characters, {pdf['chunks']} chunks) in "
        f"{pdf['seconds']} s: {pdf['pages_per_s']} pages/s ({pdf['status']})"
    )
    write_json(
        args.out,
        "retrieval",
        {
            **envelope("retrieval", quick=args.quick),
            "ingestion": ingested,
            "quality": quality,
            "latency": latency,
            "scale": scale,
        },
    )
    return 0
