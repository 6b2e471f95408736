"""Scenario 5, cache scale: the semantic tier's lookup at 10k / 100k / 1M entries over 100 tenants.

    python -m bench cache_scale [--sizes 10000,100000,1000000] [--queries 400] [--keep] [--quick]

For each size, a twin of `gateway_cacheentry` (same columns, storage and indexes, and the partition
HNSW indexes beat would give it: gateway/cache/indexes.py) is filled with
synthetic entries (bench/cache_data.py: real prompt embeddings of a few topics, mixed and jittered, so a
partition's entries crowd together as one application's prompts do), spread over 100 tenants of
Zipf-like sizes and their partitions (applications, features, conversations). Lookups are 80 %
paraphrases of a stored entry and 20 % new prompts of the partition's topic, an equal share per
partition-size bucket. Each is asked as the gateway asks it (partition filter, `limit CANDIDATES`,
planned with the partition's value: its own HNSW index if it has one, else its btree and every
distance) with several `hnsw.ef_search` values, and as a plain exact search; then, for comparison,
through one HNSW index over the whole table (the design this replaced) with and without iterative
scans. Recall@1 is against brute force over the partition in numpy. Then: embedding time per 20-word prompt (the
ONNX export the gateway serves; `--torch` adds sentence-transformers as the reference for precision)
and exact and semantic hits at the client through a running gateway.

Prints tables; writes bench/results/cache_scale.json and cache_scale.png.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

import numpy as np
import orjson
import psycopg

from bench import cache_data, report
from bench.stack import add_stack_arguments, setup_django

SCENARIO = "cache_scale"
SIZES = (10_000, 100_000, 1_000_000)
TENANTS = 100
DATA_VERSION = 2  # bump when the generated data changes, so kept tables are rebuilt


def connect(**settings: str | int) -> psycopg.Connection:
    """A connection to the database Django uses, with pgvector's types and the given settings."""
    from django.db import connections
    from pgvector.psycopg import register_vector
    from psycopg.conninfo import make_conninfo

    params = connections["default"].get_connection_params()
    wanted = ("dbname", "user", "password", "host", "port")
    conn = psycopg.connect(make_conninfo(**{k: v for k, v in params.items() if k in wanted and v}), autocommit=True)
    register_vector(conn)
    for name, value in settings.items():
        conn.execute(f"set {name} = '{value}'")
    return conn


# --- the data ----------------------------------------------------------------------------------


@dataclass
class Corpus:
    """What is stored: entry vectors by row (id = row + 1), each row's partition, and the rows of each
    partition."""

    partitions: list[cache_data.Partition]
    vectors: np.ndarray  # (entries, 384) float32, unit length
    partition_of: np.ndarray  # (entries,) index into partitions
    rows_of: list[np.ndarray] = field(default_factory=list)

    @property
    def entries(self) -> int:
        return len(self.vectors)


def build_corpus(size: int, pool: np.ndarray, labels: np.ndarray, seed: int) -> Corpus:
    rng = np.random.default_rng(seed)
    partitions = cache_data.layout(size, TENANTS, seed=seed)
    sizes = np.array([p.size for p in partitions])
    topics = np.array([p.topic for p in partitions])
    vectors = np.empty((size, pool.shape[1]), dtype=np.float32)
    partition_of = np.repeat(np.arange(len(partitions)), sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    for topic in np.unique(topics):
        mine = np.flatnonzero(topics == topic)
        rows = np.concatenate([np.arange(starts[i], starts[i] + sizes[i]) for i in mine])
        vectors[rows] = cache_data.derive(pool, labels, int(topic), len(rows), rng)
    # Entries arrive over time from every partition at once: the table's rows are interleaved.
    order = rng.permutation(size)
    vectors, partition_of = vectors[order], partition_of[order]
    by_partition = np.argsort(partition_of, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(partition_of, minlength=len(partitions)))])
    rows_of = [by_partition[bounds[i] : bounds[i + 1]] for i in range(len(partitions))]
    return Corpus(partitions, vectors, partition_of, rows_of)


ANSWER_WORDS = (
    "the a to of and in is for that you it with on as this be are can or your if by an from use will "
    "step first then when which more each make sure also these other time value list file order "
    "account settings option example result data number check default return because however"
).split()


