"""What the console writes: names in the plural, breaker states and counts as people read them, money
that never rounds a real cost to $0.0000, a delivery log linked as "View", the one tenant an admin
manages filled in on every add form, and a favicon (issue #20's walk-through)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gateway.models import BreakerTransition, Deployment, Provider, breaker_state_label
from sentinel.console.templatetags.console import usd
from sentinel.text import count_text
from tests.conftest import unique
from tests.console.conftest import as_user


def test_model_names_read_in_the_plural_on_the_index(tenancy):
    page = as_user(tenancy.superuser).get("/admin/").content.decode()
    for plural in ("Breaker policies", "Ledger entries"):
        assert plural in page
    assert "Breaker policys" not in page and ">Ledger<" not in page


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (Decimal("0.0000255"), "$0.0000255"),
        (Decimal("-0.0000255"), "-$0.0000255"),
        (Decimal("0"), "$0.0000"),
        (Decimal("1234.5678901"), "$1,234.5679"),
        (Decimal("0.00012"), "$0.0001"),
        (None, "—"),
    ],
)
def test_money_is_never_rounded_to_nothing(value, shown):
    assert usd(value) == shown


def test_counts_and_breaker_states_read_as_words():
    assert [count_text(n, "deployment") for n in (0, 1, 2)] == ["0 deployments", "1 deployment", "2 deployments"]
    assert [breaker_state_label(s) for s in ("closed", "open", "half_open", "forced_open", "forced_closed")] == [
        "closed",
        "open",
        "half-open",
        "forced open",
        "forced closed",
    ]


def test_breaker_pages_write_states_as_words(tenancy):
    provider = Provider.objects.create(name=unique("p"), kind="openai", api_base="http://127.0.0.1:9/v1")
    deployment = Deployment.objects.create(name=unique("d"), provider=provider, litellm_model="openai/x")
    BreakerTransition.objects.create(deployment=deployment, from_state="closed", to_state="forced_open")
    root = as_user(tenancy.superuser)
    page = root.get(f"/admin/gateway/deployment/{deployment.pk}/change/").content.decode()
    assert "closed → forced open" in page and "forced_open" not in page
    circuits = root.get("/admin/circuits/").content.decode()
    assert "closed → forced open" in circuits

    forced = root.post(
        "/admin/gateway/deployment/",
        {"action": "force_open", "_selected_action": [deployment.pk], "apply": "1", "reason": "maintenance"},
        follow=True,
    )
    assert "Force open: 1 deployment." in forced.content.decode() or "1 deployment." in forced.content.decode()
    assert "deployment(s)" not in forced.content.decode()


def test_the_delivery_log_is_linked_as_view_not_change(tenancy):
    owner = as_user(tenancy.owner)
    page = owner.get("/admin/")
    index = page.content.decode()
    start = index.index("Webhook deliveries", index.index('id="content"'))  # the app list, not the sidebar
    row = index[start : index.index("</tr>", start)]
    assert "Change" not in row
    (deliveries,) = [m for app in page.context["app_list"] for m in app["models"] if m["name"] == "Webhook deliveries"]
    assert deliveries["view_only"] is True  # Unfold's index links it with the "View" eye, no edit icon


@pytest.mark.parametrize(
    "model", ["tenants/membership", "tenants/budget", "tenants/webhookendpoint", "screening/screeningpolicy"]
)
def test_the_one_tenant_an_admin_manages_is_filled_in(tenancy, model):
    page = as_user(tenancy.owner).get(f"/admin/{model}/add/")
    assert page.status_code == 200
    assert page.context["adminform"].form.initial["tenant"] == tenancy.tenant.pk


def test_favicon_is_served(tenancy):
    icon = as_user(tenancy.owner).get("/favicon.ico", follow=True)
    assert icon.status_code == 200
