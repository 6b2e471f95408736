"""Django's Redis cache on a Valkey/Redis Cluster: Django's own backend (django.core.cache.backends.
redis) with redis-py's cluster client, and its multi-key calls sent key by key (a cluster refuses
MGET and MSET across slots; DELETE of many keys the cluster client splits by slot itself)."""

from __future__ import annotations

import threading

import redis
from django.core.cache.backends.redis import RedisCache, RedisCacheClient


class ClusterRedisCacheClient(RedisCacheClient):
    _lock = threading.Lock()
    _clusters: dict[str, redis.RedisCluster] = {}

    def get_client(self, key=None, *, write=False):
        url = self._servers[0]
        with self._lock:
            client = self._clusters.get(url)
            if client is None:
                client = self._clusters[url] = redis.RedisCluster.from_url(
                    url, socket_timeout=2.0, socket_connect_timeout=1.0
                )
        return client

    def get_many(self, keys):
        found = {}
        for key in keys:
            value = self.get(key, None)
            if value is not None:
                found[key] = value
        return found

    def set_many(self, data, timeout):
        for key, value in data.items():
            self.set(key, value, timeout)
        return []


class ClusterRedisCache(RedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = ClusterRedisCacheClient
