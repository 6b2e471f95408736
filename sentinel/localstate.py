"""Per-process caches of database state, and how a change made anywhere reaches every process.

Configuration (keys, tenants, aliases, prices) is read from Postgres and kept here for a while. Every
request already makes one Redis round trip, which also returns a configuration generation counter;
a change anywhere bumps it (`announce_change`) and each process drops these caches when it sees a new
value. Revocation and suspension do not rely on this: they set markers that every request checks.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection, transaction

from sentinel import redis_keys
from sentinel.redis_clients import sync_redis

GENERATION_KEY = redis_keys.CONFIG_GENERATION
_MISSING = object()


def blocked_key_marker(digest: str, tenant_id: int) -> str:
    """Keyed by the secret's digest, which names exactly one secret forever (ids can be reused
    when a database is rebuilt), under its tenant's tag."""
    return redis_keys.blocked_key(digest, tenant_id=tenant_id)


def blocked_tenant_marker(tenant_id: int) -> str:
    return redis_keys.blocked_tenant(tenant_id)


log = logging.getLogger(__name__)


class DatabaseUnavailable(Exception):
    """PostgreSQL did not answer, and no earlier copy of what was asked for is at hand."""


# What psycopg and Django raise when the server is away: refused, reset, shutting down, a pool that
# found no connection in time, a connection already closed by one of those.
DATABASE_AWAY = (OperationalError, InterfaceError, DatabaseUnavailable)
# After a failure the database is "suspect" until a read succeeds: one read at a time tries it (the
# probe; with the server away it may wait for the pool's timeout), and the others go straight to the
# last known copies instead of queueing behind it (every database read of a process runs on one
# thread). Between probes, AWAY_SECONDS.
AWAY_SECONDS = 2.0
_suspect = False
_probing = False
_next_probe = 0.0
_loaded_once = False


def has_loaded() -> bool:
    """Whether this process has read its configuration from the database at least once: with the
    database away it still serves from what it read (readiness says "degraded", not "unavailable")."""
    return _loaded_once


_thread = threading.local()


def _name(load: Callable) -> str:
    return f"{load.__module__}.{load.__qualname__}"


def _load(load: Callable, args: tuple, probe: bool) -> Any:
    global _suspect, _probing, _next_probe, _loaded_once
    if getattr(_thread, "loading", False):
        return load(*args)  # a read inside another (a route's prices): the outer one answers for both
    _thread.loading = True
    try:
        if _suspect and not probe:
            raise DatabaseUnavailable(_name(load))  # queued behind a probe that failed
        value = load(*args)
    except DATABASE_AWAY as exc:
        if not _suspect:
            log.warning("the database is unreachable (%s); serving the last configuration read", type(exc).__name__)
        _suspect, _next_probe = True, time.monotonic() + AWAY_SECONDS
        # This thread's connection is broken: drop it, so the first read after the outage reconnects.
        with contextlib.suppress(*DATABASE_AWAY):
            connection.close()
        raise DatabaseUnavailable(_name(load)) from exc
    finally:
        _thread.loading = False
        if probe:
            _probing = False
    _suspect, _loaded_once = False, True
    return value


def _claim_probe() -> bool:
    """False: the database is suspect and another read is probing it, or it is not time yet."""
    global _probing
    if not _suspect:
        return True
    if _probing or time.monotonic() < _next_probe:
        return False
    _probing = True
    return True


async def from_database(load: Callable, *args: Any) -> Any:
    """load(*args) on the database thread; DatabaseUnavailable when the database is away."""
    suspect = _suspect
    if not _claim_probe():
        raise DatabaseUnavailable(_name(load))
    return await sync_to_async(_load)(load, args, suspect)


def from_database_sync(load: Callable, *args: Any) -> Any:
    if getattr(_thread, "loading", False):
        return load(*args)
    suspect = _suspect
    if not _claim_probe():
        raise DatabaseUnavailable(_name(load))
    return _load(load, args, suspect)


class TTLCache:
    """A small LRU whose entries also expire after `ttl` seconds. An expired entry is kept (until
    the LRU evicts it) as the last known value: while the database is away, `read_through` serves it
    (stale-if-error, as RFC 5861 has it for HTTP caches)."""

    def __init__(self, ttl: float, maxsize: int = 10_000) -> None:
        self.ttl = ttl
        self.maxsize = maxsize
        self._data: OrderedDict[Any, tuple[float, Any]] = OrderedDict()
        _caches.append(self)

    def get(self, key: Any, default: Any = None) -> Any:
        item = self._data.get(key, _MISSING)
        if item is _MISSING:
            return default
        expires, value = item
        if expires < time.monotonic():
            return default
        self._data.move_to_end(key)
        return value

    def set_last_known(self, key: Any, value: Any) -> None:
        """Keep `value` as the last known one only: served while the database is away, never
        instead of reading it."""
        self._data[key] = (float("-inf"), value)
        self._data.move_to_end(key)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def stale(self, key: Any, default: Any = None) -> Any:
        """The last value set for `key`, expired or not."""
        item = self._data.get(key, _MISSING)
        return default if item is _MISSING else item[1]

    async def read_through(self, key: Any, load: Callable, *args: Any) -> Any:
        """The value for `key`, else load(*args) from the database (and keep it); while the database
        is away, the last known value; with none, DatabaseUnavailable."""
        value = self.get(key, _MISSING)
        if value is not _MISSING:
            return value
        try:
            value = await from_database(load, *args)
        except DatabaseUnavailable:
            value = self.stale(key, _MISSING)
            if value is _MISSING:
                raise
            return value
        self.set(key, value)
        return value

    def read_through_sync(self, key: Any, load: Callable, *args: Any) -> Any:
        value = self.get(key, _MISSING)
        if value is not _MISSING:
            return value
        try:
            value = from_database_sync(load, *args)
        except DatabaseUnavailable:
            value = self.stale(key, _MISSING)
            if value is _MISSING:
                raise
            return value
        self.set(key, value)
        return value

    def set(self, key: Any, value: Any) -> None:
        self._data[key] = (time.monotonic() + self.ttl, value)
        self._data.move_to_end(key)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def pop(self, key: Any) -> None:
        self._data.pop(key, None)

    def clear(self) -> None:
        """Expire every entry: the next read goes to the database, and the old values stay as the
        last known ones."""
        for key, (_, value) in self._data.items():
            self._data[key] = (float("-inf"), value)

    def forget(self) -> None:
        self._data.clear()


_caches: list[TTLCache] = []
_generation: bytes | None = None


def observe_generation(value: bytes | None) -> bool:
    """Called with the counter a request read; drops every cache when it moved. True if it did."""
    global _generation
    if value == _generation:
        return False
    for cache in _caches:
        cache.clear()
    _generation = value
    return True


def current_generation() -> bytes:
    """The generation this process's caches reflect (b"" before it has seen one)."""
    return _generation or b""


def announce_change() -> None:
    """Tell every gateway process to re-read configuration (after the current transaction)."""
    transaction.on_commit(lambda: sync_redis().incr(GENERATION_KEY))