def answers(count: int, rng: np.random.Generator) -> list[str]:
    """Stored answers as the gateway files them (content, finish_reason, usage, model), 40 to 400 words."""
    found = []
    for _ in range(count):
        words = int(rng.integers(40, 400))
        content = " ".join(rng.choice(ANSWER_WORDS, words).tolist()).capitalize() + "."
        usage = {"prompt_tokens": int(rng.integers(10, 60)), "completion_tokens": words * 4 // 3}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        answer = {"content": content, "finish_reason": "stop", "usage": usage, "model": "gpt-4o-mini-2024-07-18"}
        found.append(orjson.dumps(answer).decode())
    return found


COLUMN_TYPES = [
    "int8",
    "int8",
    "varchar",
    "varchar",
    "varchar",
    "text",
    "vector",
    "jsonb",
    "numeric",
    "timestamptz",
    "timestamptz",
    "int4",
]
COLUMNS = (
    "id, tenant_id, partition, exact_digest, model, prompt, embedding, answer, cost_usd, created_at, expires_at, hits"
)


def create_table(
    conn: psycopg.Connection,
    table: str,
    corpus: Corpus,
    prompts: list[str],
    seed: int,
    index_rows: int,
    storage: str = "",
) -> dict:
    """The cache table's twin (same columns, storage and indexes as gateway_cacheentry), filled with the
    corpus by COPY, indexes built afterwards (each timed). Returns the build's figures."""
    rng = np.random.default_rng(seed + 1)
    conn.execute(f"drop table if exists {table}")
    conn.execute(f"create unlogged table {table} (like gateway_cacheentry including defaults including storage)")
    if storage:
        conn.execute(f"alter table {table} alter column embedding set storage {storage}")
    stored_answers = answers(500, rng)
    prompt_of = rng.integers(len(prompts), size=corpus.entries)
    answer_of = rng.integers(len(stored_answers), size=corpus.entries)
    created = datetime(2026, 1, 1, tzinfo=UTC)
    expires = datetime(2099, 1, 1, tzinfo=UTC)
    cost = Decimal("0.0001250000")
    started = time.monotonic()
    with conn.cursor() as cur, cur.copy(f"copy {table} ({COLUMNS}) from stdin (format binary)") as copy:
        copy.set_types(COLUMN_TYPES)
        for row in range(corpus.entries):
            partition = corpus.partitions[corpus.partition_of[row]]
            copy.write_row(
                (
                    row + 1,
                    partition.tenant + 1,
                    partition.key,
                    rng.bytes(32).hex(),
                    "gpt-4o-mini",
                    prompts[prompt_of[row]],
                    corpus.vectors[row],
                    stored_answers[answer_of[row]],
                    cost,
                    created,
                    expires,
                    0,
                )
            )
    figures = {"copy_s": round(time.monotonic() - started, 1)}
    figures.update(build_indexes(conn, table, index_rows))
    return figures


INDEX_NAMES: dict[str, str] = {}  # twin index → the real one it copies


def twin_indexes(conn: psycopg.Connection, table: str) -> list[tuple[str, str]]:
    """The real table's indexes, as its migrations define them, renamed for the twin (the real names,
    prefixed, would pass PostgreSQL's 63 characters): (twin name, its definition). Not the partition
    indexes of the real table's own entries."""
    definitions = conn.execute(
        "select indexname, indexdef from pg_indexes where tablename = 'gateway_cacheentry' "
        "and indexname not like 'cache\\_hnsw\\_p\\_%' order by indexname"
    ).fetchall()
    found = []
    for number, (name, definition) in enumerate(definitions):
        twin = f"{table}_i{number}"
        INDEX_NAMES[twin] = name
        found.append(
            (twin, definition.replace(f"INDEX {name} ON public.gateway_cacheentry ", f"INDEX {twin} ON {table} "))
        )
    return found


def partition_prefix(table: str) -> str:
    return f"{table}_p"


def global_index(table: str) -> str:
    return f"{table}_global_hnsw"


def build_indexes(conn: psycopg.Connection, table: str, index_rows: int) -> dict:
    """The real table's indexes on the twin, then the partition HNSW indexes beat's task would build
    (gateway/cache/indexes.py, the same code, here not CONCURRENTLY), each kind timed."""
    from gateway.cache.indexes import index_partitions

    conn.execute("set maintenance_work_mem = '1GB'")
    conn.execute("set max_parallel_maintenance_workers = 2")
    started = time.monotonic()
    for _, sql in twin_indexes(conn, table):
        conn.execute(sql)
    figures = {"btree_build_s": round(time.monotonic() - started, 1)}
    conn.execute(f"vacuum (analyze) {table}")
    started = time.monotonic()
    outcome = index_partitions(
        rows=index_rows,
        table=table,
        prefix=partition_prefix(table),
        vector="embedding",  # the twin is searched by its MiniLM vectors (this scenario's own SQL)
        concurrently=False,
        using=conn,
    )
    figures["partition_hnsw_build_s"] = round(time.monotonic() - started, 1)
    figures["partition_indexes"] = len(outcome.created)
    started = time.monotonic()
    conn.execute(f"vacuum (analyze) {table}")
    figures["vacuum_analyze_s"] = round(time.monotonic() - started, 1)
    return figures


def build_global_index(conn: psycopg.Connection, table: str) -> float:
    """One HNSW index over the whole twin, as the cache had before partition indexes (for comparison)."""
    conn.execute("set maintenance_work_mem = '1GB'")
    conn.execute("set max_parallel_maintenance_workers = 2")
    started = time.monotonic()
    from gateway.cache.indexes import hnsw_method

    conn.execute(f"create index if not exists {global_index(table)} on {table} {hnsw_method('embedding')}")
    conn.execute(f"analyze {table}")
    return round(time.monotonic() - started, 1)


def name_indexes(conn: psycopg.Connection, table: str) -> list[str]:
    """Register the twin's HNSW indexes under readable names for the plans; returns the partition ones."""
    from gateway.cache.indexes import partition_indexes

    twin_indexes(conn, table)  # the copies of the real table's indexes, named as the real ones
    with conn.cursor() as cursor:
        found = sorted(partition_indexes(cursor, table=table, prefix=partition_prefix(table)))
    for name in found:
        INDEX_NAMES[name] = "partition HNSW"
    INDEX_NAMES[global_index(table)] = "table-wide HNSW"
    return found


def sizes_of(conn: psycopg.Connection, table: str) -> dict:
    partials = name_indexes(conn, table)
    row = conn.execute(
        "select pg_relation_size(c.oid), coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0), "
        "coalesce(pg_relation_size(to_regclass(%s)), 0) from pg_class c where c.oid = %s::regclass",
        (global_index(table), table),
    ).fetchone()
    partial = sum(conn.execute("select pg_relation_size(%s::regclass)", (name,)).fetchone()[0] for name in partials)
    return {
        "heap_mb": round(row[0] / 2**20),
        "toast_mb": round(row[1] / 2**20),
        "partition_hnsw_mb": round(partial / 2**20),
        "partition_indexes": len(partials),
        **({"global_hnsw_mb": round(row[2] / 2**20)} if row[2] else {}),
    }


# --- lookups -----------------------------------------------------------------------------------

SELECT = "select id, prompt, answer, cost_usd, 1 - (embedding <=> %(q)s) as similarity from {table} "
FILTER = "where partition = %(p)s and expires_at > now() and embedding is not null "
# As gateway/cache's semantic lookup asks it: planned with the partition's value, the planner takes
# the partition's own HNSW index if it has one, else the partition's btree (then a sort).
AS_SHIPPED = SELECT + FILTER + "order by embedding <=> %(q)s limit {limit}"
# The table-wide HNSW index only: the filters compared through expressions no other index can serve.
HNSW_ONLY = (
    SELECT + "where (partition || '') = %(p)s and (expires_at + interval '0 s') > now() and embedding is not null "
    "order by embedding <=> %(q)s limit {limit}"
)
# Exact: the partition's rows (btree), every distance computed, sorted.
EXACT = (
    "with mine as materialized (select id, prompt, answer, cost_usd, embedding from {table} " + FILTER + ") "
    "select id, prompt, answer, cost_usd, 1 - (embedding <=> %(q)s) as similarity from mine "
    "order by embedding <=> %(q)s limit {limit}"
)


@dataclass
class Query:
    partition: int
    vector: np.ndarray
    kind: str  # paraphrase | novel
    truth_id: int = 0
    truth_similarity: float = 0.0


def make_queries(corpus: Corpus, pool, labels, count: int, seed: int) -> list[Query]:
    """`count` lookups, an equal share per partition-size bucket (within one, a partition as likely as
    its share of the entries, as traffic would be): 80 % paraphrases of a stored entry, 20 % novel
    prompts of the partition's topic. The exact answer of each is found by brute force."""
    rng = np.random.default_rng(seed + 2)
    sizes = np.array([p.size for p in corpus.partitions])
    buckets = np.array([cache_data.bucket_name(s) for s in sizes])
    names = [b for b in dict.fromkeys(cache_data.bucket_name(low) for low, _ in cache_data.BUCKETS) if b in buckets]
    queries = []
    for i in range(count):
        members = np.flatnonzero(buckets == names[i % len(names)])
        chosen = int(rng.choice(members, p=sizes[members] / sizes[members].sum()))
        if rng.random() < 0.8:
            source = corpus.vectors[rng.choice(corpus.rows_of[chosen])][None]
            queries.append(Query(chosen, cache_data.paraphrase_of(source, rng)[0], "paraphrase"))
        else:
            fresh = cache_data.derive(pool, labels, corpus.partitions[chosen].topic, 1, rng)
            queries.append(Query(chosen, cache_data.paraphrase_of(fresh, rng)[0], "novel"))
    for q in queries:
        rows = corpus.rows_of[q.partition]
        similarities = corpus.vectors[rows] @ q.vector
        best = int(np.argmax(similarities))
        q.truth_id, q.truth_similarity = int(rows[best]) + 1, float(similarities[best])
    return queries


def lookup(conn: psycopg.Connection, sql: str, partition: str, vector: np.ndarray) -> tuple[float, list | None]:
    """One lookup's time at the client and its rows (None: cancelled by the statement timeout)."""
    started = time.perf_counter()
    try:
        rows = conn.execute(sql, {"p": partition, "q": vector}).fetchall()
    except psycopg.errors.QueryCanceled:
        rows = None
    return time.perf_counter() - started, rows


def plan_of(conn: psycopg.Connection, sql: str, partition: str, vector: np.ndarray) -> str:
    """Which index the query's plan reads (for the results)."""
    plan = conn.execute("explain (format json) " + sql, {"p": partition, "q": vector}).fetchone()[0]
    found = []

    def walk(node: dict) -> None:
        if "Index Name" in node:
            found.append(node["Index Name"])
        elif node.get("Node Type") == "Seq Scan":
            found.append("seq scan")
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan[0]["Plan"])
    return ", ".join(INDEX_NAMES.get(name, name) for name in found)


