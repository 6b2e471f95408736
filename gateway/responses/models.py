"""Stored responses (a model of the gateway app, kept here): what `previous_response_id` continues
from and `GET /v1/responses/{id}` returns. In PostgreSQL, written before the answer goes out, so
every web process reads it as soon as the client has it; scoped to the tenant whose key made it."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class StoredResponse(models.Model):
    public_id = models.CharField(max_length=64, unique=True, editable=False)
    # Written on the request path, right after the key was authenticated. No database constraint:
    # its check locks the tenant's and the key's rows on every insert (a WAL record each, a MultiXact
    # once two requests of a tenant overlap), a quarter of the insert's time. Deleting a tenant or a
    # key through Django still cascades or nulls (on_delete).
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, db_constraint=False, related_name="+")
    key = models.ForeignKey(
        "tenants.VirtualKey", null=True, on_delete=models.SET_NULL, db_constraint=False, related_name="+"
    )
    request_id = models.CharField(max_length=128, help_text="The ledger's request id for the call that made it.")
    response = models.JSONField(help_text="The Response object the client was answered with.")
    input_items = models.JSONField(help_text="This turn's input items, with their ids (GET .../input_items).")
    conversation = models.JSONField(
        help_text="The conversation so far as chat messages (without instructions), answer included: "
        "what a request naming this one as previous_response_id continues."
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.public_id
