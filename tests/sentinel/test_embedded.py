"""The embedded Valkey: started with glibc's malloc caches off, so its heap does not creep under the
churn of the sliding rate-limit logs (see `VALKEY_MALLOC_TUNABLES`; figures in docs/performance.md, Soak)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sentinel.embedded import VALKEY_MALLOC_TUNABLES
from tests.conftest import embedded_test_valkey


def embedded_valkey_pid() -> int:
    found = embedded_test_valkey()
    if found is None:
        pytest.skip("this session uses an external Redis (REDIS_URL), not the embedded Valkey")
    return found["pid"]


@pytest.mark.servers  # reads the running embedded Valkey
def test_embedded_valkey_runs_on_glibc_malloc_with_its_caches_off():
    from sentinel.redis_clients import sync_redis

    assert sync_redis().info("memory")["mem_allocator"] == "libc"  # the reason for the setting
    # glibc parses GLIBC_TUNABLES in place at start, so the raw environment is read, not split.
    environment = Path(f"/proc/{embedded_valkey_pid()}/environ").read_bytes()
    for tunable in VALKEY_MALLOC_TUNABLES.split(":"):
        assert tunable.encode() in environment
    # Only the server's environment: nothing is left behind in this process for other children.
    assert VALKEY_MALLOC_TUNABLES not in os.environ.get("GLIBC_TUNABLES", "")
