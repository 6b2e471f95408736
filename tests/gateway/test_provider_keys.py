"""Provider API keys: stored encrypted (never in the clear in the database), or referenced by the name
of an environment variable; set through the admin and never shown back; and what reaches the
provider is the key, over real HTTP, either way."""

from __future__ import annotations

import hashlib
import uuid

import httpx
from django.db import connection
from django.test import Client

from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
from tests.servers import start_gateway


def bearer_digest(secret: str) -> str:
    """What the mock keeps of the Authorization header it received."""
    return hashlib.sha256(f"Bearer {secret}".encode()).hexdigest()[:16]


def model_on(provider: Provider) -> str:
    alias = ModelAlias.objects.create(name=f"keys-{uuid.uuid4().hex[:8]}")
    deployment = Deployment.objects.create(name=provider.name, provider=provider, litellm_model="openai/gpt-4o-mini")
    ChainEntry.objects.create(alias=alias, deployment=deployment)
    return alias.name


def test_a_key_set_in_the_admin_is_stored_encrypted_and_never_shown_back(tenancy, mock_provider, live_db):
    secret = f"sk-admin-{uuid.uuid4().hex}"
    name = f"keys-{uuid.uuid4().hex[:8]}"
    admin = Client()
    admin.force_login(tenancy.superuser)
    response = admin.post(
        "/admin/gateway/provider/add/",
        {
            "name": name,
            "kind": "openai",
            "api_base": mock_provider.api_base(name),
            "api_key": secret,
            "api_key_env": "",
            "timeout_seconds": "30",
            "first_token_timeout_seconds": "10",
            "litellm_params": "{}",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    provider = Provider.objects.get(name=name)
    assert provider.api_key() == secret
    with connection.cursor() as cursor:  # the row itself: ciphertext only
        cursor.execute("select * from gateway_provider where id = %s", [provider.pk])
        row = cursor.fetchone()
    assert secret not in repr(row) and secret.encode() not in bytes(provider.api_key_encrypted)
    page = admin.get(f"/admin/gateway/provider/{provider.pk}/change/").content.decode()
    assert secret not in page and secret[-12:] not in page
    listing = admin.get("/admin/gateway/provider/").content.decode()
    assert secret not in listing

    # Saving the form again with the key left blank keeps it; "clear" removes it.
    form = {
        "name": name,
        "kind": "openai",
        "api_base": provider.api_base,
        "api_key": "",
        "api_key_env": "",
        "timeout_seconds": "30",
        "first_token_timeout_seconds": "10",
        "litellm_params": "{}",
    }
    assert admin.post(f"/admin/gateway/provider/{provider.pk}/change/", form).status_code == 302
    assert Provider.objects.get(pk=provider.pk).api_key() == secret
    form["clear_api_key"] = "on"
    assert admin.post(f"/admin/gateway/provider/{provider.pk}/change/", form).status_code == 302
    assert Provider.objects.get(pk=provider.pk).api_key() is None


def test_the_provider_gets_the_stored_key_or_the_one_an_environment_variable_names(
    test_database_name, tenant, make_key, mock_provider, live_db
):
    stored_secret, env_secret = f"sk-stored-{uuid.uuid4().hex}", f"sk-env-{uuid.uuid4().hex}"
    variable = f"SENTINEL_TEST_PROVIDER_KEY_{uuid.uuid4().hex[:6].upper()}"
    stored = Provider(name=f"keys-{uuid.uuid4().hex[:8]}", kind="openai")
    stored.api_base = mock_provider.api_base(stored.name)
    stored.set_api_key(stored_secret)
    stored.save()
    referenced = Provider(name=f"keys-{uuid.uuid4().hex[:8]}", kind="openai", api_key_env=variable)
    referenced.api_base = mock_provider.api_base(referenced.name)
    referenced.save()
    assert bytes(referenced.api_key_encrypted) == b""  # nothing of it in the database
    key = make_key(tenant)
    gateway = start_gateway(test_database_name, env={variable: env_secret})
    try:
        for provider, secret in ((stored, stored_secret), (referenced, env_secret)):
            response = httpx.post(
                f"{gateway.base_url}/chat/completions",
                headers={"authorization": f"Bearer {key}"},
                json={"model": model_on(provider), "messages": [{"role": "user", "content": "which key?"}]},
                timeout=30,
            )
            assert response.status_code == 200, response.text
            assert mock_provider.stats(provider.name)["last_key_digest"] == bearer_digest(secret)
        log = "\n".join(gateway.log_lines())
        assert stored_secret not in log and env_secret not in log
    finally:
        gateway.stop()
