"""Reads of files and batches, always inside one tenant (another tenant's id is simply not found),
and their OpenAI object shapes."""

from __future__ import annotations

import re
from datetime import datetime

from django.db.models import Count, Q

from gateway.batches.models import Batch, BatchFile, BatchItem

# What ids look like (file-<hex>, batch_<hex>): anything else names nothing, and never reaches the
# database (which refuses some characters outright, NUL among them).
PUBLIC_ID = re.compile(r"[A-Za-z0-9_\-]{1,64}")  # whole: fullmatch


def file_for(*, tenant_id: int, public_id: str, with_content: bool = False) -> BatchFile | None:
    if not PUBLIC_ID.fullmatch(public_id):
        return None
    files = BatchFile.objects.filter(tenant_id=tenant_id, public_id=public_id, deleted_at=None)
    return (files if with_content else files.defer("content")).first()


def files_page(
    *, tenant_id: int, purpose: str | None, after: BatchFile | None, limit: int, newest_first: bool
) -> tuple[list[BatchFile], bool]:
    """One page of the tenant's files and whether more follow."""
    files = BatchFile.objects.filter(tenant_id=tenant_id, deleted_at=None).defer("content")
    if purpose:
        files = files.filter(purpose=purpose)
    if after is not None:
        before = Q(created_at__lt=after.created_at) | Q(created_at=after.created_at, pk__lt=after.pk)
        beyond = Q(created_at__gt=after.created_at) | Q(created_at=after.created_at, pk__gt=after.pk)
        files = files.filter(before if newest_first else beyond)
    order = ("-created_at", "-pk") if newest_first else ("created_at", "pk")
    rows = list(files.order_by(*order)[: limit + 1])
    return rows[:limit], len(rows) > limit


def batch_for(*, tenant_id: int, public_id: str) -> Batch | None:
    if not PUBLIC_ID.fullmatch(public_id):
        return None
    return _with_files(Batch.objects.filter(tenant_id=tenant_id, public_id=public_id)).first()


def batches_page(*, tenant_id: int, after: Batch | None, limit: int) -> tuple[list[Batch], bool]:
    """One page of the tenant's batches, newest first, and whether more follow."""
    batches = _with_files(Batch.objects.filter(tenant_id=tenant_id))
    if after is not None:
        batches = batches.filter(Q(created_at__lt=after.created_at) | Q(created_at=after.created_at, pk__lt=after.pk))
    rows = list(batches.order_by("-created_at", "-pk")[: limit + 1])
    return rows[:limit], len(rows) > limit


def _with_files(batches):
    return batches.select_related("input_file", "output_file", "error_file").defer(
        "input_file__content", "output_file__content", "error_file__content"
    )


def request_counts(batch_ids: list[int]) -> dict[int, dict[str, int]]:
    """total / completed / failed per batch (expired requests count as failed, cancelled ones as neither)."""
    rows = (
        BatchItem.objects.filter(batch_id__in=batch_ids)
        .values("batch_id")
        .annotate(
            total=Count("id"),
            completed=Count("id", filter=Q(status=BatchItem.Status.SUCCEEDED)),
            failed=Count("id", filter=Q(status__in=(BatchItem.Status.FAILED, BatchItem.Status.EXPIRED))),
        )
    )
    counts = {batch_id: {"total": 0, "completed": 0, "failed": 0} for batch_id in batch_ids}
    for row in rows:
        counts[row["batch_id"]] = {"total": row["total"], "completed": row["completed"], "failed": row["failed"]}
    return counts


def stamp(moment: datetime | None) -> int | None:
    """A moment as OpenAI writes one: whole Unix seconds (None stays None)."""
    return int(moment.timestamp()) if moment else None


def file_object(file: BatchFile) -> dict:
    return {
        "id": file.public_id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": stamp(file.created_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def batch_object(batch: Batch, counts: dict[str, int]) -> dict:
    return {
        "id": batch.public_id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": batch.errors,
        "input_file_id": batch.input_file.public_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file.public_id if batch.output_file_id else None,
        "error_file_id": batch.error_file.public_id if batch.error_file_id else None,
        "created_at": stamp(batch.created_at),
        "in_progress_at": stamp(batch.in_progress_at),
        "expires_at": stamp(batch.expires_at),
        "finalizing_at": stamp(batch.finalizing_at),
        "completed_at": stamp(batch.completed_at),
        "failed_at": stamp(batch.failed_at),
        "expired_at": stamp(batch.expired_at),
        "cancelling_at": stamp(batch.cancelling_at),
        "cancelled_at": stamp(batch.cancelled_at),
        "request_counts": counts,
        "usage": batch.usage,
        "metadata": batch.metadata,
    }


def seconds_until_claimable(*, batch_id: int) -> float | None:
    """How soon one of the batch's unfinished items may be claimed (0: now): the end of a retry's
    backoff, or of another worker's lease (on an item it runs, or has claimed and not started).
    None when nothing is unfinished."""
    from django.db.models import Min
    from django.db.models.functions import Now
    from django.utils import timezone

    queued, running = BatchItem.Status.QUEUED, BatchItem.Status.RUNNING
    found = BatchItem.objects.filter(batch_id=batch_id, status__in=(queued, running)).aggregate(
        unfinished=Count("id"),
        ready=Count(
            "id",
            filter=Q(status=queued)
            & (Q(not_before=None) | Q(not_before__lte=Now()))
            & (Q(lease_until=None) | Q(lease_until__lt=Now())),
        ),
        retry_at=Min("not_before", filter=Q(status=queued)),
        lease_ends=Min("lease_until"),
    )
    if not found["unfinished"]:
        return None
    if found["ready"]:
        return 0.0
    now = timezone.now()
    moments = [moment for moment in (found["retry_at"], found["lease_ends"]) if moment is not None]
    return max(0.0, min((moment - now).total_seconds() for moment in moments)) if moments else 0.0