def tie_or_same(rows: list, q: Query, tolerance: float = 1e-5) -> bool:
    """Recall@1: the best row returned is the exact best (or ties with it within float error)."""
    if not rows:
        return False
    top = max(rows, key=lambda r: r[-1])
    top_id, top_similarity = top[0], top[-1]
    return top_id == q.truth_id or abs(float(top_similarity) - q.truth_similarity) <= tolerance


def dumps(value) -> str:
    return json.dumps(value, default=str)


# --- embedding ---------------------------------------------------------------------------------


def measure_embedding(count: int, *, with_int8: bool, with_torch: bool) -> dict:
    """Embedding one 20-word prompt at a time: the ONNX export the gateway serves (fp32) with its
    configured threads and with 2, and optionally the int8 export and sentence-transformers on torch.
    Each runner embeds every prompt in a block of its own: interleaved, a 2-thread session's pool
    thread spins on after each call and takes a core from the runner timed next (in the gateway a
    process has one session). Precision: the cosine of each runner's vector to the torch reference's."""
    from django.conf import settings

    from gateway.cache.embedder import Embedder

    prompts = cache_data.twenty_word_prompts(count)
    cache_dir = settings.DATA_DIR / "models"
    runners = {}
    for threads in sorted({settings.EMBEDDER_THREADS, 2}):
        runners[f"onnx fp32, {threads} thread{'s' if threads > 1 else ''}"] = Embedder(
            cache_dir, backend="onnx", threads=threads
        )
    if with_int8:
        runners["onnx int8, 1 thread"] = Embedder(cache_dir, backend="onnx", threads=1, quantized=True)
    reference = Embedder(backend="torch", threads=2) if with_torch else None
    if reference is not None:
        runners["sentence-transformers (torch), 2 threads"] = reference
    for runner in runners.values():
        for prompt in prompts[:5]:
            runner.embed_one(prompt)
    times: dict[str, list[float]] = {name: [] for name in runners}
    vectors: dict[str, list[np.ndarray]] = {name: [] for name in runners}
    for name, runner in runners.items():
        for prompt in prompts:
            started = time.perf_counter()
            vector = runner.embed_one(prompt)
            times[name].append(time.perf_counter() - started)
            vectors[name].append(vector)
        time.sleep(0.5)  # let its threads stop spinning
    words = [len(p.split()) for p in prompts]
    found = {"prompts": len(prompts), "words_per_prompt": [min(words), max(words)], "runners": []}
    truth = np.stack(vectors[next(n for n in runners if "torch" in n)]) if reference is not None else None
    for name in runners:
        row = {
            "runner": name,
            "p50_ms": round(float(np.percentile(times[name], 50)) * 1000, 2),
            "p99_ms": round(float(np.percentile(times[name], 99)) * 1000, 2),
            "min_cosine_to_torch": None,
            "mean_1_minus_cosine": None,
        }
        if truth is not None:
            cosines = (np.stack(vectors[name]) * truth).sum(axis=1)
            row["min_cosine_to_torch"] = round(float(cosines.min()), 5)
            row["mean_1_minus_cosine"] = float(f"{float((1 - cosines).mean()):.2e}")
        found["runners"].append(row)
    return found


