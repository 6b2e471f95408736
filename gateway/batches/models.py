"""Files, batches and their items (models of the gateway app, kept together here).

File contents live in PostgreSQL (bytea): one store that every web and worker process already shares
and backs up, written in the same transactions as the batches that use it. Sizes are bounded
(SENTINEL_BATCH_MAX_FILE_BYTES) because a file is read whole when it is validated or served.
"""

from __future__ import annotations

import secrets

from django.db import models
from django.utils import timezone


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(16)


class BatchFile(models.Model):
    """An uploaded input file (purpose `batch`), the output or error file of a batch, or a document
    for a vector store (purpose `assistants`)."""

    class Purpose(models.TextChoices):
        BATCH = "batch"
        BATCH_OUTPUT = "batch_output"
        ASSISTANTS = "assistants"  # a document for a vector store (gateway/knowledge)

    public_id = models.CharField(max_length=40, unique=True, default=new_file_id, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    key = models.ForeignKey("tenants.VirtualKey", null=True, on_delete=models.SET_NULL, related_name="+")
    purpose = models.CharField(max_length=16, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField()
    content = models.BinaryField(editable=False)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    deleted_at = models.DateTimeField(
        null=True, blank=True, help_text="Deleted by its tenant: content gone, row kept for the batches naming it."
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.filename})"


class Batch(models.Model):
    class Status(models.TextChoices):
        VALIDATING = "validating"
        FAILED = "failed"
        IN_PROGRESS = "in_progress"
        FINALIZING = "finalizing"
        COMPLETED = "completed"
        EXPIRED = "expired"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"

    public_id = models.CharField(max_length=40, unique=True, default=new_batch_id, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    key = models.ForeignKey(
        "tenants.VirtualKey",
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The key it was created with: its items run with that key's limits, budgets and allowlist.",
    )
    endpoint = models.CharField(max_length=60)
    completion_window = models.CharField(max_length=8)
    input_file = models.ForeignKey(BatchFile, on_delete=models.PROTECT, related_name="+")
    output_file = models.ForeignKey(BatchFile, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    error_file = models.ForeignKey(BatchFile, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.VALIDATING)
    errors = models.JSONField(null=True, blank=True, help_text="Why validation failed, line by line.")
    metadata = models.JSONField(null=True, blank=True)
    usage = models.JSONField(null=True, blank=True, help_text="Tokens of the answered requests, when finalized.")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "batches"
        indexes = [models.Index(fields=["status"], name="batch_status")]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.status})"


class BatchItem(models.Model):
    """One line of a batch's input. A worker runs it under a lease (lease_owner, lease_until) that it
    renews while the request is in flight; an item whose lease ran out is claimed again by another
    worker. Its result is written once, by a conditional update only the lease holder can make."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"
        EXPIRED = "expired"

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="items")
    line = models.PositiveIntegerField(help_text="Line number in the input file (from 1).")
    custom_id = models.CharField(max_length=512)
    body = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    lease_owner = models.CharField(max_length=120, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveSmallIntegerField(
        default=0, help_text="Runs that ended in a failure worth retrying (each has its own ledger record)."
    )
    not_before = models.DateTimeField(null=True, blank=True, help_text="Retry backoff: not claimed before this.")
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True, help_text="The answer (or error) body.")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["batch", "line"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "line"], name="one_item_per_line"),
            models.UniqueConstraint(fields=["batch", "custom_id"], name="custom_id_unique_in_batch"),
        ]
        indexes = [models.Index(fields=["batch", "status", "line"], name="batch_item_claims")]

    def __str__(self) -> str:
        return f"{self.batch_id}:{self.line} ({self.status})"

    @property
    def request_id(self) -> str:
        """The id its request carries everywhere: pipeline, provider, ledger."""
        return f"{self.batch.public_id}:{self.line}"
