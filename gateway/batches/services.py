"""Writes to files, batches and their items.

Items move with conditional updates, never check-then-act: a worker claims items whose status says
they are free (queued and not leased, or leased under a lease that ran out), starts one (queued →
running) only right before its request goes upstream and only while the batch is in progress, and
writes a result only while the lease is still its own. So when a worker dies, or stalls past its
lease and wakes up after another worker re-ran its items, each item still gets exactly one result;
and a cancel releases every item not started yet, claimed or not, at once.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

import orjson
from celery import signature
from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone

from gateway.batches.models import Batch, BatchFile, BatchItem
from gateway.batches.validation import read_requests

log = logging.getLogger(__name__)

COMPLETION_WINDOW = timedelta(hours=24)
# The tasks that run what these services start, queued by name: the tasks call these services.
START_BATCH = "gateway.batches.tasks.start_batch"
FINALIZE_BATCH = "gateway.batches.tasks.finalize_batch"
UNFINISHED = (BatchItem.Status.QUEUED, BatchItem.Status.RUNNING)
# What cancel and expiry leave behind goes to the error file with these.
ITEM_ERRORS = {
    BatchItem.Status.CANCELLED: ("batch_cancelled", "The batch was cancelled before this request ran."),
    BatchItem.Status.EXPIRED: (
        "batch_expired",
        "This request could not run before the batch's completion window ended.",
    ),
}


# --- files -------------------------------------------------------------------------------------


def file_create(*, tenant_id: int, key_id: int, filename: str, content: bytes, purpose: str) -> BatchFile:
    return BatchFile.objects.create(
        tenant_id=tenant_id,
        key_id=key_id,
        purpose=purpose,
        filename=filename[:255],
        bytes=len(content),
        content=content,
    )


def file_delete(*, file: BatchFile) -> None:
    """Its content goes; the row stays for the batches that name it. A document for vector stores
    goes whole, and with it its place in every store and every chunk made of it (on_delete CASCADE):
    nothing of a deleted document stays searchable."""
    if file.purpose == BatchFile.Purpose.ASSISTANTS:
        from gateway.knowledge.models import VectorStoreFile
        from gateway.knowledge.services import waited_for_ingestion

        with transaction.atomic():
            waited_for_ingestion(VectorStoreFile.objects.filter(file=file))
            BatchFile.objects.filter(pk=file.pk).delete()
        return
    BatchFile.objects.filter(pk=file.pk, deleted_at=None).update(deleted_at=timezone.now(), content=b"", bytes=0)


# --- batches -----------------------------------------------------------------------------------


def batch_create(
    *, tenant_id: int, key_id: int, input_file: BatchFile, completion_window: str, metadata: dict | None
) -> Batch:
    """A new batch, validating: a worker reads its file next (gateway.batches.tasks.start_batch)."""
    now = timezone.now()
    batch = Batch.objects.create(
        tenant_id=tenant_id,
        key_id=key_id,
        endpoint="/v1/chat/completions",
        completion_window=completion_window,
        input_file=input_file,
        metadata=metadata,
        created_at=now,
        expires_at=now + COMPLETION_WINDOW,
    )
    transaction.on_commit(lambda: signature(START_BATCH).delay(batch.pk))
    return batch


def batch_start(*, batch_id: int) -> bool:
    """Read the input file into items and start the batch (in_progress), or fail it with the errors
    of every bad line. True when it started. Safe to repeat: only a validating batch is read.

    Reading fails the batch when it fails for a reason of its own (a value the database refuses, a
    bug): reading it again would fail again, each sweep, until the batch expired. Only a database
    that is away leaves it validating, for the sweep to start it again."""
    try:
        return _batch_read(batch_id=batch_id)
    except (OperationalError, InterfaceError):
        raise
    except Exception:
        log.exception("batch %s: its input file could not be read", batch_id)
        now = timezone.now()
        errors = [{"code": "invalid_file", "message": "The input file could not be read.", "param": None, "line": None}]
        Batch.objects.filter(pk=batch_id, status=Batch.Status.VALIDATING).update(
            status=Batch.Status.FAILED, failed_at=now, errors={"object": "list", "data": errors}
        )
        return False


@transaction.atomic
def _batch_read(*, batch_id: int) -> bool:
    batch = Batch.objects.select_for_update().select_related("input_file").filter(pk=batch_id).first()
    if batch is None or batch.status not in (Batch.Status.VALIDATING, Batch.Status.CANCELLING):
        return False
    now = timezone.now()
    if batch.status == Batch.Status.CANCELLING:  # cancelled while it waited to be read
        Batch.objects.filter(pk=batch.pk).update(status=Batch.Status.CANCELLED, cancelled_at=now)
        return False
    if batch.input_file.deleted_at is not None:
        requests, errors = (
            [],
            [{"code": "file_deleted", "message": "The input file was deleted.", "param": None, "line": None}],
        )
    else:
        requests, errors = read_requests(
            bytes(batch.input_file.content), endpoint=batch.endpoint, max_requests=settings.BATCH_MAX_REQUESTS
        )
    if errors:
        Batch.objects.filter(pk=batch.pk).update(
            status=Batch.Status.FAILED, failed_at=now, errors={"object": "list", "data": errors}
        )
        return False
    BatchItem.objects.bulk_create(
        [BatchItem(batch=batch, line=r.line, custom_id=r.custom_id, body=r.body) for r in requests], batch_size=1000
    )
    Batch.objects.filter(pk=batch.pk).update(status=Batch.Status.IN_PROGRESS, in_progress_at=now)
    return True


@transaction.atomic
def batch_cancel(*, batch: Batch) -> Batch:
    """Stop a batch: every item not started yet is cancelled at once, those a worker has claimed and
    is waiting to run included; requests already started finish, and the batch is closed (cancelled)
    with what was done by then. The batch row is locked first: a worker starting an item holds the
    same lock (item_start), so each start either happened before the cancel or is refused after it.
    Cancelling a cancelled or cancelling batch changes nothing; a finished one cannot be cancelled
    (the caller checks)."""
    locked = (
        Batch.objects.select_for_update()
        .filter(pk=batch.pk, status__in=(Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS))
        .values_list("pk", flat=True)
        .first()
    )
    if locked is not None:
        now = timezone.now()
        Batch.objects.filter(pk=batch.pk).update(status=Batch.Status.CANCELLING, cancelling_at=now)
        BatchItem.objects.filter(batch_id=batch.pk, status=BatchItem.Status.QUEUED).update(
            status=BatchItem.Status.CANCELLED, finished_at=now, lease_owner="", lease_until=None
        )
        transaction.on_commit(lambda: signature(FINALIZE_BATCH).delay(batch.pk))
    batch.refresh_from_db()
    return batch


def batch_expire(*, batch_id: int) -> bool:
    """Past its completion window: queued items will not run (they go to the error file as expired);
    the batch closes as expired once the requests in flight are done."""
    now = timezone.now()
    with transaction.atomic():
        batch = Batch.objects.select_for_update().filter(pk=batch_id, expires_at__lte=now).first()
        if batch is None:
            return False
        if batch.status == Batch.Status.VALIDATING:
            Batch.objects.filter(pk=batch.pk).update(status=Batch.Status.EXPIRED, expired_at=now)
            return True
        if batch.status != Batch.Status.IN_PROGRESS:
            return False
        BatchItem.objects.filter(batch_id=batch.pk, status=BatchItem.Status.QUEUED).update(
            status=BatchItem.Status.EXPIRED, finished_at=now, lease_owner="", lease_until=None
        )
    batch_finalize(batch_id=batch_id)
    return True


def batch_finalize(*, batch_id: int) -> bool:
    """Close a batch whose items are all done (in_progress → finalizing → completed or expired; a
    cancelling batch → cancelled): its output and error files are written and the batch closed in one
    transaction, once, whoever gets there first. An item still running under a live lease keeps it
    open; in a cancelling batch, one whose lease ran out (its worker died) is cancelled. True when this
    call closed it."""
    unfinished = BatchItem.objects.filter(batch_id=OuterRef("pk"), status__in=UNFINISHED)
    # Finalizing is what readers see while the files are written.
    Batch.objects.filter(~Exists(unfinished), pk=batch_id, status=Batch.Status.IN_PROGRESS).update(
        status=Batch.Status.FINALIZING, finalizing_at=timezone.now()
    )
    with transaction.atomic():
        batch = Batch.objects.select_for_update().filter(pk=batch_id).first()
        if batch is None or batch.status not in (Batch.Status.FINALIZING, Batch.Status.CANCELLING):
            return False
        items = BatchItem.objects.filter(batch_id=batch_id)
        now = timezone.now()
        if batch.status == Batch.Status.CANCELLING:
            items.filter(
                Q(status=BatchItem.Status.QUEUED) | Q(status=BatchItem.Status.RUNNING, lease_until__lt=Now())
            ).update(status=BatchItem.Status.CANCELLED, finished_at=now, lease_owner="", lease_until=None)
            if items.filter(status__in=UNFINISHED).exists():
                return False
        output, errors, usage = _result_files(batch)
        if batch.status == Batch.Status.CANCELLING:
            final = {"status": Batch.Status.CANCELLED, "cancelled_at": now}
        elif items.filter(status=BatchItem.Status.EXPIRED).exists():
            final = {"status": Batch.Status.EXPIRED, "expired_at": now}
        else:
            final = {"status": Batch.Status.COMPLETED, "completed_at": now}
        Batch.objects.filter(pk=batch.pk).update(output_file=output, error_file=errors, usage=usage, **final)
    return True


def item_public_id(request_id: str) -> str:
    return "batch_req_" + uuid.uuid5(uuid.NAMESPACE_URL, request_id).hex


def _result_files(batch: Batch) -> tuple[BatchFile | None, BatchFile | None, dict]:
    """The output file (answered requests) and the error file (the rest), one line per request in
    input order, as OpenAI writes them; None for a file that would be empty."""
    answered, failed = [], []
    prompt = completion = 0
    for item in BatchItem.objects.filter(batch_id=batch.pk).order_by("line").iterator(chunk_size=1000):
        request_id = f"{batch.public_id}:{item.line}"
        line = {"id": item_public_id(request_id), "custom_id": item.custom_id, "response": None, "error": None}
        if item.status in ITEM_ERRORS:
            code, message = ITEM_ERRORS[item.status]
            line["error"] = {"code": code, "message": message}
            failed.append(orjson.dumps(line))
            continue
        line["response"] = {"status_code": item.response_status, "request_id": request_id, "body": item.response}
        if item.status == BatchItem.Status.SUCCEEDED:
            answered.append(orjson.dumps(line))
            prompt += item.prompt_tokens
            completion += item.completion_tokens
        else:
            failed.append(orjson.dumps(line))

    def write(lines: list[bytes], suffix: str) -> BatchFile | None:
        if not lines:
            return None
        content = b"\n".join(lines) + b"\n"
        return BatchFile.objects.create(
            tenant_id=batch.tenant_id,
            key_id=batch.key_id,
            purpose=BatchFile.Purpose.BATCH_OUTPUT,
            filename=f"{batch.public_id}_{suffix}.jsonl",
            bytes=len(content),
            content=content,
        )

    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }
    return write(answered, "output"), write(failed, "error"), usage


# --- items: claims, leases, results ------------------------------------------------------------


def _lease_end(seconds: float):
    return Now() + timedelta(seconds=seconds)


def items_claim(*, batch_id: int, owner: str, count: int, lease_seconds: float) -> list[BatchItem]:
    """Lease up to `count` items of a running batch: queued ones whose backoff is over and that no
    live lease holds, and running ones whose lease ran out (their worker died or stalled). They stay
    queued until item_start. Rows other workers are claiming at the same moment are skipped, not
    waited for."""
    free = Q(lease_until=None) | Q(lease_until__lt=Now())
    claimable = (
        Q(free, status=BatchItem.Status.QUEUED, not_before=None)
        | Q(free, status=BatchItem.Status.QUEUED, not_before__lte=Now())
        | Q(status=BatchItem.Status.RUNNING, lease_until__lt=Now())
    )
    with transaction.atomic():
        ids = list(
            BatchItem.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(claimable, batch_id=batch_id, batch__status=Batch.Status.IN_PROGRESS)
            .order_by("line")
            .values_list("id", flat=True)[:count]
        )
        if not ids:
            return []
        BatchItem.objects.filter(id__in=ids).update(
            status=BatchItem.Status.QUEUED, lease_owner=owner, lease_until=_lease_end(lease_seconds)
        )
    return list(BatchItem.objects.filter(id__in=ids).order_by("line"))


def item_start(*, item_id: int, batch_id: int, owner: str) -> bool:
    """Mark a claimed item running, right before its request goes upstream: only while the batch is
    in progress and the claim is still this worker's. Under the batch row's lock, which
    batch_cancel takes too: after a cancel has returned, no item starts. False: do not run it."""
    with transaction.atomic():
        running = (
            Batch.objects.select_for_update(no_key=True)
            .filter(pk=batch_id, status=Batch.Status.IN_PROGRESS)
            .values_list("pk", flat=True)
            .first()
        )
        if running is None:
            return False
        return (
            BatchItem.objects.filter(pk=item_id, status=BatchItem.Status.QUEUED, lease_owner=owner).update(
                status=BatchItem.Status.RUNNING
            )
            == 1
        )


def leases_renew(*, owner: str, item_ids: list[int], lease_seconds: float) -> int:
    """Extend this worker's leases on the items it has claimed or is running; returns how many it
    still holds."""
    if not item_ids:
        return 0
    return BatchItem.objects.filter(id__in=item_ids, status__in=UNFINISHED, lease_owner=owner).update(
        lease_until=_lease_end(lease_seconds)
    )


def item_finish(
    *,
    item_id: int,
    owner: str,
    succeeded: bool,
    response_status: int,
    response: dict,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
) -> bool:
    """Write the item's result, if the lease is still this worker's (running, or claimed and
    answered without going upstream: a cache hit, a refusal); False when another worker has taken
    the item over (this run's result is dropped: the other run's will be the one) or a cancel or
    expiry released it."""
    return (
        BatchItem.objects.filter(pk=item_id, status__in=UNFINISHED, lease_owner=owner).update(
            status=BatchItem.Status.SUCCEEDED if succeeded else BatchItem.Status.FAILED,
            response_status=response_status,
            response=response,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finished_at=Now(),
            lease_owner="",
            lease_until=None,
        )
        == 1
    )


def item_retry(*, item_id: int, owner: str, delay_seconds: float) -> bool:
    """Back to the queue after a failure retrying can fix; its next run is a new run (tries + 1)."""
    return (
        BatchItem.objects.filter(pk=item_id, status__in=UNFINISHED, lease_owner=owner).update(
            status=BatchItem.Status.QUEUED,
            tries=F("tries") + 1,
            not_before=_lease_end(delay_seconds),
            lease_owner="",
            lease_until=None,
        )
        == 1
    )


# --- what nobody is doing ----------------------------------------------------------------------


@dataclass
class Sweep:
    to_start: list[int]  # validating for long: the worker reading it died
    to_expire: list[int]  # past the completion window
    to_run: list[int]  # work left and nobody holding a live lease on any of it
    to_close: list[int]  # nothing left to wait for


def batches_sweep() -> Sweep:
    """Batches that need a worker because the one that had them died (or never came), or that are
    past their window. Beat asks every SENTINEL_BATCH_SWEEP_SECONDS; items are only ever claimed
    through their leases, so a batch handed to a second worker is still safe."""
    now = timezone.now()
    stale = now - timedelta(seconds=max(60.0, 2 * settings.BATCH_LEASE_SECONDS))
    left = BatchItem.objects.filter(batch_id=OuterRef("pk"), status__in=UNFINISHED)
    live = BatchItem.objects.filter(batch_id=OuterRef("pk"), status__in=UNFINISHED, lease_until__gte=Now())
    to_expire = list(
        Batch.objects.filter(
            status__in=(Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS), expires_at__lte=now
        ).values_list("pk", flat=True)
    )
    return Sweep(
        to_start=list(
            Batch.objects.filter(status=Batch.Status.VALIDATING, created_at__lt=stale)
            .exclude(pk__in=to_expire)
            .values_list("pk", flat=True)
        ),
        to_expire=to_expire,
        to_run=list(
            Batch.objects.filter(Exists(left), ~Exists(live), status=Batch.Status.IN_PROGRESS)
            .exclude(pk__in=to_expire)
            .values_list("pk", flat=True)
        ),
        to_close=list(
            Batch.objects.filter(
                Q(~Exists(left), status=Batch.Status.IN_PROGRESS)
                | Q(~Exists(live), status=Batch.Status.CANCELLING)
                | Q(status=Batch.Status.FINALIZING, finalizing_at__lt=stale)
            ).values_list("pk", flat=True)
        ),
    )
