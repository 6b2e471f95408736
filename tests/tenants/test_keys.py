"""Virtual keys: the secret exists once, at creation (or rotation); only its digest is stored. A
rotated key works beside its successor through a grace period, bound by the budgets it handed on."""

import hashlib
import time
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from sentinel.localstate import GENERATION_KEY
from sentinel.redis_clients import sync_redis
from tenants.models import Budget, VirtualKey
from tenants.services import KEY_PREFIX, KeyNotRotatable, key_create, key_digest, key_revoke, key_rotate
from tests.conftest import unique


@pytest.mark.django_db
def test_secret_is_returned_once_and_never_stored(tenant):
    key, secret = key_create(tenant=tenant, name="app")
    assert secret.startswith(KEY_PREFIX) and len(secret) > 40
    assert key.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert key.prefix == secret[:12]
    with connection.cursor() as cursor:
        cursor.execute("select row_to_json(k)::text from tenants_virtualkey k where id = %s", [key.pk])
        (row,) = cursor.fetchone()
    assert secret not in row
    assert secret[12:] not in row


@pytest.mark.django_db
def test_two_keys_never_share_a_secret(tenant):
    secrets = {key_create(tenant=tenant, name=str(i))[1] for i in range(20)}
    assert len(secrets) == 20


@pytest.mark.django_db
def test_revoke_is_recorded_once(tenant):
    key, _ = key_create(tenant=tenant, name="app")
    key_revoke(key=key)
    revoked_at = VirtualKey.objects.get(pk=key.pk).revoked_at
    key_revoke(key=key)
    key.refresh_from_db()
    assert key.status == VirtualKey.Status.REVOKED
    assert key.revoked_at == revoked_at


# --- rotation ------------------------------------------------------------------------------------


def test_rotation_issues_a_successor_with_the_same_settings(tenant):
    expiry = timezone.now() + timedelta(days=90)
    key, _ = key_create(
        tenant=tenant, name="app", allowed_models=["fast"], requests_per_minute=7, max_concurrent=3, expires_at=expiry
    )
    budget = Budget.objects.create(tenant=tenant, key=key, period="daily", limit_usd=Decimal("5"))
    generation = int(sync_redis().get(GENERATION_KEY) or 0)

    new, secret = key_rotate(key=key, grace_seconds=3600)

    assert (new.tenant, new.name, new.allowed_models, new.requests_per_minute, new.max_concurrent) == (
        tenant,
        "app",
        ["fast"],
        7,
        3,
    )
    assert new.expires_at == expiry and new.status == "active" and new.successor is None
    assert new.digest == key_digest(secret) != key.digest
    key.refresh_from_db()
    assert key.successor == new and key.state == "rotated" and key.status == "active"
    assert abs(key.expires_at - (timezone.now() + timedelta(hours=1))) < timedelta(seconds=10)
    budget.refresh_from_db()
    assert budget.key == new
    assert int(sync_redis().get(GENERATION_KEY)) == generation + 1  # gateways drop cached key settings


def test_rotation_never_extends_an_earlier_expiry_and_refuses_twice(tenant, settings):
    settings.KEY_ROTATION_GRACE_SECONDS = 86_400
    soon = timezone.now() + timedelta(minutes=5)
    key, _ = key_create(tenant=tenant, name="app", expires_at=soon)
    new, _ = key_rotate(key=key)
    key.refresh_from_db()
    assert key.expires_at == soon
    with pytest.raises(KeyNotRotatable):
        key_rotate(key=key)
    key_revoke(key=new)
    with pytest.raises(KeyNotRotatable):
        key_rotate(key=new)
    assert VirtualKey.objects.filter(tenant=tenant).count() == 2


def test_a_rotated_key_works_through_its_grace_then_is_refused(gateway, tenant, model, live_db):
    alias, _ = model
    key, old_secret = key_create(tenant=tenant, name="app")

    def status(secret: str) -> tuple[int, str]:
        response = httpx.post(
            f"{gateway.base_url}/chat/completions",
            headers={"authorization": f"Bearer {secret}"},
            json={"model": alias, "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        return response.status_code, response.json().get("error", {}).get("message", "")

    assert status(old_secret)[0] == 200
    _, new_secret = key_rotate(key=key, grace_seconds=1.5)
    rotated_at = time.monotonic()
    assert status(old_secret)[0] == 200
    assert status(new_secret)[0] == 200
    time.sleep(max(0.0, 1.6 - (time.monotonic() - rotated_at)))
    assert status(old_secret) == (401, "This API key has expired.")
    assert status(new_secret)[0] == 200


def test_a_rotated_key_stays_bound_by_the_budgets_it_handed_on(gateway, tenant, model, live_db):
    alias, _ = model
    key, old_secret = key_create(tenant=tenant, name="app")
    Budget.objects.create(tenant=tenant, key=key, period="daily", limit_usd=Decimal("0.0000000001"))
    _, new_secret = key_rotate(key=key, grace_seconds=3600)
    for secret in (old_secret, new_secret):
        response = httpx.post(
            f"{gateway.base_url}/chat/completions",
            headers={"authorization": f"Bearer {secret}"},
            json={"model": alias, "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert (response.status_code, response.json()["error"]["code"]) == (402, "budget_exceeded")


def test_a_small_budget_says_why_it_refuses_and_max_tokens_gets_through(gateway, tenant, model, live_db):
    """A request without max_tokens holds the model's largest output; against a small hard budget
    the 402 says so and what to do, and the same request with a small max_tokens is answered."""
    from gateway.models import Deployment

    alias, (provider,) = model
    Deployment.objects.filter(name=provider).update(
        input_price_override=Decimal("0.000001"), output_price_override=Decimal("0.000001")
    )
    key, secret = key_create(tenant=tenant, name=unique("small-budget"))
    Budget.objects.create(tenant=tenant, key=key, period="daily", limit_usd=Decimal("0.001"))

    def ask(**extra):
        return httpx.post(
            f"{gateway.base_url}/chat/completions",
            headers={"authorization": f"Bearer {secret}", "x-sentinel-cache-control": "no-cache, no-store"},
            json={"model": alias, "messages": [{"role": "user", "content": "hi"}], **extra},
            timeout=30,
        )

    refused = ask()
    error = refused.json()["error"]
    assert (refused.status_code, error["code"]) == (402, "budget_exceeded")
    assert "set max_tokens to hold less" in error["message"] and "holds up to $" in error["message"]
    assert ask(max_tokens=50).status_code == 200