# --- hits at the client --------------------------------------------------------------------------

# Stored prompt, then a paraphrase the semantic tier should answer from it (checked before use: the
# pairs the verifier or the threshold would turn away are left out and counted).
PARAPHRASES = [
    ("How do I reset my password?", "how can i reset my password"),
    ("What is the capital of Australia?", "whats the capital of australia?"),
    ("Who painted the Mona Lisa?", "Who was the artist behind the Mona Lisa?"),
    ("How many hours of sleep does an adult need?", "How much sleep should a grown-up get each night?"),
    ("Why is the sky blue?", "What makes the sky look blue?"),
    ("How do I reverse a list in Python?", "python how to reverse a list"),
    ("What is the difference between a list and a tuple in Python?", "How do Python tuples differ from lists?"),
    ("How do I back up my iPhone to iCloud?", "What are the steps to back up an iPhone using iCloud?"),
    ("Can I take ibuprofen on an empty stomach?", "ibuprofen on an empty stomach ok?"),
    ("What is an HTTP 403 error?", "meaning of the http 403 status code"),
    ("How many ounces are in a pound?", "How many oz make up one lb?"),
    (
        "How do I remove duplicates from an array in JavaScript?",
        "In JavaScript, what's the best way to dedupe an array?",
    ),
    ("Which foods are safe for dogs to eat?", "list of foods that are ok for dogs"),
    ("How do I undo the last git commit?", "how to undo my last commit in git"),
    ("What are the symptoms of dehydration?", "what are the signs of dehydration"),
    ("How long should I boil an egg for a runny yolk?", "soft boiled egg with a runny yolk - how long to boil"),
]


