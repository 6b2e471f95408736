"""Async psycopg pools for the request path, one per (event loop, purpose), off Django's ORM: its
async methods run each query on a worker thread, which serializes them and costs a thread hop and
the ORM's own work per query (about 1 ms for one INSERT, measured on the Responses endpoint).

A purpose names the pool and how its connections are set up (`configure`), so the vector store's
session settings (timeouts, pgvector types) never apply to another purpose's queries.

A connection handed back still in pipeline mode is closed, never reused (`_refuse_mid_pipeline`), in
the pools whose users run pipelines; the others skip that check, which the pool runs in its worker
task (a hop through the event loop on every use).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable

_pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> {purpose: pool}


def conninfo(url: str = "") -> str:
    """`url` if given, else the connection string of Django's default database."""
    if url:
        return url
    from django.db import connections
    from psycopg.conninfo import make_conninfo

    params = connections["default"].get_connection_params()
    wanted = ("dbname", "user", "password", "host", "port")
    return make_conninfo(**{k: v for k, v in params.items() if k in wanted and v})


Configure = Callable[..., Awaitable[None]]


async def pool(
    purpose: str, configure: Configure | None = None, *, url: str = "", max_size: int = 8, pipelines: bool = True
):
    """This event loop's pool for `purpose`, opened on first use (autocommit connections).
    `pipelines`: whether its users run pipelines (connections handed back are then checked)."""
    pools = _pools.setdefault(asyncio.get_running_loop(), {})
    opening = pools.get(purpose)
    if opening is None:  # the first caller opens it; callers meanwhile wait for the same pool
        opening = pools[purpose] = asyncio.ensure_future(_open(conninfo(url), configure, max_size, pipelines))
    try:
        return await asyncio.shield(opening)
    except BaseException:
        if opening.done() and pools.get(purpose) is opening:
            pools.pop(purpose)  # it failed to open: the next caller tries again
        raise


async def _open(info: str, configure: Configure | None, max_size: int, pipelines: bool):
    from psycopg_pool import AsyncConnectionPool

    opened = AsyncConnectionPool(
        info,
        min_size=1,
        max_size=max_size,
        kwargs={"autocommit": True},
        configure=configure,
        reset=_refuse_mid_pipeline if pipelines else None,
        open=False,
        timeout=5,
    )
    await opened.open()
    return opened


async def _refuse_mid_pipeline(connection) -> None:
    """The pool's check of a connection handed back (raising makes it close the connection).

    A task cancelled while its pipeline was being synced (a lookup past its time limit) can leave
    the connection in libpq's pipeline mode although psycopg 3.3 reports it idle. Its next user's
    statements then run and answer, but no Sync ever ends their implicit transaction: nothing they
    write is committed, and the open snapshot holds back vacuum and CREATE INDEX CONCURRENTLY.
    """
    from psycopg import OperationalError
    from psycopg.pq import PipelineStatus

    if connection.pgconn.pipeline_status != PipelineStatus.OFF:
        raise OperationalError("handed back in pipeline mode (its task was cancelled mid-sync)")


async def close(purpose: str) -> None:
    """Close this event loop's pool for `purpose` (for commands that run one loop and exit)."""
    opening = _pools.get(asyncio.get_running_loop(), {}).pop(purpose, None)
    if opening is not None:
        await (await opening).close()
