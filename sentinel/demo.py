"""The demo installation `make run` prepares: an admin, a demo tenant with a key, and model aliases
served by the mock provider. Safe to run again: it reuses what exists."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
from sentinel.env import envstr
from tenants.models import Membership, Tenant, VirtualKey
from tenants.services import key_create, key_revoke

ADMIN_USERNAME = "admin"
DEMO_KEY_NAME = "demo (issued by make run)"
# (alias, [(deployment, provider, litellm model)] in chain order)
DEMO_CHAINS = {
    "gpt-4o-mini": [
        ("mock-primary-gpt-4o-mini", "mock-primary", "openai/gpt-4o-mini"),
        ("mock-secondary-gpt-4o-mini", "mock-secondary", "openai/gpt-4o-mini"),
    ],
    "gpt-4o": [
        ("mock-primary-gpt-4o", "mock-primary", "openai/gpt-4o"),
        ("mock-secondary-gpt-4o", "mock-secondary", "openai/gpt-4o"),
    ],
}
DEMO_ALIASES = {"fast": "gpt-4o-mini", "smart": "gpt-4o"}


@dataclass
class Demo:
    admin_username: str
    admin_password: str | None  # None: changed by someone since it was generated
    tenant: Tenant
    key_secret: str


ADMIN_PASSWORD = envstr(
    "SENTINEL_ADMIN_PASSWORD",
    "",
    "Password `make run` gives the `admin` user it creates. Unset: generated once into SENTINEL_DATA_DIR.",
)


def admin_password() -> str:
    from sentinel.settings import _local_secret

    return ADMIN_PASSWORD or _local_secret("admin_password", nbytes=12)


def ensure_mock_providers(mock_url: str) -> None:
    """Providers, deployments and aliases pointing at the mock provider's virtual providers."""
    base = mock_url.rstrip("/")
    for alias_name, chain in DEMO_CHAINS.items():
        alias, _ = ModelAlias.objects.get_or_create(
            name=alias_name, defaults={"description": "Served by the mock provider"}
        )
        for position, (deployment_name, provider_name, model) in enumerate(chain):
            # The demo providers belong to `make run`: follow the mock wherever it runs this time.
            provider, created = Provider.objects.update_or_create(
                name=provider_name,
                defaults={"kind": "openai", "api_base": f"{base}/p/{provider_name.split('-', 1)[1]}/v1"},
            )
            if created:
                provider.set_api_key("sk-mock-demo")
                provider.save()
            deployment, _ = Deployment.objects.get_or_create(
                name=deployment_name, defaults={"provider": provider, "litellm_model": model}
            )
            ChainEntry.objects.get_or_create(alias=alias, deployment=deployment, defaults={"position": position})
    for alias_name, target in DEMO_ALIASES.items():
        alias, _ = ModelAlias.objects.get_or_create(name=alias_name, defaults={"description": f"Alias of {target}"})
        for entry in ChainEntry.objects.filter(alias__name=target):
            ChainEntry.objects.get_or_create(
                alias=alias, deployment=entry.deployment, defaults={"position": entry.position}
            )


@transaction.atomic
def ensure_demo(mock_url: str | None = None) -> Demo:
    ensure_mock_providers(mock_url or settings.MOCK_PROVIDER_URL)
    password = admin_password()
    User = get_user_model()
    admin, created = User.objects.get_or_create(
        username=ADMIN_USERNAME, defaults={"is_staff": True, "is_superuser": True}
    )
    if created:
        admin.set_password(password)
        admin.save()
    tenant, _ = Tenant.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
    Membership.objects.get_or_create(user=admin, tenant=tenant, defaults={"role": "admin"})
    # Only digests are stored, so an earlier demo key cannot be shown again: issue a fresh one and
    # retire the previous.
    for old in VirtualKey.objects.filter(tenant=tenant, name=DEMO_KEY_NAME, status="active"):
        key_revoke(key=old)
    _, secret = key_create(tenant=tenant, name=DEMO_KEY_NAME, created_by=admin)
    return Demo(
        admin_username=ADMIN_USERNAME,
        admin_password=password if admin.check_password(password) else None,
        tenant=tenant,
        key_secret=secret,
    )
