"""Writes to tenants and keys. Each one also tells the gateway processes what changed."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from gateway.localstate import announce_change, blocked_key_marker, blocked_tenant_marker
from sentinel.redis_clients import sync_redis
from tenants.models import Tenant, VirtualKey

KEY_PREFIX = "sk-sen-"
VISIBLE_CHARS = 12
# Markers outlive every cache of key settings (process and Redis), so a revoked key cannot come back.
BLOCK_MARKER_SECONDS = 24 * 3600


def key_digest(secret: str) -> str:
    """Secrets carry 256 random bits, so a plain SHA-256 is as safe to store as a slow hash."""
    return hashlib.sha256(secret.encode()).hexdigest()


def key_create(
    *,
    tenant: Tenant,
    name: str,
    created_by=None,
    expires_at: datetime | None = None,
    allowed_models: list[str] | None = None,
    **limits,
) -> tuple[VirtualKey, str]:
    """Issue a key; the secret is returned here and nowhere else, ever. `limits` are VirtualKey's
    limit fields (tier, requests_per_minute, tokens_per_minute, max_concurrent)."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = VirtualKey.objects.create(
        tenant=tenant,
        name=name,
        prefix=secret[:VISIBLE_CHARS],
        digest=key_digest(secret),
        expires_at=expires_at,
        allowed_models=list(allowed_models or []),
        created_by=created_by,
        **limits,
    )
    return key, secret


@transaction.atomic
def key_revoke(*, key: VirtualKey) -> None:
    updated = VirtualKey.objects.filter(pk=key.pk, status=VirtualKey.Status.ACTIVE).update(
        status=VirtualKey.Status.REVOKED, revoked_at=timezone.now()
    )
    if updated:
        key.refresh_from_db()
        transaction.on_commit(lambda: sync_redis().set(blocked_key_marker(key.digest), 1, ex=BLOCK_MARKER_SECONDS))
        announce_change()


@transaction.atomic
def tenant_set_status(*, tenant: Tenant, status: str) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(status=status)
    tenant.status = status
    marker = blocked_tenant_marker(tenant.pk)
    if status == Tenant.Status.SUSPENDED:
        transaction.on_commit(lambda: sync_redis().set(marker, 1, ex=BLOCK_MARKER_SECONDS))
    else:
        transaction.on_commit(lambda: sync_redis().delete(marker))
    announce_change()
