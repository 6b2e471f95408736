"""A real three-primary, three-replica Valkey Cluster (tests/valkey_cluster.py), and the process
pointed at it for a test: REDIS_URL names the cluster and every Redis client is made anew."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings

from sentinel.redis_clients import reset_clients
from tests.valkey_cluster import ValkeyCluster, start_cluster


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[ValkeyCluster]:
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def on_cluster(valkey_cluster) -> Iterator[ValkeyCluster]:
    """This process's Redis clients on the cluster for the test, then back on the session's Valkey; its
    configuration generation the cluster's meanwhile (the suite's earlier tests moved the session
    Valkey's, and a process whose generation is not Redis's has every admission refused as stale)."""
    from sentinel.localstate import GENERATION_KEY, current_generation, observe_generation
    from sentinel.redis_clients import sync_redis
    from sentinel.redis_urls import caches, channel_layers

    url = valkey_cluster.url
    before = current_generation() or None
    reset_clients()
    with override_settings(
        REDIS_URL=url,
        # A cluster client's first command learns the slots first, inside the command's time limit;
        # on this two-core test host, busy with six Valkeys and the rest of the suite, that took
        # longer than the request path's 100 ms, and once (a full CI run) longer than 3 s: the
        # admission failed closed (503). These tests are about what is taken, not about that limit
        # (the outage tests set their own).
        REDIS_TIMEOUT_MS=10_000,
        CHANNEL_LAYERS=channel_layers(url, "sentinel:channels"),
        CACHES=caches(url, "sentinel:django"),
    ):
        observe_generation(sync_redis().get(GENERATION_KEY))
        try:
            yield valkey_cluster
        finally:
            reset_clients()
            observe_generation(before)
