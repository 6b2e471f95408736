"""Isolation in the console, for every admin model and page: the owner (admin of A), finance and
viewer of A, the outsider (admin of B) and a superuser, through lists, search, filters, object URLs,
edits, actions and autocomplete. Another tenant's object is a 404, never the object."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse

from gateway.models import Batch
from sentinel.console.scoping import TenantFilter
from tenants.models import Budget, VirtualKey
from tests.console.conftest import as_user

# model → (app label, roles of A's members that see it, whether its admins may edit it, search term or
# None for "the world's marker")
SCOPED = {
    "tenant": ("tenants", {"admin", "finance", "viewer"}, True, "Tenant "),
    "membership": ("tenants", {"admin", "finance", "viewer"}, True, "admin-"),
    "virtualkey": ("tenants", {"admin", "finance", "viewer"}, True, None),
    "team": ("tenants", {"admin", "finance", "viewer"}, True, None),
    "budget": ("tenants", {"admin", "finance", "viewer"}, True, None),
    "budgetalert": ("tenants", {"admin", "finance"}, False, None),
    "webhookendpoint": ("tenants", {"admin"}, True, None),
    "webhookdelivery": ("tenants", {"admin"}, False, None),
    "ledgerentry": ("billing", {"admin", "finance"}, False, None),
    "ledgerdeadletter": ("billing", {"admin", "finance"}, False, None),
    "cacheentry": ("gateway", {"admin"}, False, None),
    "batch": ("gateway", {"admin"}, False, None),
    "screeningpolicy": ("screening", {"admin"}, True, "Tenant "),
    "vectorstore": ("gateway", {"admin"}, True, None),
    "auditentry": ("tenants", {"admin"}, False, None),
}
# Not lists of rows: pages scoped on their own terms (tests/billing/test_admin.py).
PAGES = {"spendreport", "screeningreport"}


def url(model: str, action: str, *args) -> str:
    return reverse(f"admin:{SCOPED[model][0]}_{model}_{action}", args=args)


def listed(response) -> set:
    assert response.status_code == 200, response.status_code
    return {obj.pk for obj in response.context["cl"].result_list}


def test_every_admin_is_scoped_or_for_operators_only(world):
    """A new admin nobody classified would fail here: the owner of A must get nothing from it."""
    owner = as_user(world.tenancy.owner)
    for model, model_admin in admin.site._registry.items():
        name = model._meta.model_name
        if name in SCOPED or name in PAGES:
            continue
        changelist = reverse(f"admin:{model._meta.app_label}_{name}_changelist")
        assert owner.get(changelist).status_code == 403, name
        assert not model_admin.has_module_permission(_request(world.tenancy.owner)), name
    superuser = as_user(world.tenancy.superuser)
    assert superuser.get(reverse("admin:gateway_deployment_changelist")).status_code == 200


def _request(user):
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = user
    return request


@pytest.mark.parametrize("model", SCOPED)
def test_lists_and_search_show_only_the_users_tenants(world, model):
    t = world.tenancy
    a, b = world.a[model].pk, world.b[model].pk
    term = SCOPED[model][3] or world.marker
    roles = SCOPED[model][1]
    for person, own, other in [(t.owner, a, b), (t.outsider, b, a)]:
        web = as_user(person)
        rows = listed(web.get(url(model, "changelist")))
        assert own in rows and other not in rows
        found = listed(web.get(url(model, "changelist"), {"q": term}))
        assert own in found and other not in found
        # The tenant filter offers only the user's tenants, and the other tenant's id finds nothing.
        own_tenant = (t.tenant if person == t.owner else t.other).pk
        if model != "tenant":
            response = web.get(
                url(model, "changelist"), {"tenant": str(world.b["tenant"].pk if own == a else world.a["tenant"].pk)}
            )
            assert listed(response) == set()
            (spec,) = [f for f in response.context["cl"].filter_specs if isinstance(f, TenantFilter)]
            assert [int(pk) for pk, _ in spec.lookup_choices] == [own_tenant]
    for person, role in [(t.finance, "finance"), (t.viewer, "viewer")]:
        response = as_user(person).get(url(model, "changelist"), {"q": term})
        if role in roles:
            assert listed(response) & {a, b} == {a}
        else:
            assert response.status_code == 403
    # The superuser sees every tenant's: searched by each one's own slug for tenants, since every
    # tenant of the session matches "Tenant " and a page holds 50.
    terms = [world.a[model].slug, world.b[model].slug] if model == "tenant" else [term]
    superuser = as_user(t.superuser)
    everything = set().union(*(listed(superuser.get(url(model, "changelist"), {"q": q})) for q in terms))
    assert {a, b} <= everything


@pytest.mark.parametrize("model", SCOPED)
def test_another_tenants_object_is_a_404_and_ones_own_opens(world, model):
    t = world.tenancy
    editable = SCOPED[model][2]
    for person, own, other in [(t.owner, world.a[model], world.b[model]), (t.outsider, world.b[model], world.a[model])]:
        web = as_user(person)
        for action in ("change", "history"):
            assert web.get(url(model, action, other.pk)).status_code == 404, (model, action)
        assert web.post(url(model, "change", other.pk), {}).status_code in (403, 404)  # 403: read-only model
        # Deleting: 404, or 403 where the role may delete no such object at all.
        assert web.get(url(model, "delete", other.pk)).status_code in (403, 404)
        assert web.post(url(model, "delete", other.pk), {"post": "yes"}).status_code in (403, 404)
        page = web.get(url(model, "change", own.pk))
        assert page.status_code == 200
        assert page.context["has_change_permission"] is editable
    assert type(world.b[model]).objects.filter(pk=world.b[model].pk).exists()
    assert type(world.a[model]).objects.filter(pk=world.a[model].pk).exists()


@pytest.mark.parametrize("model", [name for name, spec in SCOPED.items() if spec[2]])
def test_finance_and_viewers_see_but_never_edit(world, model):
    t = world.tenancy
    obj = world.a[model]
    before = {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}
    for person, role in [(t.finance, "finance"), (t.viewer, "viewer")]:
        web = as_user(person)
        page = web.get(url(model, "change", obj.pk))
        if role in SCOPED[model][1]:
            assert page.status_code == 200
            assert page.context["has_change_permission"] is False
        else:
            assert page.status_code == 403
        assert web.post(url(model, "change", obj.pk), {"name": "changed"}).status_code == 403
        assert web.get(url(model, "add")).status_code == 403
        assert web.post(url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    obj.refresh_from_db()
    assert {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields} == before


def autocomplete(web, model: str, field: str, term: str = "") -> tuple[int, set[str]]:
    response = web.get(
        reverse("admin:autocomplete"), {"app_label": "tenants", "model_name": model, "field_name": field, "term": term}
    )
    if response.status_code != 200:
        return response.status_code, set()
    return 200, {item["id"] for item in response.json()["results"]}


def test_autocomplete_offers_only_what_the_user_manages(world):
    t = world.tenancy
    a_tenant, b_tenant = str(t.tenant.pk), str(t.other.pk)
    a_key, b_key = str(world.a["virtualkey"].pk), str(world.b["virtualkey"].pk)
    owner, outsider = as_user(t.owner), as_user(t.outsider)
    for source in ("budget", "virtualkey", "webhookendpoint", "membership"):
        assert autocomplete(owner, source, "tenant", "Tenant") == (200, {a_tenant})
        assert autocomplete(outsider, source, "tenant", "Tenant") == (200, {b_tenant})
    assert autocomplete(owner, "budget", "key", world.marker) == (200, {a_key})
    assert autocomplete(outsider, "budget", "key", world.marker) == (200, {b_key})
    # Members who edit nothing are offered nothing; accounts are never listed to tenant admins.
    assert autocomplete(as_user(t.viewer), "budget", "tenant", "Tenant") == (200, set())
    assert autocomplete(owner, "membership", "user", "")[0] == 403
    status, found = autocomplete(as_user(t.superuser), "budget", "key", world.marker)
    assert status == 200 and {a_key, b_key} <= found


def test_forms_refuse_another_tenants_tenant_or_key(world):
    t = world.tenancy
    owner = as_user(t.owner)
    count = Budget.objects.count()
    response = owner.post(
        url("budget", "add"), {"tenant": t.other.pk, "period": "daily", "limit_usd": "1", "alert_at_percent": "80"}
    )
    assert response.status_code == 200 and "tenant" in response.context["adminform"].form.errors
    response = owner.post(
        url("budget", "add"),
        {"tenant": t.tenant.pk, "key": world.b["virtualkey"].pk, "period": "daily", "limit_usd": "1"},
    )
    assert response.status_code == 200 and "key" in response.context["adminform"].form.errors
    assert Budget.objects.count() == count
    created = owner.post(
        url("budget", "add"),
        {
            "tenant": t.tenant.pk,
            "key": world.a["virtualkey"].pk,
            "period": "daily",
            "limit_usd": "1",
            "alert_at_percent": "80",
        },
    )
    assert created.status_code == 302
    assert Budget.objects.count() == count + 1


def test_actions_reach_only_rows_the_user_manages(world):
    t = world.tenancy
    a, b = world.a["virtualkey"], world.b["virtualkey"]
    response = as_user(t.owner).post(
        url("virtualkey", "changelist"), {"action": "revoke", "_selected_action": [a.pk, b.pk]}
    )
    assert response.status_code == 302
    assert VirtualKey.objects.get(pk=a.pk).status == "revoked"
    assert VirtualKey.objects.get(pk=b.pk).status == "active"
    as_user(t.viewer).post(url("virtualkey", "changelist"), {"action": "revoke", "_selected_action": [a.pk]})
    batch_a, batch_b = world.a["batch"], world.b["batch"]
    as_user(t.viewer).post(url("batch", "changelist"), {"action": "cancel", "_selected_action": [batch_a.pk]})
    assert Batch.objects.get(pk=batch_a.pk).status == "in_progress"  # viewers cancel nothing
    as_user(t.owner).post(
        url("batch", "changelist"), {"action": "cancel", "_selected_action": [batch_a.pk, batch_b.pk]}
    )
    assert Batch.objects.get(pk=batch_a.pk).status == "cancelling"
    assert Batch.objects.get(pk=batch_b.pk).status == "in_progress"
    cached_a, cached_b = world.a["cacheentry"], world.b["cacheentry"]
    as_user(t.owner).post(
        url("cacheentry", "changelist"), {"action": "invalidate", "_selected_action": [cached_a.pk, cached_b.pk]}
    )
    assert not type(cached_a).objects.filter(pk=cached_a.pk).exists()
    assert type(cached_b).objects.filter(pk=cached_b.pk).exists()
    # Tenant admins suspend nobody: that action is the operators'.
    response = as_user(t.owner).post(
        url("tenant", "changelist"), {"action": "suspend", "_selected_action": [t.tenant.pk]}
    )
    t.tenant.refresh_from_db()
    assert t.tenant.status == "active"


@pytest.mark.parametrize("action", ["rotate", "revoke"])
def test_key_rotation_and_revocation_pages_are_scoped(world, action):
    t = world.tenancy
    a, b = world.a["virtualkey"], world.b["virtualkey"]
    page = f"admin:tenants_virtualkey_{action}"
    owner = as_user(t.owner)
    assert owner.get(reverse(page, args=[b.pk])).status_code == 404
    assert owner.post(reverse(page, args=[b.pk])).status_code == 404
    for person in (t.finance, t.viewer):
        assert as_user(person).post(reverse(page, args=[a.pk])).status_code == 403
    assert owner.get(reverse(page, args=[a.pk])).status_code == 200
    for key in (a, b):
        key.refresh_from_db()
        assert (key.status, key.successor_id, key.expires_at) == ("active", None, None)
    assert VirtualKey.objects.filter(tenant__in=[t.tenant, t.other]).count() == 2


def test_the_dashboard_shows_each_user_their_tenants_only(world):
    t = world.tenancy
    dashboard = reverse("admin:dashboard")
    owner = as_user(t.owner)
    page = owner.get(dashboard)
    assert page.status_code == 200
    assert page.context["live"]["tenant_ids"] == [t.tenant.pk]
    assert [line.tenant for line in page.context["data"].spend] == [t.tenant]
    assert owner.get(dashboard, {"tenant": t.other.slug}).status_code == 404
    assert owner.get(dashboard, {"tenant": t.tenant.slug}).status_code == 200
    unknown = owner.get(dashboard, {"window": "90d"})
    assert unknown.status_code == 400 and "Unknown window" in unknown.content.decode()
    assert as_user(t.outsider).get(dashboard).context["live"]["tenant_ids"] == [t.other.pk]
    viewer = as_user(t.viewer).get(dashboard)
    assert viewer.context["data"].spend is None  # viewers see traffic, never money
    assert "Spend today" not in viewer.content.decode()
    assert as_user(t.finance).get(dashboard).context["data"].spend is not None
    assert as_user(t.superuser).get(dashboard).context["live"]["tenant_ids"] is None


def test_the_circuit_view_is_for_operators(world):
    t = world.tenancy
    circuits = reverse("admin:circuits")
    for person in (t.owner, t.finance, t.viewer, t.outsider):
        assert as_user(person).get(circuits).status_code == 403
    assert as_user(t.superuser).get(circuits).status_code == 200
