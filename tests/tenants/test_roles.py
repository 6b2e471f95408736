"""Roles: one permission group per membership role, given and taken by the membership service."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from tenants.models import Membership
from tenants.roles import ROLE_GROUPS, ROLE_PERMISSIONS
from tenants.services import membership_delete, membership_save
from tests.conftest import unique


def test_each_role_group_holds_exactly_its_permissions(live_db):
    for role, name in ROLE_GROUPS.items():
        group = Group.objects.get(name=name)
        held = {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}
        assert held == set(ROLE_PERMISSIONS[role]), role


def test_memberships_make_staff_and_carry_their_roles_groups(make_tenant):
    a, b = make_tenant(), make_tenant()
    user = get_user_model().objects.create_user(unique("member"), password="x")
    assert not user.is_staff

    membership_save(tenant=a, user=user, role="viewer")
    membership_save(tenant=b, user=user, role="admin")
    user.refresh_from_db()
    assert user.is_staff
    assert set(user.groups.values_list("name", flat=True)) == {"Tenant viewers", "Tenant admins"}
    assert user.has_perm("tenants.change_virtualkey") and not user.has_perm("gateway.change_deployment")

    membership_save(tenant=b, user=user, role="finance")  # a role changes: its group follows
    assert set(user.groups.values_list("name", flat=True)) == {"Tenant viewers", "Tenant finance"}
    assert Membership.objects.filter(user=user).count() == 2

    for membership in Membership.objects.filter(user=user):
        membership_delete(membership=membership)
    assert not user.groups.exists()
    assert not get_user_model().objects.get(pk=user.pk).has_perm("tenants.view_tenant")
