"""Virtual keys: the secret exists once, at creation; only its digest is stored."""

import hashlib

import pytest
from django.db import connection

from tenants.models import VirtualKey
from tenants.services import KEY_PREFIX, key_create, key_revoke


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
