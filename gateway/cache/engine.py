"""The semantic cache: an exact tier (in-process LRU, then Redis) and a semantic tier (pgvector,
cosine, searched strictly inside the request's partition: exactly in a small one, through the
partition's own HNSW index in a large one (gateway/cache/indexes.py); every candidate verified before
it is served). It fails open: an embedder or database that errs or is slow sends the request upstream.

A miss must cost little, since most traffic is misses (docs/performance.md, docs/decisions.md):
- Redis counts each partition's entries, read in the same MGET as the exact key: a partition with no
  entry (every new conversation's turn is one) is neither embedded nor searched;
- it also counts the answers stored there since either tier last served one: past
  SENTINEL_CACHE_COLD_AFTER the partition is cold (nothing in it is ever asked again) and only one
  lookup in SENTINEL_CACHE_COLD_PROBE (fewer still as the count grows) searches; a hit
  in it warms it again;
- the partition is searched by a static first stage (gateway/cache/static.py, hundredths of a
  millisecond a prompt), and MiniLM embeds the prompt only when the verifier would accept an entry
  found at the highest cosine MiniLM could give it (docs/decisions.md, 15); an answer is stored with
  its static vector (its lookup's, if it searched; none in a cold partition but a probe's: probes
  search only entries that have one, and a partition that warms gives the others theirs), and
  MiniLM's when its lookup computed it;
- a tenant's entries are counted in Redis; the database is counted and trimmed only past the cap;
- the stores of the next STORE_GATHER_SECONDS are filed together: one INSERT, one Redis pipeline;
- MiniLM embeds in one thread, in batches of whatever requests are waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import numpy as np
import orjson
from django.conf import settings
from psycopg import sql
from redis import exceptions as redis_errors

from gateway.cache import acceptance
from gateway.cache.keys import CacheKey
from gateway.cache.verifier import cross as verifier_cross
from gateway.errors import invalid_request
from gateway.lua import scripts
from sentinel import async_db, redis_keys
from sentinel.localstate import GENERATION_KEY, TTLCache
from sentinel.redis_clients import async_redis, is_cluster
from sentinel.text import control_character

log = logging.getLogger(__name__)

# The first stage: the partition's STATIC_CANDIDATES nearest entries by the static model; an entry
# goes on to MiniLM only if the verifier would accept it at the highest MiniLM cosine it could have,
# its static cosine plus STATIC_SLACK (capped at 1). Over every pair of the 2,310 labeled prompts,
# MiniLM's cosine exceeded the static one by 0.475 at most and by 0.40 at the 99.9th percentile among
# pairs at or above the 0.75 floor. Streaming each topic's prompts into one partition (2,370
# lookups), the gate with 0.4 loses none of the 202 hits MiniLM's own top five give with 5 or 8
# candidates, 3 with 4; 6 leaves a margin (docs/decisions.md, 15).
STATIC_CANDIDATES = 6
STATIC_SLACK = 0.4
CANDIDATES = 5
DEFERRED_INLINE = 4  # entries filed without a static vector that a lookup embeds and weighs itself
DEFERRED_BATCH = 64  # ... and how many at a time a background backfill embeds beyond those
# Prompts embedded together at most (what is waiting when the thread is free). CPU per prompt here:
# 9.4 ms alone, 5.2 in fours, 4.2 in eights, 3.9 in 16s and 32s; every request of a batch waits for
# the whole batch, so beyond 8 the latency grows for little (on a loaded host a batch of 24 outlasted
# the lookup's 500 ms bound and all 24 went upstream).
EMBED_BATCH = 8
_exact_local = TTLCache(ttl=60.0, maxsize=20_000)
_batcher: _Batcher | None = None  # made on first use (importing starts no thread)
_backfilling: set[str] = set()  # partitions this process is embedding deferred entries of
_backfills: set[asyncio.Task] = set()
_embedder = None
_static = None
_embedder_lock = threading.Lock()
_cold_lookups = itertools.count()  # which lookups in cold partitions probe (every COLD_PROBE-th)
_seen_cold = TTLCache(ttl=60.0, maxsize=20_000)  # partitions found cold: a local exact hit warms them


# The cache's Redis keys (named in sentinel.redis_keys, with every other key).
exact_redis_key = redis_keys.exact_cache
partition_redis_key = redis_keys.cache_partition_count
partition_misses_redis_key = redis_keys.cache_partition_misses
lead_redis_key = redis_keys.cache_lead
tenant_redis_key = redis_keys.cache_tenant_count


# --- per-request controls ----------------------------------------------------------------------


@dataclass(frozen=True)
class Controls:
    no_cache: bool = False  # do not read
    no_store: bool = False  # do not write
    ttl: int | None = None  # seconds, instead of the tenant's
    namespace: str = ""


def controls_from(body: dict, headers) -> Controls:
    """From the body's `cache` object or the `x-sentinel-cache-control` / `-namespace` headers:
    {"cache": {"no-cache": true, "no-store": true, "ttl": 60, "namespace": "v2"}}
    x-sentinel-cache-control: no-cache, no-store, ttl=60"""
    values: dict = {}
    header = headers.get("x-sentinel-cache-control")
    if header:
        for item in header.split(","):
            name, _, value = item.strip().partition("=")
            values[name.strip().lower()] = value.strip() if value else True
    if headers.get("x-sentinel-cache-namespace"):
        values["namespace"] = headers["x-sentinel-cache-namespace"]
    field = body.get("cache")
    if field is not None:
        if not isinstance(field, dict):
            raise invalid_request("'cache' must be an object.", param="cache", code="invalid_type")
        values.update({k.lower(): v for k, v in field.items()})
        ttl = values.get("ttl")
        if isinstance(ttl, float) and ttl.is_integer():
            values["ttl"] = ttl = int(ttl)  # 60.0 is 60, as for every integer field (gateway.schemas.integer)
        if "ttl" in {k.lower() for k in field} and (not isinstance(ttl, int) or isinstance(ttl, bool)):
            # JSON has integers: "60" or true in the body is a client's mistake (headers carry text).
            message = "cache ttl must be a whole number of seconds."
            raise invalid_request(message, param="cache.ttl", code="invalid_type")
    unknown = set(values) - {"no-cache", "no-store", "ttl", "namespace"}
    if unknown:
        raise invalid_request(f"Unknown cache control: {sorted(unknown)[0]}.", param="cache", code="invalid_value")
    ttl = values.get("ttl")
    if ttl is not None:
        try:
            # A header's ttl is ASCII digits: int() also reads "6_0", "+60" and other scripts' digits.
            # A bare "ttl" (read as true) is no number either.
            digits = isinstance(ttl, str) and ttl.isascii() and ttl.isdigit() and len(ttl) <= 9
            if isinstance(ttl, bool) or (isinstance(ttl, str) and not digits):
                raise ValueError(ttl)
            ttl = int(ttl)
        except (TypeError, ValueError):
            raise invalid_request("cache ttl must be a whole number of seconds.", param="cache.ttl") from None
        if not 1 <= ttl <= 30 * 86400:
            raise invalid_request("cache ttl must be between 1 s and 30 days.", param="cache.ttl", code="invalid_value")
    namespace = values.get("namespace", "")
    if not isinstance(namespace, str) or len(namespace) > 100 or control_character(namespace):
        raise invalid_request(
            "cache namespace must be a string of at most 100 characters, without control characters.",
            param="cache.namespace",
        )
    for flag in ("no-cache", "no-store"):
        if not isinstance(values.get(flag, False), bool):
            raise invalid_request(f"cache {flag} must be true or false.", param=f"cache.{flag}", code="invalid_type")
    return Controls(
        no_cache=values.get("no-cache", False), no_store=values.get("no-store", False), ttl=ttl, namespace=namespace
    )


# --- embedding and the vector store ------------------------------------------------------------


def warm_up() -> None:
    """Load the embedding model (exporting it on the very first run) and embed once, so the first
    request does not pay for it. Called in a thread when a web process starts."""
    try:
        embedder = shared_embedder()
        embedder.embed_one("warm up")
        # A batch as a busy lookup sends (the prompt and the entries it could be served from): a
        # process's first runs of a new shape are slower, and a lookup has 500 ms in all.
        embedder.embed([f"warm up the embedder for prompts of about {n} words " * n for n in range(1, EMBED_BATCH + 1)])
    except Exception:
        log.exception("embedder warm-up failed")


def shared_embedder():
    """The process's one embedder (built once, under a lock: the warm-up thread and the first
    requests may ask at the same time), and beside it the static first stage distilled from it
    (gateway/cache/static.py: distilled on the very first run, then read from the models folder)
    and the verifier's cross-encoder and language identifier, loaded and run once before the
    embedder is published:
    the semantic tier waits for embedder_ready(), and its first lookups must not load a model
    inside their time limit."""
    global _embedder, _static
    with _embedder_lock:
        if _embedder is None:
            from gateway.cache.embedder import Embedder
            from gateway.cache.static import StaticEmbedder

            models = settings.DATA_DIR / "models"
            embedder = Embedder(cache_dir=models, threads=settings.EMBEDDER_THREADS)
            _static = StaticEmbedder(embedder, models)
            acceptance.warm_up()
            _embedder = embedder
    return _embedder


def shared_static():
    """The static first-stage model (loaded with the embedder)."""
    shared_embedder()
    return _static


def embedder_ready() -> bool:
    return _embedder is not None


class _Batcher:
    """One thread embedding prompts in batches: each run takes everything waiting (up to
    EMBED_BATCH), so under load many prompts share one model call (`sentinel_cache_embed_runs_total`
    counts the calls). The verifier's cross-encoder (verifier/cross.py) scores pairs in the same
    thread, never on an event loop."""

    def __init__(self) -> None:
        self.waiting: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="embed-batcher", daemon=True).start()

    def submit(self, texts: list, *, score: bool = False) -> asyncio.Future:
        """The texts' embeddings, or with score=True (texts are pairs of prompts) their cross-encoder
        scores."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting.put((texts, future, loop, score))
        return future

    def _run(self) -> None:
        while True:
            jobs = [self.waiting.get()]
            size = len(jobs[0][0])
            while size < EMBED_BATCH:
                try:
                    job = self.waiting.get_nowait()
                except queue.Empty:
                    break
                jobs.append(job)
                size += len(job[0])
            # A request that stopped waiting (its lookup timed out) needs nothing embedded any more.
            jobs = [job for job in jobs if not job[1].done()]
            for score in (False, True):
                if kind := [job for job in jobs if job[3] is score]:
                    self._serve(kind, score=score)

    def _serve(self, jobs: list, *, score: bool) -> None:
        try:
            texts = [text for texts, _, _, _ in jobs for text in texts]
            if score:
                results = verifier_cross.shared_scorer().score(texts)
            else:
                results = shared_embedder().embed(texts)
                _metrics().cache_embed_run()
            outcome, start = [], 0
            for texts, _, _, _ in jobs:
                outcome.append((results[start : start + len(texts)], None))
                start += len(texts)
        except Exception as exc:  # noqa: BLE001 - handed to every waiting request, which fails open
            outcome = [(None, exc)] * len(jobs)
        for (_, future, loop, _), (result, error) in zip(jobs, outcome, strict=True):
            with contextlib.suppress(RuntimeError):  # that request's event loop has closed meanwhile
                loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():  # the request gave up waiting (its lookup timed out)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def batcher() -> _Batcher:
    global _batcher
    with _embedder_lock:
        if _batcher is None:
            _batcher = _Batcher()
    return _batcher


