"""What REDIS_URL names: a single Redis/Valkey (`redis://`, `rediss://`, `unix://`) or a Valkey/Redis
Cluster (`redis+cluster://host:port`, `rediss+cluster://` with TLS; host:port of any node, a seed
from which the clients learn the others). Imported by the settings, so nothing here needs Django.

On a cluster, the parts of Sentinel that cannot speak the cluster protocol are given what they can
(docs/cluster.md): Django's cache a client that sends each key to its slot's node; Channels the
pub/sub layer on the seed node (a cluster forwards every PUBLISH to every node, so any node serves
it; channels_redis's default layer keeps messages in keys of its own choosing, which a cluster would
refuse as MOVED); Celery a broker of its own (SENTINEL_BROKER_URL: kombu has no cluster transport).
"""

from __future__ import annotations

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss", "valkey+cluster": "redis"}


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0] in CLUSTER_SCHEMES


def plain_url(url: str) -> str:
    """The URL as redis-py reads it: a cluster scheme becomes redis:// (or rediss://)."""
    scheme, _, rest = url.partition("://")
    return f"{CLUSTER_SCHEMES.get(scheme, scheme)}://{rest}"


def channel_layers(url: str, prefix: str) -> dict:
    if is_cluster_url(url):
        return {
            "default": {
                "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                "CONFIG": {"hosts": [{"address": plain_url(url), "socket_connect_timeout": 5}], "prefix": prefix},
            }
        }
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # A consumer waits for its messages in BZPOPMIN calls that block 5 s (channels_redis'
                # brpop_timeout). redis-py's default read timeout is also 5 s, so the read lost that
                # race and the error ended the socket: reads get longer than the block.
                "hosts": [{"address": url, "socket_timeout": 15, "socket_connect_timeout": 5}],
                "prefix": prefix,
            },
        }
    }


def caches(url: str, prefix: str) -> dict:
    if is_cluster_url(url):
        return {
            "default": {
                "BACKEND": "sentinel.cluster_cache.ClusterRedisCache",
                "LOCATION": plain_url(url),
                "KEY_PREFIX": prefix,
            }
        }
    return {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url, "KEY_PREFIX": prefix}
    }