BORDERLINE = 0.01  # a pair the verifier serves only within this of its cosine is not measured


def usable_pairs() -> tuple[list[tuple[str, str, float]], list[dict]]:
    """The paraphrase pairs the semantic tier would serve (similarity over the threshold and the
    verifier's consent), with their similarity; and the others, with the reason. A pair served only
    within BORDERLINE of its cosine is left out as borderline: the gateway embeds the two prompts
    in a batch, whose last digits can differ from these (and from another CPU's), and a pair on the
    edge would be a hit here and a miss there."""
    from gateway.cache import acceptance
    from gateway.cache.engine import shared_embedder

    embedder = shared_embedder()
    usable, refused = [], []
    for stored, asked in PARAPHRASES:
        a, b = acceptance.normalize_prompt(stored), acceptance.normalize_prompt(asked)
        similarity = float(embedder.embed_one(a) @ embedder.embed_one(b))
        verdict = acceptance.verify(a, b, similarity)
        lower = acceptance.verify(a, b, similarity - BORDERLINE)
        if verdict.accepted and lower.accepted:
            usable.append((stored, asked, similarity))
        else:
            why = verdict.reason if not verdict.accepted else f"borderline: at cosine - {BORDERLINE}, {lower.reason}"
            refused.append({"stored": stored, "asked": asked, "similarity": round(similarity, 3), "why": why})
    return usable, refused


def measure_hits(args, rounds: int) -> dict:
    """Exact and semantic hits at the client, one request at a time through a running gateway (cache
    on, zero-latency mock): each stored prompt asked again (exact) and its paraphrase (semantic), in a
    namespace of this run's own so earlier runs' entries never answer."""
    import uuid

    import httpx

    from bench.stack import MODEL_ALIAS, TENANT_SLUG, running_stack
    from gateway.mock_provider import answer_text
    from gateway.models import CacheEntry

    usable, refused = usable_pairs()
    timings: dict[str, list[float]] = {"direct": [], "miss": [], "exact_first": [], "exact": [], "semantic": []}
    tiers: dict[str, dict[str, int]] = {"exact": {}, "semantic": {}}
    wrong = 0
    missed: list[dict] = []  # paraphrases the gateway did not serve from the semantic tier, and how long each took
    with running_stack(
        out_dir=args.out, data_dir=args.data_dir, workers=args.workers, cache="miss", ledger_worker=not args.quick
    ) as stack:
        headers = {**stack.sentinel_headers, "x-sentinel-cache-namespace": f"cache-scale-{uuid.uuid4().hex[:8]}"}
        with httpx.Client(headers=headers, timeout=30) as client:

            def ask(prompt: str) -> tuple[float, str, str]:
                body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": prompt}]}
                started = time.perf_counter()
                response = client.post(stack.sentinel_url, json=body)
                spent = time.perf_counter() - started
                response.raise_for_status()
                return spent, response.headers["x-sentinel-cache"], response.json()["choices"][0]["message"]["content"]

            # The floor: the same client and body straight to the zero-latency mock.
            for _ in range(rounds):
                for stored, _, _ in usable:
                    started = time.perf_counter()
                    client.post(
                        stack.direct_url,
                        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": stored}]},
                    )
                    timings["direct"].append(time.perf_counter() - started)
            since = time.time()
            for stored, _, _ in usable:
                spent, tier, _ = ask(stored)
                timings["miss"].append(spent)
            deadline = time.monotonic() + 30
            stored_prompts = [s for s, _, _ in usable]
            while CacheEntry.objects.filter(
                tenant__slug=TENANT_SLUG, prompt__in=stored_prompts, created_at__gte=datetime.fromtimestamp(since, UTC)
            ).count() < len(usable):
                if time.monotonic() > deadline:
                    raise RuntimeError("the gateway did not store the answers within 30 s")
                time.sleep(0.05)
            for round_number in range(rounds + 1):
                for stored, asked, _ in usable:
                    for kind, prompt in (("exact", stored), ("semantic", asked)):
                        spent, tier, content = ask(prompt)
                        # A semantic hit must carry the stored prompt's answer; an exact hit or a
                        # miss, the answer to the prompt asked (a paraphrase missed once is then
                        # its own exact hit; a miss is counted in the tiers, not as wrong).
                        wrong += content != answer_text(stored if tier == "hit-semantic" else prompt)
                        if kind == "semantic" and tier != "hit-semantic":
                            missed.append(
                                {"round": round_number, "asked": prompt, "tier": tier, "ms": round(spent * 1000, 1)}
                            )
                        tiers[kind][tier] = tiers[kind].get(tier, 0) + 1
                        if kind == "exact" and round_number == 0:
                            timings["exact_first"].append(spent)
                        elif round_number > 0:
                            timings[kind].append(spent)

            # The same exact hits and floor through a lighter client (aiohttp, as bench.loadgen and
            # the overhead scenario use): httpx's own cost is a good part of its figures.
            async def light() -> None:
                import aiohttp

                async with aiohttp.ClientSession(headers=headers) as session:
                    for _ in range(rounds + 1):
                        for stored, _, _ in usable:
                            for kind, url, model in (
                                ("direct_aiohttp", stack.direct_url, "gpt-4o-mini"),
                                ("exact_aiohttp", stack.sentinel_url, MODEL_ALIAS),
                            ):
                                body = {"model": model, "messages": [{"role": "user", "content": stored}]}
                                started = time.perf_counter()
                                async with session.post(url, json=body) as response:
                                    await response.read()
                                    tier = response.headers.get("x-sentinel-cache", "direct")
                                spent = time.perf_counter() - started
                                if kind == "exact_aiohttp":
                                    tiers["exact"][tier] = tiers["exact"].get(tier, 0) + 1
                                timings.setdefault(kind, []).append(spent)

            import asyncio

            asyncio.run(light())
            for kind in ("direct_aiohttp", "exact_aiohttp"):
                timings[kind] = timings[kind][len(usable) :]  # the first round warms the connection

    def pct(values: list[float], q: float) -> float | None:
        return round(float(np.percentile(values, q)) * 1000, 2) if values else None

    return {
        "pairs_used": len(usable),
        "pairs_refused": refused,
        "rounds": rounds,
        "tiers": tiers,
        "wrong_answers": wrong,
        "semantic_missed": missed,
        **{f"{kind}_p50_ms": pct(values, 50) for kind, values in timings.items()},
        **{f"{kind}_p99_ms": pct(values, 99) for kind, values in timings.items()},
        "requests": {kind: len(values) for kind, values in timings.items()},
    }