async def embed_many(texts: list[str]) -> np.ndarray:
    return await batcher().submit(texts)


async def embed(text: str):
    return (await embed_many([text]))[0]


async def _verified(candidate: _Candidate, prompt: str, similarity: float) -> acceptance.Verdict:
    """verify()'s verdict on serving the candidate for `prompt`: by the words first, then (only if
    they leave it to the cross-encoder) with the pair's score, from the embedder's thread, kept on
    the candidate (the gate and the final check ask twice, at two cosines)."""
    if candidate.score is not None:
        return acceptance.verify(candidate.prompt, prompt, similarity, score=candidate.score)
    verdict = acceptance.by_words(candidate.prompt, prompt, similarity)
    if verdict.final:
        return verdict
    (candidate.score,) = await batcher().submit([acceptance.cross_texts(candidate.prompt, prompt)], score=True)
    return acceptance.by_cross(similarity, verdict, candidate.score)


async def _configure(connection) -> None:
    from pgvector.psycopg import register_vector_async

    await register_vector_async(connection)
    await connection.execute("set hnsw.iterative_scan = relaxed_order")
    # Plan each lookup with its partition's value, so the planner can pick that partition's own index.
    await connection.execute("set plan_cache_mode = force_custom_plan")
    await connection.execute(f"set hnsw.ef_search = {int(settings.CACHE_EF_SEARCH)}")
    await connection.execute(f"set statement_timeout = {int(settings.CACHE_LOOKUP_TIMEOUT_MS)}")


