"""Every benchmark scenario that starts servers runs end to end in CI in its `--quick` mode (overhead and
cache_scale have their own tests): real storage, mock, gateway processes and load, and the figures a
reader relies on are there and say what they should. Nothing is timed here; `make bench` gives the
figures (docs/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal

import pytest

from tests.bench.conftest import processes_with_redis
from tests.servers import BASE_DIR, PATIENT_REDIS, database_url_for

# Each scenario starts a whole stack and loads it: minutes beside the other test worker on a busy
# 2-core host (the admission scenario took 175 s there), so the limits are wide.
pytestmark = pytest.mark.timeout(600)


def run_quick(
    scenario: str, tmp_path, database: str, redis_url: str, timeout: int = 480, extra_env: dict | None = None
) -> dict:
    from django.conf import settings

    out = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DATABASE_URL=database_url_for(database), REDIS_URL=redis_url, **(extra_env or {}))
    run = subprocess.run(
        [sys.executable, "-m", "bench", scenario, "--quick", "--out", str(out), "--data-dir", str(settings.DATA_DIR)],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{scenario}: error" not in run.stdout, run.stdout[-3000:]
    assert processes_with_redis(redis_url) == []  # everything it started has stopped
    result = json.loads((out / f"{scenario}.json").read_text())
    assert (result["scenario"], result["quick"]) == (scenario, True)
    return result


def test_admission_admits_exactly_the_limit_across_four_processes(tmp_path, test_database_name, bench_redis_url):
    # Exactness with a Redis that answers, however slowly on a loaded host (tests.servers.PATIENT_REDIS).
    result = run_quick("admission", tmp_path, test_database_name, bench_redis_url, extra_env=PATIENT_REDIS)

    assert result["rate_limit"] == {
        "limit_per_minute": 100,
        "sent": 500,
        "admitted": 100,
        "rejected_429": 400,
        "over_admission": 0,
    }
    budget = result["budget"]
    assert (budget["admitted"], budget["rejected_402"]) == (100, 200)
    assert Decimal(budget["settled_spend_usd"]) == Decimal("1.00") and Decimal(budget["overspend_usd"]) == 0
    step = result["step_latency"]
    assert step["samples"] == 200 and 0 < step["admit_p50_us"] <= step["admit_p99_us"]


def test_failover_serves_everything_and_spares_the_primary_while_open(tmp_path, test_database_name, bench_redis_url):
    result = run_quick("failover", tmp_path, test_database_name, bench_redis_url)

    summary = result["summary"]
    assert summary["client_visible_failures"] == 0
    assert summary["seconds_to_open_on_503"] is not None  # (2-second phases: shorter than it stays open)
    # While the breaker is open, no request is served by (or waits for) the primary.
    assert summary["requests_while_open_503"] > 0 and summary["primary_calls_while_open_503"] == 0
    on = result["with_breaker"]
    assert on["phases"]["503"]["served_by_primary"] == 0
    assert on["transitions"][0]["to"] == "open"
    # Without a breaker the primary is tried on every request of the 503 phase (and fails over).
    assert result["without_breaker"]["phases"]["503"]["failures"] == 0


def test_relay_mix_serves_from_the_cache_and_never_an_answer_labeled_wrong(
    tmp_path, test_database_name, bench_redis_url
):
    result = run_quick("relay_mix", tmp_path, test_database_name, bench_redis_url)

    off, on = result["runs"]["off"], result["runs"]["on"]
    assert off["requests"] == on["requests"] == 400
    assert off["errors"] == 0 and off["tiers"]["bypass"] == 400 and off["provider_calls"] == 400
    assert on["errors"] == on["wrong_answers_served"] == sum(w["times"] for w in on["wrong_served"])
    assert on["tiers"]["hit-exact"] > 0 and on["tiers"]["hit-semantic"] > 0
    assert on["provider_calls"] == on["tiers"]["miss"]  # a hit never reaches the provider
    assert not [w for w in on["wrong_served"] if w["labeled_different"]]
    assert result["config"]["extra_labels"]["same"] > 0


def test_durability_every_answer_has_exactly_one_ledger_row(tmp_path, test_database_name, bench_redis_url):
    result = run_quick("durability", tmp_path, test_database_name, bench_redis_url)

    figures = result["figures"]
    assert figures["queue_drained"] is True
    assert figures["answered_without_a_row"] == figures["rows_duplicated"] == 0
    assert figures["rows_for_answers"] == figures["answered_200"] > 0
    assert set(result["killed"]) == {"web_worker", "ledger_worker"}


@pytest.mark.parametrize("scenario", ["screening"])
def test_screening_times_every_scenario(tmp_path, test_database_name, bench_redis_url, scenario):
    result = run_quick(scenario, tmp_path, test_database_name, bench_redis_url)

    names = [row["scenario"] for row in result["scenarios"]]
    assert names[0] == "no policy" and "long ~4k chars, all checks (redact)" in names
    assert "single 4k user message, all checks (redact)" in names  # issue 25: one long message
    rows = result["scenarios"]
    assert rows[0]["p50_ms"] >= 0 and all(0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"] for row in rows[1:])


def test_verifier_times_every_candidate_the_cache_would_verify(tmp_path, test_database_name, bench_redis_url):
    """Quick: the first 300 labeled pairs, those at or above the cosine floor, 3 rounds each, with
    both prompts unseen (a pair the cross-encoder scores is scored in every call)."""
    written = run_quick("verifier", tmp_path, test_database_name, bench_redis_url)
    result = written["results"]
    assert "remembered" not in written
    assert 0 < result["accepted"] < result["candidates"] < 300
    assert result["calls"] == 3 * result["candidates"]
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]


def test_retrieval_scores_each_ranking_on_the_labeled_questions(tmp_path, test_database_name, bench_redis_url, live_db):
    """Quick: the seven documents and their distractors ingested as a worker does, the 36 questions
    asked with each ranking; the store made for it is gone afterwards."""
    from gateway.knowledge.models import VectorStore

    stores = VectorStore.objects.count()
    result = run_quick("retrieval", tmp_path, test_database_name, bench_redis_url)
    ingestion, quality = result["ingestion"], result["quality"]
    assert (ingestion["files"], ingestion["failed"], ingestion["chunks"]) == (83, 0, 83)
    assert set(quality) == {"semantic", "keyword", "hybrid"}
    for mode in quality.values():
        assert 0.8 <= mode["recall_at_5"] <= 1 and 0 < mode["mrr_at_10"] <= 1
        assert len(mode["missed_at_5"]) == round(36 * (1 - mode["recall_at_5"]))
    # Fusing the two rankings finds what either finds: no worse than the better one, give or take a question.
    assert (
        quality["hybrid"]["recall_at_5"]
        >= max(quality["semantic"]["recall_at_5"], quality["keyword"]["recall_at_5"]) - 0.03
    )
    assert result["latency"]["searches"] == 36 and result["latency"]["search_p50_ms"] > 0
    # The scale part, small: 3,000 generated chunks, the largest store given its own HNSW index, each
    # store size searched, and the PDF ingested.
    scale = result["scale"]
    assert scale["chunks"] == 3000 and scale["build"]["indexes"] >= 1
    assert sum(row["stores"] for row in scale["search"]) >= 10 and scale["search"][0]["indexed"] is True
    assert all(row["queries"] == 5 for row in scale["search"])
    assert scale["pdf"]["status"] == "completed"
    assert VectorStore.objects.count() == stores


def test_ledger_moves_every_record_and_times_the_hand_off(tmp_path, test_database_name, bench_redis_url):
    result = run_quick("ledger", tmp_path, test_database_name, bench_redis_url)

    drain = result["drain"]
    # Every record is in Postgres once: through the queue, or straight in when Redis fell silent for
    # the request path's timeout (a loaded CI host does that); a record both ways lands once.
    assert drain["in_postgres"] == drain["expected"] == 5000 and drain["rows_per_s"] > 0
    assert drain["moved"] >= drain["inserted_for_bench"] == 5000 - drain["written_directly"]
    hand_off = result["hand_off"]
    assert 0 < hand_off["serial_p50_us"] <= hand_off["serial_p99_us"] and hand_off["concurrent_per_s"] > 0


def test_soak_checks_every_answer_and_measures_every_process(tmp_path, test_database_name, bench_redis_url):
    result = run_quick("soak", tmp_path, test_database_name, bench_redis_url)

    load = result["load"]
    assert load["requests"] == load["ok"] > 0 and load["errors"] == load["wrong"] == load["shed"] == 0
    processes = {row["process"].split(":")[0]: row for row in result["processes"]}
    assert {"web", "worker", "beat", "mock"} <= set(processes)
    web = [row for row in result["processes"] if row["process"].startswith("web:")]
    assert len(web) == result["config"]["sentinel_web_workers"] == 2
    assert all(row["rss_start_mb"] > 0 and row["growth"] is not None and row["met"] is not None for row in web)
    assert result["targets"][0]["check"].startswith("RSS growth of every process")


def test_soak_measures_postgres_by_its_own_memory_not_the_buffer_cache(db):
    """The soak counts PostgreSQL by the anonymous memory of its processes and reports the shared memory
    beside it, bounded by the segment: measured here on the test session's own embedded server."""
    import psutil
    from django.conf import settings
    from django.db import connection

    from bench.soak import proc_kb, shared_segment_size

    postmaster = int((settings.DATA_DIR / "pg" / "postmaster.pid").read_text().split("\n", 1)[0])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_size_bytes(current_setting('shared_buffers')), pg_backend_pid()")
        shared_buffers, backend = cursor.fetchone()
    assert backend in {p.pid for p in psutil.Process(postmaster).children()}
    segment = shared_segment_size(postmaster)
    assert shared_buffers < segment < shared_buffers * 2  # the main segment: the buffers and the rest
    assert shared_segment_size(backend) >= segment  # every backend maps it (and may map dynamic segments)
    mine = proc_kb(backend, "status", ("RssAnon", "RssShmem"))
    assert mine["RssAnon"] > 0 and mine["RssShmem"] > 0
    assert 0 < proc_kb(backend, "smaps_rollup", ("Pss_Shmem",))["Pss_Shmem"] <= mine["RssShmem"]


def test_redis_stall_answers_fail_open_refuses_fail_closed_and_recovers(tmp_path, test_database_name, bench_redis_url):
    result = run_quick("redis_stall", tmp_path, test_database_name, bench_redis_url)

    phases = result["phases"]
    assert phases["before/fail_open"]["statuses"] == phases["before/fail_closed"]["statuses"] == {"200": 8}
    assert phases["during/fail_open"]["statuses"] == {"200": 8}
    assert phases["during/fail_closed"]["statuses"] == {"503": 8}
    assert phases["after/fail_open"]["statuses"] == phases["after/fail_closed"]["statuses"] == {"200": 8}
    assert phases["during, 16 at once/fail_open"]["statuses"] == {"200": 16}
    assert result["config"]["redis_timeout_ms"] == 100