# --- the run -----------------------------------------------------------------------------------

EF_SEARCH = (40, 100, 200)
SHIPPED_EF = 100  # SENTINEL_CACHE_EF_SEARCH's default
TIMEOUT_MS = 2000  # generous for the benchmark (the gateway gives up sooner and fails open)


def strategies(limit: int) -> list[dict]:
    """What each size is measured with: the query as shipped at several ef_search values (partition
    HNSW index or partition btree, as the planner picks), exact search, then (`"global": 1`, once a
    table-wide HNSW index is built) that index alone, with and without iterative scans."""
    found = []
    for ef in EF_SEARCH:
        found.append({"name": f"as shipped, ef_search {ef}", "sql": AS_SHIPPED, "ef": ef, "iterative": "relaxed_order"})
    found.append({"name": "exact (partition btree + sort)", "sql": EXACT, "ef": SHIPPED_EF, "iterative": "off"})
    for ef in EF_SEARCH:
        found.append(
            {
                "name": f"table-wide HNSW, ef_search {ef}",
                "sql": HNSW_ONLY,
                "ef": ef,
                "iterative": "relaxed_order",
                "global": 1,
            }
        )
    found.append(
        {
            "name": "table-wide HNSW, no iterative scan",
            "sql": HNSW_ONLY,
            "ef": SHIPPED_EF,
            "iterative": "off",
            "global": 1,
        }
    )
    for s in found:
        s["limit"] = limit
    return found


def ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def run_strategy(table: str, strategy: dict, corpus: Corpus, queries: list[Query]) -> dict:
    sql = strategy["sql"].format(table=table, limit=strategy["limit"])
    conn = connect(
        **{
            "hnsw.iterative_scan": strategy["iterative"],
            "hnsw.ef_search": strategy["ef"],
            "statement_timeout": TIMEOUT_MS,
            "jit": "off",
            # As the gateway's pool sets it: every lookup planned with its partition's value.
            "plan_cache_mode": "force_custom_plan",
            # Table-wide HNSW: a sequential scan would be cheaper for the planner on small tables; forbid it.
            **({"enable_seqscan": "off"} if strategy.get("global") else {}),
        }
    )
    try:
        keys = [corpus.partitions[q.partition].key for q in queries]
        for key, q in zip(keys, queries, strict=True):  # warm: the buffers and the plan cache
            lookup(conn, sql, key, q.vector)
        times: list[float] = []
        found = 0
        timeouts = 0
        buckets: dict[str, dict] = {}
        for key, q in zip(keys, queries, strict=True):
            spent, rows = lookup(conn, sql, key, q.vector)
            times.append(spent)
            timeouts += rows is None
            right = rows is not None and tie_or_same(rows, q)
            found += right
            bucket = buckets.setdefault(cache_data.bucket_name(corpus.partitions[q.partition].size), {"t": [], "ok": 0})
            bucket["t"].append(spent)
            bucket["ok"] += right
        plans: dict[str, dict[str, int]] = {}
        for key, q in zip(keys, queries, strict=True):
            name = cache_data.bucket_name(corpus.partitions[q.partition].size)
            plan = plan_of(conn, sql, key, q.vector)
            plans.setdefault(name, {})[plan] = plans.setdefault(name, {}).get(plan, 0) + 1
    finally:
        conn.close()
    return {
        "strategy": strategy["name"],
        "ef_search": strategy["ef"],
        "iterative_scan": strategy["iterative"],
        "p50_ms": ms(times, 50),
        "p99_ms": ms(times, 99),
        "max_ms": ms(times, 100),
        "recall_at_1": round(found / len(queries), 4),
        "timeouts": timeouts,
        "by_bucket": {
            name: {
                "queries": len(b["t"]),
                "p50_ms": ms(b["t"], 50),
                "p99_ms": ms(b["t"], 99),
                "recall_at_1": round(b["ok"] / len(b["t"]), 4),
            }
            for name, b in sorted(buckets.items())
        },
        "plans": plans,
    }