async def pool():
    """This event loop's pool for the vector store (sentinel.async_db: off Django's ORM, which would
    serialize queries through one thread)."""
    return await async_db.pool("vector store", _configure, url=settings.CACHE_DATABASE_URL)


async def close_pool() -> None:
    """Close this event loop's pool (for commands that run one loop and exit), after the stores and
    deferred embeddings still being written."""
    loop = asyncio.get_running_loop()
    if loop in _gathering:
        _start_write(loop)
    await asyncio.gather(*(t for t in _backfills if t.get_loop() is loop), return_exceptions=True)
    await async_db.close("vector store")


# --- lookup ------------------------------------------------------------------------------------


@dataclass
class Hit:
    tier: str  # hit-exact | hit-semantic
    answer: dict
    entry_id: int
    cost_usd: Decimal
    similarity: float | None = None


@dataclass
class Lookup:
    hit: Hit | None
    embedding: object = None  # computed for the semantic tier; reused when the answer is stored
    static: object = None  # the static first stage's vector of the prompt, if the lookup searched
    # The partition is cold and this lookup no probe: the answer is filed without a static vector (a
    # later lookup there gives it one if the partition warms: _static_deferred, _backfill).
    deferred: bool = False
    # This request holds the lead on its exact key (identical requests wait for its answer): let go
    # when its answer is stored, or by release() when it ends without storing one.
    led: bool = False


@dataclass
class Partition:
    """What the exact tier's MGET says of the request's partition."""

    entries: int = 0  # answers stored there (never fewer than it holds)
    misses: int = 0  # answers stored since either tier last served one there

    @property
    def cold(self) -> bool:
        return 0 < settings.CACHE_COLD_AFTER <= self.misses

    @property
    def probe_every(self) -> int:
        """In a cold partition, one lookup in this many searches: COLD_PROBE, doubled each time the
        answers stored with no hit quadruple, up to 4 times COLD_PROBE (16, then 32 from 4 times the
        threshold, 64 from 16 times). The longer nothing is served, the rarer the probes."""
        base = max(settings.CACHE_COLD_PROBE, 1)
        if not self.cold:
            return 1
        doublings = 0
        while doublings < 2 and self.misses >= settings.CACHE_COLD_AFTER * 4 ** (doublings + 1):
            doublings += 1
        return base << doublings


