"""Batch tests run real Celery workers (solo pool) on the test database, with short leases and
backoffs so that recovery takes seconds, and the OpenAI SDK as the client."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest
from django.utils import timezone

from gateway.batches.models import Batch, BatchFile
from sentinel.celery import app as celery_app
from tests.conftest import wait_for
from tests.servers import start_celery_worker

FAST_BATCHES = {
    "SENTINEL_BATCH_LEASE_SECONDS": "2",
    "SENTINEL_BATCH_RETRY_SECONDS": "0.2",
    "SENTINEL_BATCH_MAX_TRIES": "3",
    "SENTINEL_BATCH_CONCURRENCY": "4",
    # Rate limits of batch items are counted in 2-second windows here, so waiting one out is quick.
    "SENTINEL_RATE_WINDOW_SECONDS": "2",
}


@pytest.fixture(scope="module")
def batch_worker(test_database_name):
    worker = start_celery_worker(test_database_name, env=FAST_BATCHES, name="batches")
    yield worker
    worker.stop()
    celery_app.control.purge()


def stored_batch(tenant, key, content: bytes = b"{}", *, filename: str = "in.jsonl", **fields) -> Batch:
    """A chat-completions batch written straight to the database, with its input file: for tests
    that start from a batch in a given state rather than from an upload. In progress, expiring in a
    day, unless `fields` say otherwise."""
    file = BatchFile.objects.create(
        tenant=tenant, key=key, purpose="batch", filename=filename, bytes=len(content), content=content
    )
    fields = {"status": Batch.Status.IN_PROGRESS, "expires_at": timezone.now() + timedelta(hours=24), **fields}
    return Batch.objects.create(
        tenant=tenant, key=key, endpoint="/v1/chat/completions", completion_window="24h", input_file=file, **fields
    )


def jsonl(model: str, prompts: list[str], **body) -> bytes:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": prompt}], **body},
        }
        for i, prompt in enumerate(prompts)
    ]
    return b"\n".join(orjson.dumps(line) for line in lines) + b"\n"


def finished(client, batch_id: str, timeout: float = 60.0):
    """The batch once it reached a final status."""

    def final():
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "failed", "cancelled", "expired") else None

    return wait_for(final, timeout, f"batch {batch_id} to finish")


def output_lines(client, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [orjson.loads(line) for line in client.files.content(file_id).content.splitlines()]
