"""`python -m bench overhead --quick` runs end to end in CI: real storage, mock, gateway processes and
load, and it writes the results a reader and docs/performance.md rely on. Nothing is timed here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.bench.conftest import processes_with_redis
from tests.servers import BASE_DIR, database_url_for

LOADS = [
    "c1-nonstream",
    "c1-stream",
    "c32-nonstream",
    "c32-stream",
    "c1-multiturn",
    "c32-multiturn",
    "realistic-c32-stream",
]
SENTINELS = ("sentinel", "sentinel-bypass")  # cache on (every prompt a miss), and bypassed
WARM = ("c1-nonstream", "c32-nonstream")  # the loads measured in a warm partition too


def test_quick_overhead_run_writes_its_results_and_stops_everything(tmp_path, test_database_name, bench_redis_url):
    from django.conf import settings

    # The session's data folder: its embedding model is exported already (once per folder, slow).
    out, data_dir = tmp_path / "results", settings.DATA_DIR
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DATABASE_URL=database_url_for(test_database_name), REDIS_URL=bench_redis_url)
    run = subprocess.run(
        [sys.executable, "-m", "bench", "overhead", "--quick", "--out", str(out), "--data-dir", str(data_dir)],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a bound, not a measurement: a loaded 2-core machine takes over two minutes
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Overhead (zero-latency mock unless noted; one run)" in run.stdout
    assert "No LiteLLM proxy in this run: not asked for" in run.stdout
    assert "No Portkey gateway in this run: not asked for" in run.stdout

    result = json.loads((out / "overhead.json").read_text())
    assert (result["scenario"], result["quick"]) == ("overhead", True)
    assert result["machine"]["cores"] == os.cpu_count()
    assert result["machine"]["cpu_model"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", result["date"])
    assert re.fullmatch(r"[0-9a-f]{40}", result["git"]["commit"])
    assert result["versions"]["django"] and result["versions"]["litellm"]
    assert result["peer"] == {"missing": "not asked for (--no-peer or --quick)"}
    assert result["portkey"] == {"missing": "not asked for (--no-portkey or --quick)"}
    assert result["config"]["sentinel_web_server"].startswith("python -m sentinel.web")
    assert "admission" in result["config"]["sentinel_conditions"]
    assert "cache on: every request a miss" in result["config"]["sentinel_conditions"]
    assert "cache bypassed per request" in result["config"]["sentinel_conditions"]
    assert result["sentinel_probe_headers"]["x-sentinel-cache"] == "miss"
    assert min(result["warm_up_cpu_s_per_worker"]) > 0

    rows = {(r["load"], r["target"]): r for r in result["rows"]}
    assert set(rows) == {(load, target) for load in LOADS for target in ("direct", *SENTINELS)} | {
        (load, "sentinel-warm") for load in WARM
    }
    for (load, target), row in rows.items():
        assert row["errors"] == 0 and row["statuses"] == {"200": row["requests"]}
        assert row["server_cpu_ms_per_request"] >= 0  # the mock's share of 30 requests may round to no tick
        if target.startswith("sentinel"):
            assert row["server_cpu_ms_per_request"] > 0
            assert len(row["web_worker_cpu_share"]) == result["config"]["sentinel_web_workers"]
            assert abs(sum(row["web_worker_cpu_share"]) - 1) <= 0.02
        # The storage servers' CPU is read only from the embedded ones a run starts; this one is
        # handed the test session's by URL.
        assert "storage_cpu_ms_per_request" not in row
        assert row["ok"] == row["requests"] > 0 and row["rps"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        if "stream" in load and "nonstream" not in load:
            assert 0 < row["ttft_p50_ms"] <= row["p50_ms"] + 1
        else:
            assert row["ttft_p50_ms"] is None
    assert rows[("c1-nonstream", "sentinel")]["requests"] == 30
    # The warm partition searched for every miss; the cache-on rows say what their semantic tier did.
    for load in WARM:
        warm = rows[(load, "sentinel-warm")]["semantic_lookups"]
        assert warm["searched"] > 0 and warm["skipped_cold"] == 0, warm
        # Its prompts differ from every entry by a number or a word: the static first stage's gate
        # spares MiniLM for most or all of them; a model run embeds one prompt or more.
        assert warm["embed_runs"] <= warm["embedded"] < warm["searched"], warm
    assert set(rows[("c32-nonstream", "sentinel")]["semantic_lookups"]) == {
        "searched",
        "skipped_empty",
        "skipped_cold",
        "embedded",
        "embed_runs",
    }
    assert rows[("realistic-c32-stream", "direct")]["ttft_p50_ms"] >= 120  # the realistic mock's first token

    added = {a["target"]: a for a in result["added_vs_direct"]}
    assert set(added) == {*SENTINELS, "sentinel-warm"}
    for target in SENTINELS:
        assert added[target]["nonstream_p50_ms"] == round(
            rows[("c1-nonstream", target)]["p50_ms"] - rows[("c1-nonstream", "direct")]["p50_ms"], 3
        )
        assert added[target]["multiturn_p50_ms"] == round(
            rows[("c1-multiturn", target)]["p50_ms"] - rows[("c1-multiturn", "direct")]["p50_ms"], 3
        )
    checks = {c["check"]: c for c in result["targets"]}
    assert len(checks) == 8 and not any("LiteLLM" in name or "Portkey" in name for name in checks)
    assert all(isinstance(c["met"], bool) for c in checks.values())

    assert (out / "overhead.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert processes_with_redis(bench_redis_url) == []
