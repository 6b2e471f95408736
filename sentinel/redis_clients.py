"""One Redis connection pool per process (sync) and per event loop (async)."""

from __future__ import annotations

import asyncio
import weakref

import redis
import redis.asyncio as aioredis
from django.conf import settings

_sync_client: redis.Redis | None = None
_async_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# Bounded so a Redis that stops answering costs a request milliseconds, not the default minutes.
SOCKET_TIMEOUT = 2.0
CONNECT_TIMEOUT = 1.0


def sync_redis() -> redis.Redis:
    global _sync_client
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(
            settings.REDIS_URL,
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT,
            health_check_interval=30,
        )
    return _sync_client


def async_redis() -> aioredis.Redis:
    """The client for the running event loop (a pool is bound to the loop that created it)."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = aioredis.Redis.from_url(
            settings.REDIS_URL,
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT,
            max_connections=512,
        )
        _async_clients[loop] = client
    return client
