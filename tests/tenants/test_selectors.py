"""Who sees which tenant: the one question every scoped view asks."""

from tenants.selectors import EXPORT_SPEND, MANAGE, SEE_SPEND, role_in, tenant_ids_for


def test_members_see_their_tenant_only(tenancy):
    a, b = tenancy.tenant.pk, tenancy.other.pk
    assert tenant_ids_for(tenancy.owner) == {a}
    assert tenant_ids_for(tenancy.viewer) == {a}
    assert tenant_ids_for(tenancy.outsider) == {b}
    assert {a, b} <= tenant_ids_for(tenancy.superuser)


def test_roles_narrow_what_a_member_may_do(tenancy):
    a = tenancy.tenant.pk
    assert tenant_ids_for(tenancy.owner, MANAGE) == {a}
    assert tenant_ids_for(tenancy.finance, MANAGE) == set()
    assert tenant_ids_for(tenancy.finance, SEE_SPEND) == {a}
    assert tenant_ids_for(tenancy.viewer, EXPORT_SPEND) == set()
    assert tenant_ids_for(tenancy.outsider, SEE_SPEND) == {tenancy.other.pk}


def test_role_in(tenancy):
    assert role_in(tenancy.finance, tenancy.tenant.pk) == "finance"
    assert role_in(tenancy.outsider, tenancy.tenant.pk) is None
    assert role_in(tenancy.superuser, tenancy.tenant.pk) == "admin"


def test_inactive_users_see_nothing(tenancy):
    tenancy.owner.is_active = False
    tenancy.owner.save()
    assert tenant_ids_for(tenancy.owner) == set()