async def lookup(
    key: CacheKey, *, tenant_id: int, semantic: bool, threshold: float | None, lead: str | None = None
) -> Lookup:
    """Exact tier, then (if allowed) the semantic tier. Fails open: any error or a lookup slower
    than SENTINEL_CACHE_LOOKUP_TIMEOUT_MS is logged and reported as a miss.

    `lead`: the request's id, if its answer will be stored. On an exact miss it takes the lead on
    its key (Lookup.led), unless an identical request holds it: then it waits for that request's
    answer (up to SENTINEL_CACHE_COALESCE_MS), served from the exact tier like a repeat, and asks
    the provider only if none comes (the other failed, or its answer is not one to store)."""
    found = Lookup(None)
    try:
        wants_semantic = semantic and key.semantic
        found.hit, part, found.led = await _exact_or_wait(key, count_partition=wants_semantic, lead=lead)
        # Until the model has loaded (a few seconds after start) the semantic tier is skipped, not waited for.
        if found.hit is None and wants_semantic and embedder_ready():
            if not part.entries:
                # Nothing stored in this partition: nothing to find, so nothing to embed or search.
                # A conversation's partition (an answer before the prompt) is seldom asked again:
                # its answer is filed without a static vector, which the first lookup that finds
                # entries there gives it (_static_deferred). A partition with no conversation
                # behind it (the tenant's, or one system prompt's) is its users' common one, whose
                # first answers are asked again at once: they are filed with theirs.
                _metrics().cache_semantic("skipped_empty")
                found.deferred = key.conversation
                return found
            if part.cold:
                _seen_cold.set(key.partition, True)
                if next(_cold_lookups) % part.probe_every:
                    # Nothing served here for COLD_AFTER answers: not even the first stage is searched,
                    # and the answer is stored without a static vector (only probes search, and
                    # they search only entries that have one: its partition's HNSW index would take
                    # it in for lookups that do not come).
                    _metrics().cache_semantic("skipped_cold")
                    found.deferred = True
                    return found
            _metrics().cache_semantic("searched")
            found.static = shared_static().embed_one(key.prompt)
            async with asyncio.timeout(settings.CACHE_LOOKUP_TIMEOUT_MS / 1000):
                found.hit, found.embedding = await _semantic(
                    key, tenant_id, threshold or acceptance.DEFAULT_THRESHOLD, found.static, cold=part.cold
                )
        if found.hit is not None and wants_semantic:
            _warm(key.partition, part)
    except Exception as exc:  # noqa: BLE001 - the cache must never fail a request
        log.warning("cache lookup failed open: %s: %s", type(exc).__name__, exc)
        record_failure("lookup")
    return found


def _metrics():
    # Imported on first use: sentinel.run imports this module before prometheus_client may be.
    from gateway import metrics

    return metrics


def record_failure(stage: str) -> None:
    _metrics().cache_failure(stage)


async def _exact(
    key: CacheKey, *, count_partition: bool, lead: str | None = None
) -> tuple[Hit | None, Partition, bool | None]:
    """The exact tier, and (when asked) the partition's counts, in one round trip; with `lead`, a
    miss also tries to take the lead on the key (cache_lookup.lua): True if taken, False if another
    request holds it, None if not tried. A hit from this process's memory reads no counts
    (Partition(1): not empty, not known to be cold)."""
    stored = _exact_local.get(key.exact)
    part = Partition()
    led = None
    if stored is None or count_partition:
        if stored is None or _expired(stored):
            counts = [partition_redis_key(key.partition), partition_misses_redis_key(key.partition)]
            if stored is None:
                exact = exact_redis_key(key.exact, key.partition)
                if lead is None:
                    raw, entries, misses = await async_redis().mget(exact, *counts)
                else:
                    keys = [exact, *counts, lead_redis_key(key.exact, key.partition)]
                    raw, entries, misses, taken = await scripts.cache_lookup(keys, [lead, settings.CACHE_COALESCE_MS])
                    led = None if raw is not None else bool(taken)
                if raw is not None:
                    stored = orjson.loads(raw)
                    _exact_local.set(key.exact, stored)
            else:
                entries, misses = await async_redis().mget(*counts)
            part = Partition(int(entries or 0), int(misses or 0))
        else:
            part = Partition(1)
    if stored is None:
        return None, part, led
    if _expired(stored):
        _exact_local.pop(key.exact)
        return None, part, led
    return _exact_hit(stored), part, led


def _exact_hit(stored: dict) -> Hit:
    """A hit from the exact tier's stored value."""
    return Hit("hit-exact", stored["answer"], stored["id"], Decimal(stored["cost_usd"]))


# How often a request waiting for an identical one's answer looks for it: from the first interval,
# doubling up to the last.
WAIT_POLL_SECONDS = (0.005, 0.05)


async def _exact_or_wait(
    key: CacheKey, *, count_partition: bool, lead: str | None
) -> tuple[Hit | None, Partition, bool]:
    """The exact tier; on a miss while an identical request holds the key's lead, that request's
    answer once it is stored. If the lead is let go with no answer (that request failed, or its
    answer is not one to store) or the wait reaches SENTINEL_CACHE_COALESCE_MS, a miss: each
    request that waited asks the provider itself, at once (not one after another)."""
    if lead is None or settings.CACHE_COALESCE_MS <= 0:
        hit, part, _ = await _exact(key, count_partition=count_partition)
        return hit, part, False
    hit, part, led = await _exact(key, count_partition=count_partition, lead=lead)
    if led is not False:
        return hit, part, bool(led)
    deadline = time.monotonic() + settings.CACHE_COALESCE_MS / 1000
    keys = (exact_redis_key(key.exact, key.partition), lead_redis_key(key.exact, key.partition))
    interval = WAIT_POLL_SECONDS[0]
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(interval, left))
        interval = min(interval * 2, WAIT_POLL_SECONDS[1])
        raw, holder = await async_redis().mget(*keys)
        if raw is not None:
            stored = orjson.loads(raw)
            if not _expired(stored):
                _exact_local.set(key.exact, stored)
                _metrics().cache_coalesced("served")
                return _exact_hit(stored), part, False
        if holder is None:
            _metrics().cache_coalesced("released")
            return None, part, False
    _metrics().cache_coalesced("timeout")
    return None, part, False


def release(key: CacheKey | None, found: Lookup) -> None:
    """Let go of the lead on the key (a request that held it and stores no answer), off this task."""
    if key is None or not found.led:
        return
    found.led = False
    _in_background(_release(key))


async def _release(key: CacheKey) -> None:
    try:
        await async_redis().delete(lead_redis_key(key.exact, key.partition))
    except Exception as exc:  # noqa: BLE001 - the lead expires by itself (SENTINEL_CACHE_COALESCE_MS)
        log.warning("cache lead not let go: %s: %s", type(exc).__name__, exc)


