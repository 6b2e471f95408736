"""`python -m bench cache_scale` on a small table runs end to end in CI: the twin of the cache table,
every lookup strategy, the embedding timings and hits through a real gateway, and the results a
reader relies on. Nothing is timed here; the figures come from the full run (docs/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import psycopg
import pytest

from bench import cache_data
from tests.bench.conftest import processes_with_redis
from tests.servers import BASE_DIR, database_url_for

STRATEGIES = [
    "as shipped, ef_search 40",
    "as shipped, ef_search 100",
    "as shipped, ef_search 200",
    "exact (partition btree + sort)",
    "table-wide HNSW, ef_search 40",
    "table-wide HNSW, ef_search 100",
    "table-wide HNSW, ef_search 200",
    "table-wide HNSW, no iterative scan",
]


def test_layout_spreads_every_entry_over_tenants_and_partitions():
    partitions = cache_data.layout(200_000, tenants=100, seed=3)
    assert sum(p.size for p in partitions) == 200_000
    assert {p.tenant for p in partitions} == set(range(100))
    assert len({p.key for p in partitions}) == len(partitions)  # a partition is never shared
    per_tenant = np.bincount([p.tenant for p in partitions], weights=[p.size for p in partitions])
    assert per_tenant[0] > 5 * per_tenant[-1]  # tenants differ in size, the first the largest
    buckets = {cache_data.bucket_name(p.size) for p in partitions}
    assert buckets == {"1–99 rows", "100–999 rows", "1,000–9,999 rows"}


def test_a_paraphrase_vector_stays_near_its_source():
    rng = np.random.default_rng(1)
    source = cache_data.unit(rng.normal(size=(200, 384)).astype(np.float32))
    near = cache_data.paraphrase_of(source, rng)
    cosines = (source * near).sum(axis=1)
    assert np.allclose(np.linalg.norm(near, axis=1), 1, atol=1e-5)
    assert cosines.min() > 0.8 and cosines.max() < 0.97


@pytest.mark.timeout(600)  # 231 s beside the other test worker on a busy 2-core host
def test_small_cache_scale_run_measures_every_strategy_and_cleans_up(tmp_path, test_database_name, bench_redis_url):
    from django.conf import settings

    out = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    # A semantic lookup slower than the default 500 ms fails open (a miss, as it should); this test
    # checks that paraphrases are served, not that timeout, on a host busy with the rest of the suite.
    env.update(
        DATABASE_URL=database_url_for(test_database_name),
        REDIS_URL=bench_redis_url,
        SENTINEL_CACHE_LOOKUP_TIMEOUT_MS="10000",
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "cache_scale",
            "--quick",
            "--sizes",
            "3000",
            "--queries",
            "40",
            "--index-rows",
            "25",
            "--out",
            str(out),
            "--data-dir",
            str(settings.DATA_DIR),
        ],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Semantic lookup" in run.stdout and "As shipped (ef_search 100), by partition size" in run.stdout

    result = json.loads((out / "cache_scale.json").read_text())
    assert (result["scenario"], result["quick"]) == ("cache_scale", True)
    (size,) = result["sizes"]
    assert (size["entries"], size["tenants"], size["queries"]["count"]) == (3000, 100, 40)
    assert size["queries"]["paraphrases"] + size["queries"]["novel"] == 40
    assert set(size["build"]) == {
        "copy_s",
        "btree_build_s",
        "vacuum_analyze_s",
        "partition_hnsw_build_s",
        "partition_indexes",
        "global_hnsw_build_s",
    }
    # Partitions of 25 entries or more got their own index (as beat's task gives them), and the
    # table-wide one was built for the comparison.
    assert size["build"]["partition_indexes"] == size["storage"]["partition_indexes"] >= 2
    assert size["storage"]["global_hnsw_mb"] >= 1
    rows = {row["strategy"]: row for row in size["strategies"]}
    assert list(rows) == STRATEGIES
    for row in rows.values():
        assert row["timeouts"] == 0 and 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert sum(b["queries"] for b in row["by_bucket"].values()) == 40
    # Exact search is the truth the others are measured against: it finds every query's best row.
    assert rows["exact (partition btree + sort)"]["recall_at_1"] == 1.0
    # The table-wide lookups do go through that index (the planner was not allowed a seq scan).
    for name in STRATEGIES[4:]:
        plans = {plan for bucket in rows[name]["plans"].values() for plan in bucket}
        assert plans == {"table-wide HNSW"}, (name, plans)
    # As shipped: a partition with its own index is searched through it, a small one through its btree.
    shipped = rows["as shipped, ef_search 100"]
    assert shipped["recall_at_1"] >= 0.95
    plans = {plan for bucket in shipped["plans"].values() for plan in bucket}
    assert plans <= {
        "partition HNSW",
        "gateway_cacheentry_partition_d9418376",
        "gateway_cacheentry_partition_d9418376_like",
    }
    assert plans - {"partition HNSW"}
    assert sum(sum(bucket.values()) for bucket in shipped["plans"].values()) == 40  # every lookup's plan

    runners = {r["runner"]: r for r in result["embedding"]["runners"]}
    assert any(name.startswith("onnx fp32") for name in runners)
    assert all(r["p50_ms"] > 0 for r in runners.values())

    hits = result["hits"]
    assert hits["wrong_answers"] == 0, hits
    assert hits["semantic_missed"] == [], hits
    # The pairs the verifier serves are the ones measured: since the pair model (issue #17: 1% wrong
    # on unseen topics) it serves 6 of these 16 plain paraphrases (2 before its reworded hard
    # negatives), so recall is reported, not held.
    assert hits["pairs_used"] + len(hits["pairs_refused"]) == 16 and hits["pairs_used"] >= 1
    assert hits["tiers"]["exact"] == {"hit-exact": hits["pairs_used"] * 6}  # 3 rounds each, httpx and aiohttp
    assert hits["requests"]["exact_aiohttp"] == hits["requests"]["direct_aiohttp"] == hits["pairs_used"] * 2
    assert hits["tiers"]["semantic"] == {"hit-semantic": hits["pairs_used"] * 3}
    assert hits["requests"]["exact"] == hits["requests"]["semantic"] == hits["pairs_used"] * 2
    assert hits["exact_p50_ms"] > 0 and hits["semantic_p50_ms"] > 0

    assert (out / "cache_scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with psycopg.connect(database_url_for(test_database_name)) as conn:
        assert conn.execute("select to_regclass('bench_cache_3000')").fetchone() == (None,)  # dropped: no --keep
    assert processes_with_redis(bench_redis_url) == []
