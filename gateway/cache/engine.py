"""The semantic cache: an exact tier (in-process LRU, then Redis) and a semantic tier (pgvector,
cosine, searched strictly inside the request's partition: exactly in a small one, through the
partition's own HNSW index in a large one (gateway/cache/indexes.py); every candidate verified before
it is served). It fails open: an embedder or database that errs or is slow sends the request upstream.
New entries are embedded and stored after the response, off the request path.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import orjson
from django.conf import settings

from gateway.cache import acceptance
from gateway.cache.keys import CacheKey
from gateway.errors import invalid_request
from gateway.localstate import TTLCache
from sentinel.redis_clients import async_redis
from sentinel.text import control_character

log = logging.getLogger(__name__)

CANDIDATES = 5
_exact_local = TTLCache(ttl=60.0, maxsize=20_000)
_pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_embed_thread: ThreadPoolExecutor | None = None  # made on first use (importing starts no thread)
_embedder = None
_embedder_lock = threading.Lock()


def exact_redis_key(digest: str) -> str:
    return f"sentinel:cache:{digest}"


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
        shared_embedder().embed_one("warm up")
    except Exception:  # noqa: BLE001 - without an embedder the semantic tier fails open
        log.exception("embedder warm-up failed")


def shared_embedder():
    """The process's one embedder (built once, under a lock: the warm-up thread and the first
    requests may ask at the same time)."""
    global _embedder
    with _embedder_lock:
        if _embedder is None:
            from gateway.cache.embedder import Embedder

            _embedder = Embedder(cache_dir=settings.DATA_DIR / "models", threads=settings.EMBEDDER_THREADS)
    return _embedder


def embedder_ready() -> bool:
    return _embedder is not None


def embed_thread() -> ThreadPoolExecutor:
    global _embed_thread
    with _embedder_lock:
        if _embed_thread is None:
            _embed_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
    return _embed_thread


async def embed(text: str):
    return await asyncio.get_running_loop().run_in_executor(embed_thread(), shared_embedder().embed_one, text)


async def _configure(connection) -> None:
    from pgvector.psycopg import register_vector_async

    await register_vector_async(connection)
    await connection.execute("set hnsw.iterative_scan = relaxed_order")
    # Plan each lookup with its partition's value, so the planner can pick that partition's own index.
    await connection.execute("set plan_cache_mode = force_custom_plan")
    await connection.execute(f"set hnsw.ef_search = {int(settings.CACHE_EF_SEARCH)}")
    await connection.execute(f"set statement_timeout = {int(settings.CACHE_LOOKUP_TIMEOUT_MS)}")


async def pool():
    """A small async psycopg pool per event loop, for the vector store (off Django's ORM, which would
    serialize queries through one thread)."""
    from psycopg.conninfo import make_conninfo
    from psycopg_pool import AsyncConnectionPool

    loop = asyncio.get_running_loop()
    existing = _pools.get(loop)
    if existing is None:
        if settings.CACHE_DATABASE_URL:
            conninfo = settings.CACHE_DATABASE_URL
        else:
            from django.db import connections

            params = connections["default"].get_connection_params()
            wanted = ("dbname", "user", "password", "host", "port")
            conninfo = make_conninfo(**{k: v for k, v in params.items() if k in wanted and v})
        existing = AsyncConnectionPool(
            conninfo, min_size=1, max_size=8, kwargs={"autocommit": True}, configure=_configure, open=False, timeout=5
        )
        await existing.open()
        _pools[loop] = existing
    return existing


async def close_pool() -> None:
    """Close this event loop's pool (for commands that run one loop and exit)."""
    existing = _pools.pop(asyncio.get_running_loop(), None)
    if existing is not None:
        await existing.close()


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


