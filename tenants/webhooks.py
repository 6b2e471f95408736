"""Outgoing webhooks: queue an event for every endpoint that wants it, deliver it signed, retry with
backoff, and keep a delivery log.

Signature: `X-Sentinel-Signature: sha256=<hex>` over `<timestamp>.<body>` with the endpoint's secret,
and `X-Sentinel-Timestamp` so receivers can refuse replays.

Deliveries go through the egress guard (sentinel.egress): an endpoint whose URL it refuses (an
internal address, at the time of the attempt) is never contacted, and the delivery fails at once
with the guard's reason, never a status or an error from the target.
"""

from __future__ import annotations

import hashlib
import hmac
import time

import aiohttp
import orjson
from celery import signature
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from sentinel import egress
from tenants.models import WebhookDelivery, WebhookEndpoint

TIMEOUT_SECONDS = 5.0
MAX_ATTEMPTS = 8
MAX_ANSWER_BYTES = 64 * 1024  # only the status matters; the rest is not read
DELIVER_WEBHOOK = "tenants.tasks.deliver_webhook"  # queued by name: the task calls webhook_attempt here


def sign(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def webhook_publish(*, event: str, payload: dict, tenant_id: int | None = None) -> list[int]:
    """Record a delivery for every active endpoint subscribed to `event` (the tenant's own, and the
    operators'), and queue them once the current transaction commits. Returns the delivery ids."""
    scope = Q(tenant__isnull=True) | Q(tenant_id=tenant_id) if tenant_id else Q(tenant__isnull=True)
    endpoints = WebhookEndpoint.objects.filter(scope, active=True)
    ids = []
    for endpoint in endpoints:
        if endpoint.events and event not in endpoint.events:
            continue
        delivery = WebhookDelivery.objects.create(endpoint=endpoint, event=event, payload=payload)
        ids.append(delivery.pk)
    for delivery_id in ids:
        transaction.on_commit(lambda delivery_id=delivery_id: signature(DELIVER_WEBHOOK).delay(delivery_id))
    return ids


def webhook_attempt(*, delivery: WebhookDelivery) -> bool:
    """One delivery attempt; records the outcome. True when the receiver answered 2xx."""
    body = orjson.dumps({"event": delivery.event, "delivery": delivery.pk, "data": delivery.payload})
    timestamp = str(int(time.time()))
    headers = {
        "content-type": "application/json",
        "x-sentinel-event": delivery.event,
        "x-sentinel-delivery": str(delivery.pk),
        "x-sentinel-timestamp": timestamp,
        "x-sentinel-signature": sign(delivery.endpoint.secret(), timestamp, body),
    }
    status_code, error, refused = None, "", False
    try:
        reply = egress.post_sync(
            delivery.endpoint.url, data=body, headers=headers, timeout=TIMEOUT_SECONDS, max_bytes=MAX_ANSWER_BYTES
        )
        status_code = reply.status
        ok = 200 <= status_code < 300
        if not ok:
            error = f"HTTP {status_code}"
    except egress.EgressRefused as exc:
        # Final: retrying would not change the address, and the log says only what the guard saw.
        ok, refused, error = False, True, f"refused by the egress guard: {exc.reason}"[:300]
    except (aiohttp.ClientError, TimeoutError, egress.ResponseTooLarge) as exc:
        ok, error = False, f"{type(exc).__name__}: {exc}"[:300]
    attempts = delivery.attempts + 1
    if ok:
        status = WebhookDelivery.Status.DELIVERED
    elif refused or attempts >= MAX_ATTEMPTS:
        status = WebhookDelivery.Status.FAILED
    else:
        status = WebhookDelivery.Status.PENDING
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        attempts=attempts,
        status=status,
        last_status_code=status_code,
        last_error=error,
        delivered_at=timezone.now() if ok else None,
    )
    return ok