def table_ready(conn: psycopg.Connection, table: str, marker: str) -> bool:
    row = conn.execute("select obj_description(to_regclass(%s), 'pg_class')", (table,)).fetchone()
    return bool(row and row[0] == marker)


def measure_size(size: int, pool: np.ndarray, labels: np.ndarray, prompts: list[str], args) -> dict:
    table = f"bench_cache_{size}"
    marker = f"sentinel cache_scale v{DATA_VERSION} entries {size} seed {size}"
    started = time.monotonic()
    corpus = build_corpus(size, pool, labels, seed=size)
    result: dict = {"entries": size, "partitions": len(corpus.partitions), "tenants": TENANTS, "table": table}
    result["corpus_s"] = round(time.monotonic() - started, 1)
    conn = connect()
    try:
        marker += f" index rows {args.index_rows}"
        if table_ready(conn, table, marker):
            result["build"] = {"kept": "from an earlier run"}
        else:
            print(f"  {size:,} entries: filling {table} and building its indexes ...", flush=True)
            result["build"] = create_table(conn, table, corpus, prompts, seed=size, index_rows=args.index_rows)
            conn.execute(f"comment on table {table} is '{marker}'")
        conn.execute(f"drop index if exists {global_index(table)}")  # as shipped: partition indexes only
        result["storage"] = sizes_of(conn, table)
    finally:
        conn.close()
    queries = make_queries(corpus, pool, labels, args.queries, seed=size)
    result["queries"] = {
        "count": len(queries),
        "paraphrases": sum(q.kind == "paraphrase" for q in queries),
        "novel": sum(q.kind == "novel" for q in queries),
    }
    result["strategies"] = []
    for strategy in strategies(args.candidates):
        if strategy.get("global") and size in args.skip_global:
            continue
        if strategy.get("global") and "global_hnsw_build_s" not in result["build"]:
            print(f"  {size:,} entries: building one HNSW index over the whole table, for comparison ...", flush=True)
            conn = connect()
            try:
                result["build"]["global_hnsw_build_s"] = build_global_index(conn, table)
                result["storage"] = sizes_of(conn, table)
            finally:
                conn.close()
        row = run_strategy(table, strategy, corpus, queries)
        print(
            f"  {size:>9,}  {row['strategy']:<34} p50 {report.fmt(row['p50_ms']):>7} ms  "
            f"p99 {report.fmt(row['p99_ms']):>7} ms  recall@1 {row['recall_at_1']:.4f}",
            flush=True,
        )
        result["strategies"].append(row)
    if not args.keep:
        drop = connect()
        try:
            drop.execute(f"drop table if exists {table}")
        finally:
            drop.close()
    else:
        drop = connect()
        try:
            drop.execute(f"drop index if exists {global_index(table)}")  # not part of what is kept
        finally:
            drop.close()
    return result


