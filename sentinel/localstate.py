"""Per-process caches of database state, and how a change made anywhere reaches every process.

Configuration (keys, tenants, aliases, prices) is read from Postgres and kept here for a while. Every
request already makes one Redis round trip, which also returns a configuration generation counter;
a change anywhere bumps it (`announce_change`) and each process drops these caches when it sees a new
value. Revocation and suspension do not rely on this: they set markers that every request checks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from django.db import transaction

from sentinel import redis_keys
from sentinel.redis_clients import sync_redis

GENERATION_KEY = redis_keys.CONFIG_GENERATION
_MISSING = object()


def blocked_key_marker(digest: str) -> str:
    """Keyed by the secret's digest, which names exactly one secret forever (ids can be reused
    when a database is rebuilt)."""
    return redis_keys.blocked_key(digest)


def blocked_tenant_marker(tenant_id: int) -> str:
    return redis_keys.blocked_tenant(tenant_id)


class TTLCache:
    """A small LRU whose entries also expire after `ttl` seconds."""

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
            del self._data[key]
            return default
        self._data.move_to_end(key)
        return value

    def set(self, key: Any, value: Any) -> None:
        self._data[key] = (time.monotonic() + self.ttl, value)
        self._data.move_to_end(key)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def pop(self, key: Any) -> None:
        self._data.pop(key, None)

    def clear(self) -> None:
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
