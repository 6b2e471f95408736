"""What the benchmark runs in the tests share: their own Valkey database, and a way to tell their
processes from everyone else's."""

from __future__ import annotations

import os
import urllib.parse

import psutil
import pytest
import redis

BENCH_REDIS_DB = 7


def processes_with_redis(url: str) -> list[psutil.Process]:
    """Processes started with this REDIS_URL: only the bench run's own have it."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("REDIS_URL") == url:
                found.append(process)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def bench_redis_url():
    """The session's Valkey, another database number: the run's queued ledger records, rate logs and
    breaker state stay out of the other tests' way, and are dropped afterwards."""
    url = urllib.parse.urlsplit(os.environ["REDIS_URL"])._replace(path=f"/{BENCH_REDIS_DB}").geturl()
    yield url
    redis.Redis.from_url(url).flushdb()
