"""Workers killed with SIGKILL in the middle of a batch: the items they held are taken over when
their leases run out, every item gets exactly one result, and the ledger bills each request once."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from openai import OpenAI

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.batches.models import BatchItem
from gateway.mock_provider import answer_text
from sentinel.celery import app as celery_app
from tests.gateway.batches.conftest import FAST_BATCHES, finished, jsonl, output_lines, wait_for
from tests.servers import start_celery_worker

ITEMS = 24
WORKERS = {**FAST_BATCHES, "SENTINEL_BATCH_CONCURRENCY": "3", "SENTINEL_BATCH_RUNNERS": "2"}


def held_by(worker) -> list[int]:
    """Lines whose lease the worker (process) holds (claimed or running): its owner name carries its pid."""
    return list(
        BatchItem.objects.filter(status__in=("queued", "running"), lease_owner__contains=f"-{worker.pid}-").values_list(
            "line", flat=True
        )
    )


@pytest.mark.parametrize("rescue", ["a surviving worker", "a new worker after the sweep"])
def test_workers_killed_mid_batch_lose_nothing_and_finish_nothing_twice(
    rescue, gateway, test_database_name, make_tenant, make_key, make_model, mock_provider
):
    tenant = make_tenant(cache_enabled=False)  # every run really calls the provider
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0, timeout=30)
    alias, (provider,) = make_model()
    mock_provider.control(provider, slow_ms=400)
    prompts = [f"recover {i}" for i in range(ITEMS)]
    uploaded = client.files.create(file=("work.jsonl", jsonl(alias, prompts)), purpose="batch")

    workers = [start_celery_worker(test_database_name, env=WORKERS, name="victim")]
    if rescue == "a surviving worker":
        workers.append(start_celery_worker(test_database_name, env=WORKERS, name="survivor"))
    victim = workers[0]
    try:
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = BatchItem.objects.filter(batch__public_id=batch.id, status="succeeded")
        wait_for(lambda: done.count() >= 3 and held_by(victim), 60, "the victim to be mid-batch")
        victim.kill()
        orphaned = held_by(victim)
        assert orphaned, "the victim died holding items"
        if rescue == "a new worker after the sweep":
            workers.append(start_celery_worker(test_database_name, env=WORKERS, name="rescuer"))
            asked = [0.0]

            def swept():
                if time.monotonic() - asked[0] > 1.0:  # what beat does, every SENTINEL_BATCH_SWEEP_SECONDS
                    celery_app.send_task("gateway.batches.tasks.sweep_batches")
                    asked[0] = time.monotonic()
                return client.batches.retrieve(batch.id).status == "completed"

            wait_for(swept, 120, "a new worker to finish the batch")
        result = finished(client, batch.id, timeout=120)
    finally:
        for worker in workers:
            worker.stop()
        celery_app.control.purge()

    assert result.status == "completed"
    assert result.request_counts.model_dump() == {"total": ITEMS, "completed": ITEMS, "failed": 0}
    # Every item exactly once in the output, with its own prompt's answer: nothing lost, nothing doubled.
    rows = output_lines(client, result.output_file_id)
    assert sorted(row["custom_id"] for row in rows) == sorted(f"req-{i}" for i in range(ITEMS))
    for row in rows:
        i = int(row["custom_id"].split("-")[1])
        assert row["response"]["body"]["choices"][0]["message"]["content"] == answer_text(prompts[i])
    assert result.error_file_id is None
    # The orphans were run again by someone else...
    rerun = BatchItem.objects.filter(batch__public_id=batch.id, line__in=orphaned)
    assert set(rerun.values_list("status", flat=True)) == {"succeeded"}
    assert mock_provider.stats(provider)["calls"] >= ITEMS
    # ...and billed once: one ledger row per request, none twice.
    drain()
    ledger = LedgerEntry.objects.filter(request_id__startswith=f"{batch.id}:")
    per_request = Counter(ledger.values_list("request_id", flat=True))
    assert per_request == Counter({f"{batch.id}:{line}": 1 for line in range(1, ITEMS + 1)})
    assert set(ledger.values_list("status_code", flat=True)) == {200}
