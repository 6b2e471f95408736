"""A tenant-scoped object of every kind for tenants A and B of the shared tenancy fixture, and a
signed-in test client per person."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import LedgerDeadLetter, LedgerEntry
from gateway.models import Batch, BatchFile, CacheEntry, VectorStore
from gateway.screening.models import ScreeningPolicy
from tenants.audit import audit_record
from tenants.models import (
    AuditEntry,
    Budget,
    BudgetAlert,
    Membership,
    Team,
    VirtualKey,
    WebhookDelivery,
    WebhookEndpoint,
)
from tenants.services import key_create
from tests.conftest import unique


def sign_in(page, gateway, user, password: str, *, console: str | None = None) -> None:
    """Signs `user` in to the console in a browser page (tests/console/test_browser.py), at the
    gateway's URL or at `console` (the same server under another name)."""
    page.goto(f"{console or gateway.url}/admin/login/")
    page.fill("#id_username", user.get_username())
    page.fill("#id_password", password)
    page.click("[type=submit]")  # Unfold: a <button>
    page.wait_for_selector("#nav-sidebar-inner")  # signed in: the sidebar


def as_user(user) -> Client:
    web = Client()
    web.force_login(user)
    return web


@dataclass
class World:
    """`a` and `b`: {model name: object}; `marker` is in a searchable field of every one of them."""

    tenancy: object
    marker: str
    a: dict
    b: dict


def _objects(tenancy, tenant, member, marker: str, side: str) -> dict:
    key, _ = key_create(tenant=tenant, name=f"{marker}-{side}")
    budget = Budget.objects.create(tenant=tenant, key=key, period="monthly", limit_usd=Decimal("10"))
    endpoint = WebhookEndpoint.objects.create(tenant=tenant, url=f"http://127.0.0.1:9/{marker}-{side}")
    endpoint.set_secret("s")
    endpoint.save()
    batch_input = BatchFile.objects.create(
        tenant=tenant, key=key, purpose="batch", filename=f"{marker}-{side}.jsonl", bytes=0, content=b""
    )
    return {
        "tenant": tenant,
        "membership": Membership.objects.get(tenant=tenant, user=member),
        "virtualkey": key,
        "team": Team.objects.create(tenant=tenant, name=f"{marker}-{side}"),
        "budget": budget,
        "budgetalert": BudgetAlert.objects.create(budget=budget, period_start=date(2026, 12, 1), spent_usd=8),
        "webhookendpoint": endpoint,
        "webhookdelivery": WebhookDelivery.objects.create(endpoint=endpoint, event=f"{marker}.{side}", payload={}),
        "ledgerentry": LedgerEntry.objects.create(
            request_id=marker,  # the request log's search is by the whole id: both sides share it
            created_at=timezone.now(),
            tenant=tenant,
            key=key,
            model_requested="gpt-4o-mini",
            status_code=200,
        ),
        "ledgerdeadletter": LedgerDeadLetter.objects.create(
            digest=unique("digest"),
            tenant=tenant,
            request_id=f"{marker}-{side}",
            kind=LedgerDeadLetter.Kind.VALUE,
            reason="refused",
            record=b"{}",
        ),
        "cacheentry": CacheEntry.objects.create(
            tenant=tenant,
            partition=unique("p"),
            exact_digest=unique("d"),
            model="gpt-4o-mini",
            prompt=f"{marker} {side}",
            answer={"content": "x"},
            cost_usd=0,
            expires_at=timezone.now(),
        ),
        "batch": Batch.objects.create(
            tenant=tenant,
            key=key,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            input_file=batch_input,
            status=Batch.Status.IN_PROGRESS,
            expires_at=timezone.now(),
        ),
        "screeningpolicy": ScreeningPolicy.objects.create(tenant=tenant),
        "vectorstore": VectorStore.objects.create(tenant=tenant, name=f"{marker}-{side}"),
        "auditentry": audit_record(action=AuditEntry.Action.CHANGED, tenant=tenant, target=f"{marker}-{side}"),
    }


@pytest.fixture
def world(tenancy) -> World:
    marker = unique("iso")
    return World(
        tenancy=tenancy,
        marker=marker,
        a=_objects(tenancy, tenancy.tenant, tenancy.owner, marker, "a"),
        b=_objects(tenancy, tenancy.other, tenancy.outsider, marker, "b"),
    )


def key_of(world: World, side: str) -> VirtualKey:
    return getattr(world, side)["virtualkey"]