async def lookup(key: CacheKey, *, tenant_id: int, semantic: bool, threshold: float | None) -> Lookup:
    """Exact tier, then (if allowed) the semantic tier. Fails open: any error or a lookup slower
    than SENTINEL_CACHE_LOOKUP_TIMEOUT_MS is logged and reported as a miss."""
    found = Lookup(None)
    try:
        found.hit = await _exact(key)
        # Until the model has loaded (a few seconds after start) the semantic tier is skipped, not waited for.
        if found.hit is None and semantic and key.semantic and embedder_ready():
            async with asyncio.timeout(settings.CACHE_LOOKUP_TIMEOUT_MS / 1000):
                found.embedding = await embed(key.prompt)
                found.hit = await _semantic(key, tenant_id, found.embedding, threshold or acceptance.DEFAULT_THRESHOLD)
    except Exception as exc:  # noqa: BLE001 - the cache must never fail a request
        log.warning("cache lookup failed open: %s: %s", type(exc).__name__, exc)
        record_failure("lookup")
    return found


def record_failure(stage: str) -> None:
    from gateway import metrics

    metrics.cache_failure(stage)


async def _exact(key: CacheKey) -> Hit | None:
    stored = _exact_local.get(key.exact)
    if stored is None:
        raw = await async_redis().get(exact_redis_key(key.exact))
        if raw is None:
            return None
        stored = orjson.loads(raw)
        _exact_local.set(key.exact, stored)
    if stored["expires"] <= datetime.now(UTC).timestamp():
        _exact_local.pop(key.exact)
        return None
    return Hit("hit-exact", stored["answer"], stored["id"], Decimal(stored["cost_usd"]))


async def _semantic(key: CacheKey, tenant_id: int, embedding, threshold: float) -> Hit | None:
    async with (await pool()).connection() as conn:
        rows = await (
            await conn.execute(
                "select id, prompt, answer, cost_usd, 1 - (embedding <=> %s) as similarity "
                "from gateway_cacheentry where partition = %s and expires_at > now() and embedding is not null "
                "order by embedding <=> %s limit %s",
                (embedding, key.partition, embedding, CANDIDATES),
            )
        ).fetchall()
    for entry_id, prompt, answer, cost, similarity in sorted(rows, key=lambda r: -r[4]):
        if similarity < threshold:
            break
        verdict = acceptance.verify(prompt, key.prompt, similarity)
        if verdict.accepted:
            return Hit("hit-semantic", answer, entry_id, cost, float(similarity))
    return None


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
) -> None:
    """File an answer under its key (after the response was sent). Embeds the prompt if the lookup
    did not, then evicts the tenant's least recently used entries beyond its cap."""
    try:
        if embedding is None and semantic and key.semantic:
            embedding = await embed(key.prompt)
        expires = datetime.now(UTC) + timedelta(seconds=ttl)
        async with (await pool()).connection() as conn:
            row = await (
                await conn.execute(
                    "insert into gateway_cacheentry (tenant_id, partition, exact_digest, model, prompt, embedding, "
                    "answer, cost_usd, created_at, expires_at, hits) "
                    "values (%s, %s, %s, %s, %s, %s, %s, %s, now(), %s, 0) returning id",
                    (
                        tenant_id,
                        key.partition,
                        key.exact,
                        model,
                        key.prompt,
                        embedding,
                        orjson.dumps(answer).decode(),
                        cost_usd,
                        expires,
                    ),
                )
            ).fetchone()
            stored = {"id": row[0], "answer": answer, "cost_usd": str(cost_usd), "expires": expires.timestamp()}
            await async_redis().set(exact_redis_key(key.exact), orjson.dumps(stored), ex=ttl)
            await _evict(conn, tenant_id, max_entries)
    except Exception as exc:  # noqa: BLE001 - a lost cache store costs a future miss, nothing more
        log.warning("cache store failed: %s: %s", type(exc).__name__, exc)
        record_failure("store")


async def _evict(conn, tenant_id: int, max_entries: int) -> None:
    count = (
        await (
            await conn.execute("select count(*) from gateway_cacheentry where tenant_id = %s", (tenant_id,))
        ).fetchone()
    )[0]
    if count <= max_entries:
        return
    rows = await (
        await conn.execute(
            "delete from gateway_cacheentry where id in (select id from gateway_cacheentry where tenant_id = %s "
            "order by coalesce(last_hit_at, created_at) asc, id asc limit %s) returning exact_digest",
            (tenant_id, count - max_entries),
        )
    ).fetchall()
    if rows:
        await async_redis().delete(*(exact_redis_key(digest) for (digest,) in rows))
