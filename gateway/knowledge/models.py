"""Tenant knowledge bases: vector stores, the files in them and their chunks (models of the gateway
app, kept together here; docs/knowledge.md).

A chunk keeps its text, its embedding (the local all-MiniLM-L6-v2, 384 dimensions, the cache's own
embedder) and a full-text vector PostgreSQL computes from the text, so a search is one hybrid
query: nearest embeddings and best full-text matches, fused. Chunks belong to one store and one of
its files, and go with them.
"""

from __future__ import annotations

import secrets

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.utils import timezone
from pgvector.django import VectorField

from gateway.cache.embedder import DIMENSION

# The full-text configuration of every chunk and query: English stemming ("refunds" finds "refund").
TEXT_SEARCH_CONFIG = "english"


def new_store_id() -> str:
    return "vs_" + secrets.token_hex(12)


class VectorStore(models.Model):
    public_id = models.CharField(max_length=40, unique=True, default=new_store_id, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=256, blank=True)
    description = models.CharField(max_length=512, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_active_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "created_at"])]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.name})"


class VectorStoreFile(models.Model):
    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        FAILED = "failed"

    store = models.ForeignKey(VectorStore, on_delete=models.CASCADE, related_name="files")
    file = models.ForeignKey("gateway.BatchFile", on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IN_PROGRESS)
    last_error = models.JSONField(null=True, blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    usage_bytes = models.PositiveBigIntegerField(default=0)
    chunks = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["store", "file"], name="one_file_per_store")]

    def __str__(self) -> str:
        return f"{self.file_id} in {self.store_id} ({self.status})"


class Chunk(models.Model):
    store = models.ForeignKey(VectorStore, on_delete=models.CASCADE, related_name="+")
    store_file = models.ForeignKey(VectorStoreFile, on_delete=models.CASCADE, related_name="+")
    position = models.PositiveIntegerField()
    text = models.TextField()
    embedding = VectorField(dimensions=DIMENSION)
    search = models.GeneratedField(
        expression=SearchVector("text", config=TEXT_SEARCH_CONFIG),
        output_field=SearchVectorField(),
        db_persist=True,
    )

    class Meta:
        ordering = ["store_file", "position"]
        indexes = [
            models.Index(fields=["store", "store_file"]),
            # A store's full-text matches from the index alone (btree_gin puts the store in the GIN
            # index): with the text's index only, a large store's search read and tested every chunk.
            GinIndex(fields=["store", "search"], name="chunk_store_search"),
        ]

    def __str__(self) -> str:
        return f"chunk {self.position} of {self.store_file_id}"
