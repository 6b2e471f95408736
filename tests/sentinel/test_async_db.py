"""sentinel/async_db.py's pools against the test database: a connection handed back in the middle of
a pipeline is closed, never given to the next caller.

Seen in the full suite: lookups cut off by the semantic cache's time limit left vector-store
connections in libpq's pipeline mode (psycopg 3.3.9 reported them idle). Every later user of such a
connection got answers, but no Sync ever ended their implicit transaction: cache stores returned an
id and were never committed, and the open snapshots made CREATE INDEX CONCURRENTLY wait forever."""

from __future__ import annotations

import asyncio

import psycopg
from psycopg.pq import PipelineStatus

from sentinel import async_db
from tests.conftest import wait_for
from tests.servers import database_url_for


def test_a_connection_handed_back_mid_pipeline_is_closed_and_the_next_caller_commits(live_db, test_database_name):
    url = database_url_for(test_database_name)
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("create table if not exists async_db_probe (v text)")

        async def scenario() -> tuple[int, int, PipelineStatus]:
            pool = await async_db.pool("pipeline probe", max_size=1)
            try:
                async with pool.connection() as conn:
                    stranded = conn.info.backend_pid
                    # What a task cancelled inside its pipeline leaves: pipeline mode entered, never exited.
                    await conn.pipeline().__aenter__()
                    assert conn.pgconn.pipeline_status == PipelineStatus.ON
                async with pool.connection() as conn:
                    status = conn.pgconn.pipeline_status
                    await conn.execute("insert into async_db_probe (v) values (%s)", ("after a stranded pipeline",))
                    return stranded, conn.info.backend_pid, status
            finally:
                await async_db.close("pipeline probe")

        stranded, served, status = asyncio.run(scenario())
        assert served != stranded and status == PipelineStatus.OFF
        # Committed: another session sees the row at once.
        assert other.execute(
            "select count(*) from async_db_probe where v = 'after a stranded pipeline'"
        ).fetchone() == (1,)
        # The stranded connection was closed: its backend (and any transaction it held) is gone.
        wait_for(
            lambda: (
                other.execute("select count(*) from pg_stat_activity where pid = %s", (stranded,)).fetchone() == (0,)
            ),
            what="the stranded connection's backend to end",
        )
