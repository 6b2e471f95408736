"""The embedded Valkey: started with glibc's malloc caches off, so its heap does not creep under the
churn of the sliding rate-limit logs (see `VALKEY_MALLOC_TUNABLES`; figures in docs/performance.md, Soak).
And who starts the embedded servers: the entry points, never the reading of settings."""

from __future__ import annotations

import os
import subprocess
import sys
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


BASE_DIR = Path(__file__).resolve().parents[2]
# What starting the embedded servers leaves in their data folder (sentinel.embedded.start).
SERVER_TRACES = (".services.lock", "pg", "valkey")


def without_storage(data_dir: Path, **extra: str) -> dict[str, str]:
    """This environment with no storage URL set and a fresh data folder: a fresh checkout's."""
    unset = ("DATABASE_URL", "REDIS_URL", "SENTINEL_CACHE_DATABASE_URL", "DJANGO_SETTINGS_MODULE", "SENTINEL_DATA_DIR")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    return {**env, "SENTINEL_DATA_DIR": str(data_dir), **extra}


def test_reading_settings_with_no_urls_starts_no_server(tmp_path):
    data_dir = tmp_path / "data"
    script = (
        "import django, psutil; from django.conf import settings; django.setup(); "
        "print(repr(settings.DATABASE_URL), repr(settings.REDIS_URL), repr(settings.DATABASES['default']['NAME']), "
        "len(psutil.Process().children(recursive=True)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=BASE_DIR,
        env=without_storage(data_dir, DJANGO_SETTINGS_MODULE="sentinel.settings"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["''", "''", "''", "0"]
    assert [trace for trace in SERVER_TRACES if (data_dir / trace).exists()] == []


def test_collectstatic_runs_with_no_urls_and_starts_no_server(tmp_path):
    """The image build runs it so, with no storage to reach."""
    data_dir = tmp_path / "data"
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--dry-run"],
        cwd=BASE_DIR,
        env=without_storage(data_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "static files copied" in result.stdout
    assert [trace for trace in SERVER_TRACES if (data_dir / trace).exists()] == []
