"""Celery tasks of batches. Each loads its batch by id and calls one service; their retry policy is
the batch's own (leases, item retries, the sweep), so none is retried by Celery."""

from celery import shared_task

from gateway.batches import runner, services


@shared_task(ignore_result=True)
def start_batch(batch_id: int) -> None:
    """Read the input file into items; then as many workers as SENTINEL_BATCH_RUNNERS start on it."""
    from django.conf import settings

    if services.batch_start(batch_id=batch_id):
        for _ in range(settings.BATCH_RUNNERS):
            run_batch.delay(batch_id)


# Acknowledged when done: with one message prefetched per worker, a second runner goes to another
# worker instead of waiting behind the first in the same one.
@shared_task(ignore_result=True, acks_late=True)
def run_batch(batch_id: int) -> None:
    """One slice of the batch's work; queues the next slice if work is left."""
    if runner.run_slice(batch_id):
        run_batch.delay(batch_id)


@shared_task(ignore_result=True)
def finalize_batch(batch_id: int) -> None:
    services.batch_finalize(batch_id=batch_id)


@shared_task(ignore_result=True)
def sweep_batches() -> None:
    """Beat's look for batch work nobody is doing (every SENTINEL_BATCH_SWEEP_SECONDS)."""
    found = services.batches_sweep()
    for batch_id in found.to_expire:
        services.batch_expire(batch_id=batch_id)
    for batch_id in found.to_start:
        start_batch.delay(batch_id)
    for batch_id in found.to_run:
        run_batch.delay(batch_id)
    for batch_id in found.to_close:
        finalize_batch.delay(batch_id)
