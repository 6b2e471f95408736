"""What each membership role may do in the console, as Django model permissions held by one group per
role. Members get their roles' groups from the membership service; which rows the permissions reach
(only the tenants where the member holds the role) is decided by console.scoping."""

from __future__ import annotations

from django.apps import apps as django_apps

from tenants.models import Membership, TeamMembership

ROLE_GROUPS = {
    Membership.Role.ADMIN: "Tenant admins",
    Membership.Role.FINANCE: "Tenant finance",
    Membership.Role.VIEWER: "Tenant viewers",
}
# A team's members reach only their team's rows (console.scoping's team_lookup).
TEAM_ROLE_GROUPS = {
    TeamMembership.Role.ADMIN: "Team admins",
    TeamMembership.Role.VIEWER: "Team viewers",
}

# Every member sees the tenant's configuration; finance adds spend; admins manage everything in it.
_CONFIGURATION = [
    "tenants.view_tenant",
    "tenants.view_membership",
    "tenants.view_virtualkey",
    "tenants.view_budget",
    "tenants.view_enduserlimit",
    "tenants.view_team",
    "tenants.view_teammembership",
]
ROLE_PERMISSIONS: dict[str, list[str]] = {
    Membership.Role.VIEWER: _CONFIGURATION,
    Membership.Role.FINANCE: [
        *_CONFIGURATION,
        "tenants.view_budgetalert",
        "billing.view_ledgerentry",
        "billing.view_spendreport",
        "billing.view_ledgerdeadletter",
    ],
    Membership.Role.ADMIN: [
        *_CONFIGURATION,
        "tenants.change_tenant",
        "tenants.add_membership",
        "tenants.change_membership",
        "tenants.delete_membership",
        "tenants.add_virtualkey",
        "tenants.change_virtualkey",
        "tenants.add_budget",
        "tenants.change_budget",
        "tenants.delete_budget",
        "tenants.add_enduserlimit",
        "tenants.change_enduserlimit",
        "tenants.delete_enduserlimit",
        "tenants.view_budgetalert",
        "tenants.add_team",
        "tenants.change_team",
        "tenants.delete_team",
        "tenants.add_teammembership",
        "tenants.change_teammembership",
        "tenants.delete_teammembership",
        "tenants.view_webhookendpoint",
        "tenants.add_webhookendpoint",
        "tenants.change_webhookendpoint",
        "tenants.delete_webhookendpoint",
        "tenants.view_webhookdelivery",
        "billing.view_ledgerentry",
        "billing.view_spendreport",
        "billing.view_ledgerdeadletter",
        "gateway.view_cacheentry",
        "gateway.delete_cacheentry",
        "gateway.view_batch",
        "gateway.view_vectorstore",
        "gateway.add_vectorstore",
        "gateway.change_vectorstore",
        "gateway.delete_vectorstore",
        "gateway.view_vectorstorefile",
        "gateway.delete_vectorstorefile",
        "screening.view_screeningpolicy",
        "screening.add_screeningpolicy",
        "screening.change_screeningpolicy",
        "screening.delete_screeningpolicy",
        "screening.view_screeningreport",
        "tenants.view_auditentry",
    ],
}

# Team viewers see their team, its keys, budgets and request log; team admins also issue, change,
# rotate and revoke its keys and set their end-user limits.
_TEAM = [
    "tenants.view_team",
    "tenants.view_teammembership",
    "tenants.view_virtualkey",
    "tenants.view_budget",
    "tenants.view_enduserlimit",
    "billing.view_ledgerentry",
]
TEAM_ROLE_PERMISSIONS: dict[str, list[str]] = {
    TeamMembership.Role.VIEWER: _TEAM,
    TeamMembership.Role.ADMIN: [
        *_TEAM,
        "tenants.add_virtualkey",
        "tenants.change_virtualkey",
        "tenants.add_enduserlimit",
        "tenants.change_enduserlimit",
        "tenants.delete_enduserlimit",
    ],
}


# Apps migrated after the role groups were created, whose own migration calls role_groups_sync again.
_SYNCED_BY_OWN_MIGRATION = frozenset({"screening"})


def role_groups_sync(*, apps=django_apps) -> None:
    """Create the role groups and give each exactly its permissions. `apps` is a migration's
    historical registry when a data migration calls this."""
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    named = [(name, ROLE_PERMISSIONS[role]) for role, name in ROLE_GROUPS.items()]
    named += [(name, TEAM_ROLE_PERMISSIONS[role]) for role, name in TEAM_ROLE_GROUPS.items()]
    for name, permissions in named:
        group, _ = Group.objects.get_or_create(name=name)
        wanted = []
        for dotted in permissions:
            app_label, codename = dotted.split(".")
            permission = Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
            if permission is None:
                if app_label in _SYNCED_BY_OWN_MIGRATION:
                    continue  # that app's models do not exist yet at this migration: its own migration syncs again
                try:
                    apps.get_model(app_label, codename.split("_", 1)[1])
                except LookupError:
                    continue  # a model of a later migration, which syncs the groups again
                raise LookupError(f"no permission {dotted}")
            wanted.append(permission)
        group.permissions.set(wanted)


def role_group_names(roles: set[str], team_roles: set[str] = frozenset()) -> set[str]:
    return {ROLE_GROUPS[role] for role in roles} | {TEAM_ROLE_GROUPS[role] for role in team_roles}


def role_groups_sync_in_migration(apps, schema_editor) -> None:
    """For a RunPython step: permissions are normally created after all migrations ran; the groups
    need them now."""
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    role_groups_sync(apps=apps)
