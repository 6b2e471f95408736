"""Reads about who may see what. Every tenant-scoped view, list, export and API asks here."""

from __future__ import annotations

from django.db.models import QuerySet

from tenants.models import Membership, Tenant

ALL_ROLES = frozenset(Membership.Role.values)
# Who may do what, by membership role. Superusers may do everything everywhere.
MANAGE = frozenset({Membership.Role.ADMIN})
SEE_SPEND = frozenset({Membership.Role.ADMIN, Membership.Role.FINANCE})
EXPORT_SPEND = frozenset({Membership.Role.ADMIN, Membership.Role.FINANCE})


def tenants_for(user, roles: frozenset[str] = ALL_ROLES) -> QuerySet[Tenant]:
    """Tenants where `user` holds one of `roles` (every tenant, for a superuser)."""
    if not user.is_authenticated or not user.is_active:
        return Tenant.objects.none()
    if user.is_superuser:
        return Tenant.objects.all()
    return Tenant.objects.filter(memberships__user=user, memberships__role__in=roles).distinct()


def tenant_ids_for(user, roles: frozenset[str] = ALL_ROLES) -> set[int]:
    return set(tenants_for(user, roles).values_list("id", flat=True))


def role_in(user, tenant_id: int) -> str | None:
    """The user's role in one tenant ("admin" for superusers), or None."""
    if user.is_superuser:
        return Membership.Role.ADMIN
    return Membership.objects.filter(user=user, tenant_id=tenant_id).values_list("role", flat=True).first()