def embed_pool(count: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    from gateway.cache import acceptance
    from gateway.cache.engine import shared_embedder

    texts, labels = cache_data.prompt_pool(count)
    embedder = shared_embedder()
    vectors = np.stack([embedder.embed_one(acceptance.normalize_prompt(t)) for t in texts]).astype(np.float32)
    return texts, cache_data.unit(vectors), labels


def plot(result: dict, path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(dict.fromkeys(r["strategy"] for s in result["sizes"] for r in s["strategies"]))
    for name in names:
        measured = [(s["entries"], r) for s in result["sizes"] for r in s["strategies"] if r["strategy"] == name]
        sizes = [entries for entries, _ in measured]
        style = "-o" if name.startswith("as shipped") else "--."
        axes[0].plot(sizes, [r["p99_ms"] for _, r in measured], style, label=name)
        axes[1].plot(sizes, [r["recall_at_1"] for _, r in measured], style, label=name)
    axes[0].axhline(5, color="red", lw=0.8, ls=":", label="target p99 5 ms")
    axes[1].axhline(0.98, color="red", lw=0.8, ls=":", label="target recall@1 0.98")
    for ax, title in ((axes[0], "semantic lookup p99 (ms, log)"), (axes[1], "recall@1 vs exact search")):
        ax.set_xscale("log")
        ax.set_xlabel("cache entries (100 tenants)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"Sentinel semantic cache at scale ({result['machine']['cores']} cores, {result['date'][:10]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cache_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="entry counts (default 10k,100k,1M)")
    parser.add_argument("--queries", type=int, default=400, help="lookups per size and strategy (default 400)")
    parser.add_argument("--candidates", type=int, default=0, help="rows a lookup returns (default: the gateway's)")
    parser.add_argument("--keep", action="store_true", help="keep the filled tables for the next run")
    parser.add_argument(
        "--skip-global",
        default="",
        help="sizes not compared with a table-wide HNSW index (its build takes long at 1M), e.g. 1000000",
    )
    parser.add_argument(
        "--index-rows",
        type=int,
        default=0,
        help="entries from which a partition gets its own HNSW index (default: SENTINEL_CACHE_PARTITION_INDEX_ROWS)",
    )
    parser.add_argument("--torch", action="store_true", help="also time sentence-transformers on torch (precision)")
    parser.add_argument("--skip-hits", action="store_true", help="do not start a gateway for the hits at the client")
    parser.add_argument("--quick", action="store_true", help="10k and 100k entries, 100 lookups, 2 hit rounds")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.replace("_", "").split(",") if s.strip()]
    args.skip_global = {int(s) for s in args.skip_global.replace("_", "").split(",") if s.strip()}
    if args.quick:
        sizes, args.queries = [s for s in sizes if s <= 100_000] or [10_000], min(args.queries, 100)
    setup_django(args.data_dir)
    from django.conf import settings

    from gateway.cache.engine import CANDIDATES

    args.candidates = args.candidates or CANDIDATES
    args.index_rows = args.index_rows or settings.CACHE_PARTITION_INDEX_ROWS
    result = report.envelope(SCENARIO, quick=args.quick)
    result["config"] = {
        "sizes": sizes,
        "tenants": TENANTS,
        "queries": args.queries,
        "candidates": args.candidates,
        "statement_timeout_ms": TIMEOUT_MS,
        "hnsw": "m 16, ef_construction 64, vector_cosine_ops (as gateway/cache/indexes.py)",
        "partition_index_rows": args.index_rows,
    }
    started = time.monotonic()
    prompts, pool, labels = embed_pool(3000)
    result["config"]["prompt_pool"] = {"prompts": len(prompts), "embedded_s": round(time.monotonic() - started, 1)}
    result["sizes"] = [measure_size(size, pool, labels, prompts, args) for size in sizes]

    print("\nembedding one 20-word prompt ...", flush=True)
    result["embedding"] = measure_embedding(100 if args.quick else 300, with_int8=False, with_torch=args.torch)
    if not args.skip_hits:
        print("exact and semantic hits at the client ...", flush=True)
        result["hits"] = measure_hits(args, rounds=2 if args.quick else 10)

    rows = []
    for size in result["sizes"]:
        for row in size["strategies"]:
            rows.append(
                [size["entries"], row["strategy"], row["p50_ms"], row["p99_ms"], row["recall_at_1"], row["timeouts"]]
            )
    print()
    print(report.table(["entries", "lookup", "p50 ms", "p99 ms", "recall@1", "timeouts"], rows, "Semantic lookup"))
    shipped = [
        [
            size["entries"],
            name,
            b["queries"],
            b["p50_ms"],
            b["p99_ms"],
            b["recall_at_1"],
            ", ".join(row["plans"].get(name, {})),
        ]
        for size in result["sizes"]
        for row in size["strategies"]
        if row["ef_search"] == SHIPPED_EF and row["strategy"].startswith("as shipped")
        for name, b in row["by_bucket"].items()
    ]
    print()
    print(
        report.table(
            ["entries", "partition size", "n", "p50 ms", "p99 ms", "recall@1", "plan"],
            shipped,
            f"As shipped (ef_search {SHIPPED_EF}), by partition size",
        )
    )
    print()
    print(
        report.table(
            ["runner", "p50 ms", "p99 ms", "min cosine to torch"],
            [[r["runner"], r["p50_ms"], r["p99_ms"], r["min_cosine_to_torch"]] for r in result["embedding"]["runners"]],
            "Embedding one 20-word prompt",
        )
    )
    if "hits" in result:
        hits = result["hits"]
        print()
        print(
            report.table(
                ["request", "n", "p50 ms", "p99 ms"],
                [
                    [kind, hits["requests"][kind], hits[f"{kind}_p50_ms"], hits[f"{kind}_p99_ms"]]
                    for kind in (
                        "direct",
                        "miss",
                        "exact_first",
                        "exact",
                        "semantic",
                        "direct_aiohttp",
                        "exact_aiohttp",
                    )
                ],
                f"At the client, one request at a time (wrong answers: {hits['wrong_answers']}, "
                f"tiers: {hits['tiers']})",
            )
        )
    path = report.write_json(args.out, SCENARIO, result)
    if result["sizes"]:
        plot(result, args.out / f"{SCENARIO}.png")
    print(f"\nwritten to {path}")
    return 0