def _warm(partition: str, part: Partition) -> None:
    """A hit: the partition's count of answers since the last hit starts again. Written only once
    it is a quarter of the way to cold (or known cold here), so a partition with steady hits
    rarely pays the extra command, and never on the response's path."""
    threshold = settings.CACHE_COLD_AFTER
    known_cold = bool(_seen_cold.get(partition))
    if known_cold:
        _seen_cold.pop(partition)
    if threshold <= 0 or not (known_cold or part.misses >= max(threshold // 4, 1)):
        return
    _in_background(_reset_misses(partition))


async def _reset_misses(partition: str) -> None:
    try:
        await async_redis().delete(partition_misses_redis_key(partition))
    except Exception as exc:  # noqa: BLE001 - a partition left cold a while longer
        log.warning("cache partition not warmed: %s: %s", type(exc).__name__, exc)


def _expired(stored: dict) -> bool:
    return stored["expires"] <= datetime.now(UTC).timestamp()


@dataclass(slots=True)
class _Candidate:
    entry_id: int
    prompt: str
    answer: dict
    cost_usd: Decimal
    embedding: object  # MiniLM's vector, if a lookup has computed it before
    similarity: float  # the static first stage's cosine to the prompt asked
    score: float | None = None  # the cross-encoder's score of it against the prompt, once asked


async def _semantic(
    key: CacheKey, tenant_id: int, threshold: float, static, *, cold: bool
) -> tuple[Hit | None, object]:
    """The partition's nearest entries to `static` (the prompt's static vector) by the first stage;
    MiniLM only for those the verifier could serve. Returns the hit (or None) and MiniLM's vector of
    the prompt, if computed."""
    # The lookup's time limit cancels this coroutine, never the search: a task cancelled inside its
    # pipeline can hand its connection back still in pipeline mode (async_db then closes it). The
    # search ends on its own, bounded by the connection's statement_timeout; a late answer is dropped.
    search = asyncio.get_running_loop().create_task(_search(key.partition, static, deferred=not cold))
    _backfills.add(search)
    search.add_done_callback(_search_done)
    candidates, pending = await asyncio.shield(search)
    if len(pending) > DEFERRED_INLINE:
        # Entries filed before the first stage existed: their vectors are written in the background.
        _start_backfill(key.partition)
    elif pending:
        candidates += _static_deferred(pending, static)
    # The gate. The pair model's probability rises with the cosine (its one feature that depends on
    # it, with a positive weight), so an entry the verifier rejects at the highest cosine MiniLM could
    # give it, it rejects at any: only the others are worth MiniLM's 3-10 ms. A miss whose entries all
    # differ in a number, a quoted text, a language, ... costs no embedding at all, and one the
    # lexical gate lets through costs the cross-encoder's score (a few milliseconds), not MiniLM's.
    possible = []
    for candidate in sorted(candidates, key=lambda c: -c.similarity):
        ceiling = min(1.0, candidate.similarity + STATIC_SLACK)
        if ceiling >= threshold and (await _verified(candidate, key.prompt, ceiling)).accepted:
            possible.append(candidate)
            if len(possible) == CANDIDATES:
                break
    if not possible:
        return None, None
    # Embedding happens with the connection back in the pool: holding connections while waiting
    # for the embedder starved the other lookups of them.
    unembedded = [candidate for candidate in possible if candidate.embedding is None]
    vectors = await embed_many([key.prompt, *(candidate.prompt for candidate in unembedded)])
    embedding = vectors[0]
    _metrics().cache_embedded("query")
    if unembedded:
        _metrics().cache_embedded("deferred", len(unembedded))
        for candidate, vector in zip(unembedded, vectors[1:], strict=True):
            candidate.embedding = vector
        _in_background(_write_vectors("embedding", [c.entry_id for c in unembedded], vectors[1:]))
    scored = [(float(_array(c.embedding) @ embedding), c) for c in possible]
    for similarity, candidate in sorted(scored, key=lambda pair: -pair[0]):
        if similarity < threshold:
            break
        verdict = await _verified(candidate, key.prompt, similarity)
        if verdict.accepted:
            return Hit("hit-semantic", candidate.answer, candidate.entry_id, candidate.cost_usd, similarity), embedding
    return None, embedding


def _array(vector) -> np.ndarray:
    """A vector as the search returned it (pgvector's Vector when read in binary) or as embedded."""
    return vector.to_numpy() if hasattr(vector, "to_numpy") else np.asarray(vector, dtype=np.float32)


def _search_done(search: asyncio.Task) -> None:
    _backfills.discard(search)
    if not search.cancelled():
        search.exception()  # retrieved: a search whose lookup gave up already counted as failed open


async def _search(partition: str, static, *, deferred: bool) -> tuple[list[_Candidate], list]:
    """The partition's nearest entries by the static first stage, and (if asked) up to
    DEFERRED_INLINE + 1 filed without a static vector."""
    async with (await pool()).connection() as conn:
        async with conn.pipeline():
            searched = await conn.execute(
                "select id, prompt, answer, cost_usd, embedding, 1 - (static_embedding <=> %s) as similarity "
                "from gateway_cacheentry where partition = %s and expires_at > now() "
                "and static_embedding is not null order by static_embedding <=> %s limit %s",
                (static, partition, static, STATIC_CANDIDATES),
            )
            pending = (
                await conn.execute(
                    "select id, prompt, answer, cost_usd, embedding from gateway_cacheentry "
                    "where partition = %s and expires_at > now() and static_embedding is null limit %s",
                    (partition, DEFERRED_INLINE + 1),
                )
                if deferred
                else None
            )
        rows = await searched.fetchall()
        candidates = [
            _Candidate(i, prompt, answer, cost, vector, float(sim)) for i, prompt, answer, cost, vector, sim in rows
        ]
        return candidates, (await pending.fetchall() if pending else [])


def _static_deferred(pending: list, static) -> list[_Candidate]:
    """Entries filed without a static vector: embed them now (a few hundredths of a millisecond
    each), write the vectors after this request, and return them with their cosine to the prompt."""
    vectors = shared_static().embed([row[1] for row in pending])
    _in_background(_write_vectors("static_embedding", [row[0] for row in pending], vectors))
    similarities = vectors @ static
    return [
        _Candidate(entry_id, prompt, answer, cost, vector, float(similarity))
        for (entry_id, prompt, answer, cost, vector), similarity in zip(pending, similarities, strict=True)
    ]


async def _write_vectors(column: str, ids: list[int], vectors) -> None:
    """Write vectors computed at a lookup into `column` of rows that had none."""
    statement = sql.SQL("update gateway_cacheentry set {0} = %s where id = %s and {0} is null").format(
        sql.Identifier(column)
    )
    try:
        async with (await pool()).connection() as conn, conn.cursor() as cursor:
            await cursor.executemany(statement, [(v, entry_id) for v, entry_id in zip(vectors, ids, strict=True)])
    except Exception as exc:  # noqa: BLE001 - left as they were: a later lookup computes them again
        log.warning("cache vectors not written: %s: %s", type(exc).__name__, exc)


def _start_backfill(partition: str) -> None:
    if partition in _backfilling:
        return
    _backfilling.add(partition)
    _in_background(_backfill(partition))


def _in_background(work) -> None:
    """Cache work after (or beside) the request, kept in _backfills: close_pool waits for it."""
    task = asyncio.get_running_loop().create_task(work)
    _backfills.add(task)
    task.add_done_callback(_backfills.discard)


async def _backfill(partition: str) -> None:
    """Give a partition's entries filed without a static vector theirs, DEFERRED_BATCH at a time."""
    try:
        while True:
            async with (await pool()).connection() as conn:
                pending = await (
                    await conn.execute(
                        "select id, prompt from gateway_cacheentry "
                        "where partition = %s and expires_at > now() and static_embedding is null limit %s",
                        (partition, DEFERRED_BATCH),
                    )
                ).fetchall()
            if not pending:
                return
            vectors = shared_static().embed([prompt for _, prompt in pending])
            await _write_vectors("static_embedding", [row[0] for row in pending], vectors)
            await asyncio.sleep(0)  # other requests between batches
    except Exception as exc:  # noqa: BLE001 - the next lookup in the partition starts it again
        log.warning("cache backfill failed: %s: %s", type(exc).__name__, exc)
    finally:
        _backfilling.discard(partition)


TOUCH_FLUSH_SECONDS = 0.2  # hits are written in one statement per process at most this often
_touches: dict[int, int] = {}  # entry id → hits not yet written
_flush_loop: asyncio.AbstractEventLoop | None = None  # the loop a flush is scheduled on
_flushes: set[asyncio.Task] = set()


def note_hit(entry_id: int) -> None:
    """A hit: the entry is recently used (eviction is least-recently-used). Counted in memory and
    written with every other hit of the next TOUCH_FLUSH_SECONDS in one UPDATE, off the request."""
    global _flush_loop
    _touches[entry_id] = _touches.get(entry_id, 0) + 1
    loop = asyncio.get_running_loop()
    if _flush_loop is not loop:
        _flush_loop = loop
        loop.call_later(TOUCH_FLUSH_SECONDS, _start_flush, loop)


def _start_flush(loop: asyncio.AbstractEventLoop) -> None:
    global _flush_loop
    if _flush_loop is loop:
        _flush_loop = None
    task = loop.create_task(flush_hits())
    _flushes.add(task)
    task.add_done_callback(_flushes.discard)


async def flush_hits() -> None:
    """Write the hits counted so far: last_hit_at and hits of every entry hit, in one statement."""
    if not _touches:
        return
    batch = dict(_touches)
    _touches.clear()
    try:
        async with (await pool()).connection() as conn:
            await conn.execute(
                "update gateway_cacheentry as c set last_hit_at = now(), hits = c.hits + t.n "
                "from unnest(%s::bigint[], %s::int[]) as t(id, n) where c.id = t.id",
                (list(batch), list(batch.values())),
            )
    except Exception as exc:  # noqa: BLE001 - bookkeeping; never worth failing anything
        log.warning("cache touch failed: %s", exc)


# --- store -------------------------------------------------------------------------------------


# Stores that come within this long of each other are written together: one INSERT of all their
# rows and one Redis pipeline (a commit and two round trips for the lot, not for each). An answer is
# stored after its response, so the wait delays only when a repeat of it can be served.
STORE_GATHER_SECONDS = 0.02
STORE_BATCH = 64  # rows in one INSERT at most


@functools.lru_cache(maxsize=STORE_BATCH)
def _insert(rows: int) -> sql.Composed:
    """The INSERT of `rows` cache entries, returning their ids in the order of its VALUES list (as
    PostgreSQL does, and Django's bulk_create relies on)."""
    row = sql.SQL("(%s, %s, %s, %s, %s, %s, %s, %s, %s, now(), %s, 0)")
    return sql.SQL(
        "insert into gateway_cacheentry (tenant_id, partition, exact_digest, model, prompt, embedding, "
        "static_embedding, answer, cost_usd, created_at, expires_at, hits) values {} returning id"
    ).format(sql.SQL(", ").join([row] * rows))


@dataclass(slots=True)
class _Store:
    key: CacheKey
    tenant_id: int
    model: str
    answer: dict
    cost_usd: Decimal
    ttl: int
    max_entries: int
    embedding: object
    static: object  # the static vector its lookup computed, or None
    deferred: bool  # filed without a static vector (Lookup.deferred)
    asked_at: float  # when its request was received (unix time): a clear of the cache since drops it
    written: asyncio.Future


_gathering: dict[asyncio.AbstractEventLoop, list[_Store]] = {}  # stores waiting for their loop's next write


async def store(
    key: CacheKey,
    *,
    tenant_id: int,
    model: str,
    answer: dict,
    cost_usd: Decimal,
    ttl: int,
    max_entries: int,
    embedding=None,
    semantic: bool,
    static=None,
    deferred: bool = False,
    asked_at: float | None = None,
) -> None:
    """File an answer under its key (after the response was sent), with the embedding its lookup
    computed or without one (a lookup in its partition embeds it later, if one ever comes); count
    it in Redis; past the tenant's cap, evict its least recently used entries. Written with the
    other stores of the next STORE_GATHER_SECONDS; returns once it is (or has failed: logged).
    `static`: the static first stage's vector its lookup computed (else it is computed here, unless
    `deferred`: its lookup found the partition cold and was no probe; then the answer is filed
    without one, and neither the web process nor PostgreSQL (the partition's HNSW index) pays for a
    vector that the cold partition's probes do not search; a probe's answer has one, so a later
    probe can find its paraphrase; if the partition warms, its lookups give the others theirs:
    _static_deferred, _backfill).
    `asked_at`: when the request was received (default now); if the tenant's cache was cleared since
    (the admin's "Clear the cache"), the answer is not kept."""
    loop = asyncio.get_running_loop()
    waiting = _gathering.get(loop)
    if waiting is None:
        waiting = _gathering[loop] = []
        loop.call_later(STORE_GATHER_SECONDS, _start_write, loop)
    asked = time.time() if asked_at is None else asked_at
    entry = _Store(
        key,
        tenant_id,
        model,
        answer,
        cost_usd,
        ttl,
        max_entries,
        embedding,
        static,
        deferred,
        asked,
        loop.create_future(),
    )
    waiting.append(entry)
    await asyncio.shield(entry.written)


def _start_write(loop: asyncio.AbstractEventLoop) -> None:
    batch = _gathering.pop(loop, [])
    for start in range(0, len(batch), STORE_BATCH):
        _in_background(_write_stores(batch[start : start + STORE_BATCH]))


async def _write_stores(batch: list[_Store]) -> None:
    """Insert the rows, then, in one pipeline, set their exact keys and count them (the partitions'
    counts and each tenant's); a tenant whose count is new or past its cap is counted and trimmed
    in the database. A lost store costs a future miss, nothing more: logged, never raised."""
    try:
        now = datetime.now(UTC)
        expiries = [now + timedelta(seconds=entry.ttl) for entry in batch]
        # An answer the semantic tier may serve is filed with its static vector (the first stage
        # searches them): its lookup's, or computed here (a few hundredths of a millisecond each),
        # unless deferred. MiniLM's only if its lookup computed it.
        missing = [e for e in batch if e.key.semantic and e.static is None and not e.deferred]
        vectors = shared_static().embed([entry.key.prompt for entry in missing]) if missing else []
        statics = {id(entry): vector for entry, vector in zip(missing, vectors, strict=True)}
        params = [
            value
            for entry, expires in zip(batch, expiries, strict=True)
            for value in (
                entry.tenant_id,
                entry.key.partition,
                entry.key.exact,
                entry.model,
                entry.key.prompt,
                entry.embedding,
                entry.static if entry.static is not None else statics.get(id(entry)),
                orjson.dumps(entry.answer).decode(),
                entry.cost_usd,
                expires,
            )
        ]
        async with (await pool()).connection() as conn:
            ids = await (await conn.execute(_insert(len(batch)), params)).fetchall()
            # One script per answer (its exact key and its partition's counts: one slot) and one
            # INCRBY per tenant: a fifth of the commands of a command each, and less than half the
            # client's CPU.
            by_tenant: dict[int, list[_Store]] = {}
            queued: list[tuple[list[str], list]] = []
            for entry, expires, (entry_id,) in zip(batch, expiries, ids, strict=True):
                stored = {
                    "id": entry_id,
                    "answer": entry.answer,
                    "cost_usd": str(entry.cost_usd),
                    "expires": expires.timestamp(),
                }
                # Counted even with the tenant's semantic tier off, for when it is on.
                queued.append((_store_keys(entry.key), [orjson.dumps(stored), entry.ttl, int(entry.key.semantic)]))
                by_tenant.setdefault(entry.tenant_id, []).append(entry)
            cluster = is_cluster()
            if cluster:
                # redis-py's cluster pipeline refuses scripts: each is sent on its own, all at once.
                await asyncio.gather(*(scripts.cache_store(keys, args) for keys, args in queued))
            async with async_redis().pipeline(transaction=False) as pipe:
                if not cluster:
                    for keys, args in queued:
                        scripts.cache_store.queue(pipe, keys, args)
                counts_at = {}
                for tenant, entries in by_tenant.items():
                    counts_at[tenant] = len(pipe)
                    pipe.incrby(tenant_redis_key(tenant), len(entries))
                # Read after the rows are committed and the keys set: a clear that this does not see
                # set its time later, so it read the entries to delete after these rows were in.
                tenants = sorted(by_tenant)
                cleared_at = len(pipe)
                for tenant in tenants:
                    pipe.get(redis_keys.cache_tenant_cleared(tenant))
                results = await pipe.execute(raise_on_error=False)
            await _rerun_unloaded([] if cluster else queued, results)
            cleared = dict(zip(tenants, results[cleared_at:], strict=True))
            stale = [
                (entry, entry_id)
                for entry, (entry_id,) in zip(batch, ids, strict=True)
                if cleared[entry.tenant_id] is not None
                and entry.asked_at < float(cleared[entry.tenant_id]) + CLEARED_CLOCK_MARGIN
            ]
            if stale:
                await _take_back(conn, stale)
            # Each tenant's count after every row of the batch, and its cap; a count no higher than
            # the batch's rows is a counter this batch started.
            counted: dict[int, tuple[int, int]] = {}
            recount: set[int] = set()
            for tenant, entries in by_tenant.items():
                count, max_entries = results[counts_at[tenant]], entries[-1].max_entries
                counted[tenant] = (count, max_entries)
                if count <= len(entries) or count > max_entries:
                    recount.add(tenant)
            for tenant in recount:
                # A new counter (Redis lost it, or the first entry) is set from the database; past the
                # cap the database is counted and trimmed, by one process at a time (any other skips:
                # the count it took is in the one trimming's).
                # redis-py's lock: released only by its holder (a trim that outlived the lock must
                # not release the next one's), never waited for.
                trimming = async_redis().lock(
                    redis_keys.cache_tenant_trimming(tenant),
                    timeout=TRIM_LOCK_MS / 1000,
                    blocking=False,
                    thread_local=False,
                    raise_on_release_error=False,
                )
                if await trimming.acquire():
                    try:
                        count, max_entries = counted[tenant]
                        await _evict(conn, tenant, max_entries, count)
                    finally:
                        await trimming.release()
    except Exception as exc:  # noqa: BLE001 - a lost cache store costs a future miss, nothing more
        log.warning("cache store failed (%d answers): %s: %s", len(batch), type(exc).__name__, exc)
        for entry in batch:
            record_failure("store")
            _in_background(_release(entry.key))  # whoever waits for these answers asks for them
    finally:
        for entry in batch:
            if not entry.written.done():
                entry.written.set_result(None)


def _store_keys(key: CacheKey) -> list[str]:
    return [
        exact_redis_key(key.exact, key.partition),
        partition_redis_key(key.partition),
        partition_misses_redis_key(key.partition),
        lead_redis_key(key.exact, key.partition),
    ]


async def _rerun_unloaded(queued: list[tuple[list[str], list]], results: list) -> None:
    """Run again, one by one, the stores whose script Redis did not have (a restarted Redis, a new
    cluster node: NOSCRIPT, so nothing of it ran); raise any other error of the pipeline."""
    for result in results:
        if isinstance(result, Exception) and not isinstance(result, redis_errors.NoScriptError):
            raise result
    for (keys, args), result in zip(queued, results, strict=False):  # the scripts come first
        if isinstance(result, redis_errors.NoScriptError):
            # The script's call falls back to EVAL, which loads it on the node that runs it.
            await scripts.cache_store(keys, args)


# A clear's time and a request's are read from the clocks of two processes, maybe of two hosts: an
# answer to a request received up to this long after a clear is not kept either (a future miss).
CLEARED_CLOCK_MARGIN = 1.0


async def _take_back(conn, stale: list[tuple[_Store, int]]) -> None:
    """Delete rows just filed for requests received before their tenant's cache was cleared, and
    their exact keys; and retire every process's in-memory copies (a lookup may have read a key in
    the moment it was set), as the clear itself does."""
    await conn.execute("delete from gateway_cacheentry where id = any(%s)", ([entry_id for _, entry_id in stale],))
    async with async_redis().pipeline(transaction=False) as pipe:
        for entry, _ in stale:
            pipe.delete(exact_redis_key(entry.key.exact, entry.key.partition))
        pipe.incr(GENERATION_KEY)
        await pipe.execute()
    log.info("cache: %d answers to requests received before their tenant's cache was cleared, not kept", len(stale))


# Past its cap, a tenant's least recently used entries are deleted until it is a 1/EVICT_SHARE of the
# cap below it (just to the cap under 20 entries), so a full cache is counted and trimmed once per
# cap / EVICT_SHARE stores, not on every store: at 50,000 entries the count and the LRU order cost
# PostgreSQL about 66 ms (docs/cache.md).
EVICT_SHARE = 20
TRIM_LOCK_MS = 30_000  # how long a process that stopped mid-trim keeps the others from trimming


async def _evict(conn, tenant_id: int, max_entries: int, counted: int) -> None:
    count = (
        await (
            await conn.execute("select count(*) from gateway_cacheentry where tenant_id = %s", (tenant_id,))
        ).fetchone()
    )[0]
    keep = max_entries - max_entries // EVICT_SHARE if count > max_entries else count
    # Down by what the counter overstated (evictions, invalidations, expiry) and what is deleted here;
    # stores counted since this one's INCR stay counted.
    await async_redis().decrby(tenant_redis_key(tenant_id), counted - keep)
    if count <= keep:
        return
    rows = await (
        await conn.execute(
            "delete from gateway_cacheentry where id in (select id from gateway_cacheentry where tenant_id = %s "
            "order by coalesce(last_hit_at, created_at) asc, id asc limit %s) returning exact_digest, partition",
            (tenant_id, count - keep),
        )
    ).fetchall()
    if rows:
        await async_redis().delete(*(exact_redis_key(digest, partition) for digest, partition in rows))
