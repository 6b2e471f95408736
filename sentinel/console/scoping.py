"""Who sees which rows in the console (the Django admin).

Model permissions come from the role groups (tenants.roles); these classes decide which rows they
reach. Both kinds record every add, change and delete in the audit log (AuditsChanges). A
tenant-scoped admin lists, searches, filters, autocompletes, shows and edits only rows of
tenants where the user holds a role that allows it, and answers 404 for any other object's URL.
Operator-only admins (providers, deployments, prices, ...) are for superusers alone. The forms of
both refuse control characters in their text fields (sentinel.text).
"""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Q, Value
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.utils.functional import cached_property
from unfold.admin import ModelAdmin

from sentinel.localstate import announce_change
from sentinel.text import PlainTextAdmin, PlainTextInline, row_id
from tenants.audit import SECRET_FIELDS, audit_record, describe, plain, snapshot
from tenants.models import AuditEntry, Membership, Team, TeamMembership, Tenant, VirtualKey
from tenants.selectors import ALL_ROLES, MANAGE, tenants_for


def _held(request, cache: str, memberships, owner: str) -> dict[int, str]:
    """{owner id: role} of the signed-in user's `memberships`, read once per request (kept on it as `cache`)."""
    roles = getattr(request, cache, None)
    if roles is None:
        user = request.user
        roles = {}
        if user.is_authenticated and user.is_active:
            roles = dict(memberships.filter(user=user).values_list(owner, "role"))
        setattr(request, cache, roles)
    return roles


def roles_of(request) -> dict[int, str]:
    """{tenant id: role} of the signed-in user, read once per request."""
    return _held(request, "_sentinel_roles", Membership.objects, "tenant_id")


def team_roles_of(request) -> dict[int, str]:
    """{team id: team role} of the signed-in user, read once per request."""
    return _held(request, "_sentinel_team_roles", TeamMembership.objects, "team_id")


def team_ids_with(request, roles: frozenset[str]) -> set[int]:
    return {team_id for team_id, role in team_roles_of(request).items() if role in roles}


TEAM_ROLES = frozenset(TeamMembership.Role.values)
TEAM_MANAGE = frozenset({TeamMembership.Role.ADMIN})


def tenant_ids_with(request, roles: frozenset[str]) -> set[int]:
    return {tenant_id for tenant_id, role in roles_of(request).items() if role in roles}


def may(request, tenant_id: int | None, roles: frozenset[str]) -> bool:
    """Whether the user holds one of `roles` in the tenant (superusers: everywhere)."""
    if request.user.is_superuser:
        return True
    return tenant_id is not None and roles_of(request).get(tenant_id) in roles


class _IdFilter(admin.SimpleListFilter):
    """A list filter by the id of a related object, read from `self.lookup`; a value that is not an
    id selects nothing."""

    lookup: str

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        chosen = row_id(value)
        return queryset.none() if chosen is None else queryset.filter(**{self.lookup: chosen})


class TenantFilter(_IdFilter):
    """Filter by tenant, offering only the tenants the user may see here (Django's related-field
    filter would list every tenant)."""

    title = "tenant"
    parameter_name = "tenant"

    def __init__(self, request, params, model, model_admin):
        self.lookup = model_admin.tenant_lookup
        self.visible = model_admin.visible_tenant_ids(request)
        super().__init__(request, params, model, model_admin)

    def lookups(self, request, model_admin):
        tenants = Tenant.objects.order_by("name")
        if self.visible is not None:
            tenants = tenants.filter(pk__in=self.visible)
        return [(str(tenant.pk), tenant.name) for tenant in tenants]


class TeamFilter(_IdFilter):
    """Filter by team, offering only the teams the user may see here."""

    title = "team"
    parameter_name = "team"

    def __init__(self, request, params, model, model_admin):
        self.lookup = model_admin.team_lookup or "team_id"
        self.visible = model_admin.visible_tenant_ids(request)
        self.teams = model_admin.team_ids(request, model_admin.team_view_roles | model_admin.team_manage_roles)
        super().__init__(request, params, model, model_admin)

    def lookups(self, request, model_admin):
        teams = Team.objects.select_related("tenant").order_by("tenant__name", "name")
        if self.visible is not None:
            teams = teams.filter(Q(tenant_id__in=self.visible) | Q(pk__in=self.teams))
        return [(str(team.pk), f"{team.tenant.name} / {team.name}") for team in teams]


class AuditsChanges:
    """A mixin recording every add, change and delete made on an admin's pages in the audit log,
    with the changed fields' values before and after (secret fields only named, never valued).
    Django's admin funnels every save through save_form and log_addition / log_change, and every
    delete through log_deletions, which is where this listens. An admin whose writes go through a
    service that records them itself sets `audited_by_services` (or `audit_additions = False` when
    only its adds do)."""

    audited_by_services = False
    audit_additions = True

    def audit_tenant_of(self, obj) -> int | None:
        return None

    def save_form(self, request, form, change):
        obj = super().save_form(request, form, change)
        if not hasattr(request, "_audit_forms"):
            request._audit_forms = {}
        request._audit_forms[id(obj)] = form
        return obj

    def _audit_save(self, request, obj, action: str) -> None:
        form = getattr(request, "_audit_forms", {}).pop(id(obj), None)
        if form is None or self.audited_by_services:
            return
        added = action == AuditEntry.Action.ADDED
        # An added row: every value it was given; a changed one: the fields that changed.
        names = [name for name in (form.cleaned_data if added else form.changed_data) if name in form.cleaned_data]
        hidden = sorted(name for name in names if name in SECRET_FIELDS and form.cleaned_data[name])
        changes = {
            name: [None if added else plain(form.initial.get(name)), plain(form.cleaned_data[name])]
            for name in names
            if name not in SECRET_FIELDS and not (added and form.cleaned_data[name] in (None, "", []))
        }
        if action == AuditEntry.Action.CHANGED and not changes and not hidden:
            return
        audit_record(
            action=action,
            tenant=self.audit_tenant_of(obj),
            target=describe(obj),
            changes=changes,
            detail=f"Changed (value not logged): {', '.join(hidden)}." if hidden else "",
            request=request,
        )

    def log_addition(self, request, obj, message):
        if self.audit_additions:
            self._audit_save(request, obj, AuditEntry.Action.ADDED)
        return super().log_addition(request, obj, message)

    def log_change(self, request, obj, message):
        self._audit_save(request, obj, AuditEntry.Action.CHANGED)
        return super().log_change(request, obj, message)

    def log_deletions(self, request, queryset):
        if not self.audited_by_services:
            for obj in queryset:
                before = snapshot(obj)
                audit_record(
                    action=AuditEntry.Action.DELETED,
                    tenant=self.audit_tenant_of(obj),
                    target=describe(obj),
                    changes={name: [value, None] for name, value in before.items()},
                    request=request,
                )
        return super().log_deletions(request, queryset)


def audit_inline_rows(request, formset, *, tenant_id: int | None) -> None:
    """Record the rows an inline formset added, changed and deleted, as AuditsChanges records the
    page's own object (call after the formset is saved)."""
    before = {form.instance.pk: form.initial for form in formset.initial_forms}
    for obj in formset.new_objects:
        changes = {name: [None, value] for name, value in snapshot(obj).items() if value not in (None, "")}
        audit_record(action=AuditEntry.Action.ADDED, tenant=tenant_id, target=describe(obj), changes=changes)
    for obj, names in formset.changed_objects:
        after = snapshot(obj)
        changes = {name: [plain(before.get(obj.pk, {}).get(name)), after.get(name)] for name in names}
        audit_record(action=AuditEntry.Action.CHANGED, tenant=tenant_id, target=describe(obj), changes=changes)
    for obj in formset.deleted_objects:
        changes = {name: [value, None] for name, value in snapshot(obj).items()}
        audit_record(action=AuditEntry.Action.DELETED, tenant=tenant_id, target=describe(obj), changes=changes)


class TenantScopedAdmin(AuditsChanges, PlainTextAdmin, ModelAdmin):
    """A ModelAdmin whose rows each belong to one tenant, reached from the model by `tenant_lookup`.
    Members holding one of `view_roles` see a tenant's rows; `manage_roles` add, change and delete.
    Where rows also belong to a team (`team_lookup`), that team's members reach them too: its
    `team_view_roles` see them, its `team_manage_roles` add, change and delete them; no other team's."""

    tenant_lookup = "tenant_id"
    team_lookup: str | None = None
    team_view_roles: frozenset[str] = TEAM_ROLES
    team_manage_roles: frozenset[str] = TEAM_MANAGE
    # Unfold: lists take the whole width beside the sidebar (a wider one scrolls inside its card, never the
    # page), and filters apply together with one submit (one query on a big list, not one per click).
    list_fullwidth = True
    list_filter_submit = True
    # 50 rows a page: rendering a row's cells is most of a list page's time (about 1.5 ms a row here).
    list_per_page = 50
    # One COUNT per list, of the rows the filters select; not a second of all the user's rows (a
    # million keys or ledger rows take a count each).
    show_full_result_count = False
    view_roles: frozenset[str] = ALL_ROLES
    manage_roles: frozenset[str] = MANAGE

    def audit_tenant_of(self, obj) -> int | None:
        return self.tenant_id_of(obj)

    def tenant_id_of(self, obj) -> int | None:
        return _follow(obj, self.tenant_lookup)

    def team_id_of(self, obj) -> int | None:
        return _follow(obj, self.team_lookup) if self.team_lookup else None

    def team_ids(self, request, roles: frozenset[str]) -> set[int]:
        """The teams whose rows the user reaches here with one of `roles` (none without team_lookup)."""
        return team_ids_with(request, roles) if self.team_lookup else set()

    def _scope(self, request, roles: frozenset[str], team_roles: frozenset[str]) -> Q:
        scope = Q(**{f"{self.tenant_lookup}__in": tenant_ids_with(request, roles)})
        teams = self.team_ids(request, team_roles)
        if teams:
            scope |= Q(**{f"{self.team_lookup}__in": teams})
        return scope

    def visible_tenant_ids(self, request) -> set[int] | None:
        """None: every tenant (superusers)."""
        if request.user.is_superuser:
            return None
        return tenant_ids_with(request, self.view_roles | self.manage_roles)

    def managed(self, request, queryset):
        if request.user.is_superuser:
            return queryset
        return queryset.filter(self._scope(request, self.manage_roles, self.team_manage_roles))

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(
            self._scope(request, self.view_roles | self.manage_roles, self.team_view_roles | self.team_manage_roles)
        )

    def _allowed(self, request, obj, roles: frozenset[str], team_roles: frozenset[str]) -> bool:
        if request.user.is_superuser:
            return True
        if obj is None:
            return bool(tenant_ids_with(request, roles)) or bool(self.team_ids(request, team_roles))
        if may(request, self.tenant_id_of(obj), roles):
            return True
        team = self.team_id_of(obj)
        return team is not None and team in self.team_ids(request, team_roles)

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) and self._allowed(
            request, obj, self.view_roles | self.manage_roles, self.team_view_roles | self.team_manage_roles
        )

    def has_add_permission(self, request):
        return super().has_add_permission(request) and self._allowed(
            request, None, self.manage_roles, self.team_manage_roles
        )

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and self._allowed(
            request, obj, self.manage_roles, self.team_manage_roles
        )

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and self._allowed(
            request, obj, self.manage_roles, self.team_manage_roles
        )

    def get_changeform_initial_data(self, request):
        """An add form's tenant is filled in for someone who manages exactly one."""
        initial = super().get_changeform_initial_data(request)
        has_tenant = any(f.name == "tenant" for f in self.model._meta.fields)
        if has_tenant and "tenant" not in initial and not request.user.is_superuser:
            managed = tenant_ids_with(request, self.manage_roles)
            if len(managed) == 1:
                initial["tenant"] = next(iter(managed))
        return initial

    def get_search_results(self, request, queryset, search_term):
        queryset, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        if request.path == reverse("admin:autocomplete"):
            # Autocomplete feeds forms that edit: offer only what the user may pick there.
            queryset = self.managed(request, queryset)
        return queryset, may_have_duplicates

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        """A form may point only at the user's own tenants, teams and keys (the field refuses any
        other id); a team admin's, at their teams (and those teams' tenants and keys)."""
        if not request.user.is_superuser:
            managed = tenant_ids_with(request, self.manage_roles)
            teams = self.team_ids(request, self.team_manage_roles)
            if db_field.related_model is Tenant:
                kwargs["queryset"] = Tenant.objects.filter(Q(pk__in=managed) | Q(teams__in=teams)).distinct()
            elif db_field.related_model is Team:
                kwargs["queryset"] = Team.objects.filter(Q(tenant_id__in=managed) | Q(pk__in=teams))
            elif db_field.related_model is VirtualKey:
                kwargs["queryset"] = VirtualKey.objects.filter(Q(tenant_id__in=managed) | Q(team_id__in=teams))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def response_action(self, request, queryset):
        """Actions (revoke, delete, ...) reach only rows the user manages, whatever was ticked."""
        return super().response_action(request, self.managed(request, queryset))

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        # Django redirects to the index with "doesn't exist"; another tenant's object (or none at all)
        # is a plain 404 here, the same either way so a guessed id tells nothing.
        raise Http404(f"No {opts.verbose_name} with this id among yours.")


def _follow(obj, lookup: str) -> int | None:
    value = obj
    for part in lookup.split("__"):
        if value is None:
            return None
        value = getattr(value, part)
    return value


class TenantScopedInline(PlainTextInline):
    """An inline on a tenant-scoped admin: editable where the user manages the parent's tenant (or,
    on an admin with team_lookup, the parent's team)."""

    def _parent_allows(self, request, obj) -> bool:
        if obj is None:
            return request.user.is_superuser
        parent = self.parent_admin
        return parent._allowed(request, obj, parent.manage_roles, parent.team_manage_roles)

    def has_add_permission(self, request, obj):
        return super().has_add_permission(request, obj) and self._parent_allows(request, obj)

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and self._parent_allows(request, obj)

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and self._parent_allows(request, obj)

    def __init__(self, parent_model, admin_site):
        super().__init__(parent_model, admin_site)
        self.parent_admin = admin_site.get_model_admin(parent_model)


class ViewAndDelete:
    """A mixin for admins of records Sentinel writes (transitions, alerts, cache entries): they are
    looked at and may be deleted, never added or edited by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class CappedCountPaginator(Paginator):
    """Counts a list's rows up to CAP and says "more than" beyond: a history list (the ledger, the
    audit log) may hold millions of rows, whose exact COUNT(*) is a read of every one of them on each
    page (hundreds of ms at a million), while counting to CAP reads CAP index entries at most. Its
    first CAP rows are paged as usual; filters narrow the rest."""

    CAP = 10_000
    template_name = "admin/console/pagination_capped.html"

    @cached_property
    def count(self) -> int:
        # Unordered and selecting no column, so an index of the filters' columns answers it alone (an
        # index-only scan): with the list's order and its ids, each counted row was read from the table
        # (400 ms for one status of a 10M-row ledger, 13 ms without).
        return self.object_list.order_by().values_list(Value(1))[: self.CAP + 1].count()

    def page(self, number):
        """The page's ids first, then its rows (a "deferred join"): a deep page skips thousands of
        rows, which the list's index gives as ids alone, where whole rows would each be read."""
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        ids = list(self.object_list.values_list("pk", flat=True)[bottom:top])
        rows = self.object_list.order_by().in_bulk(ids) if ids else {}
        return self._get_page([rows[pk] for pk in ids if pk in rows], number, self)


class ViewOnly(ViewAndDelete):
    """A mixin for admins of records that are history (the ledger, audit rows, batches): not even
    deleted from the admin, and counted only up to CappedCountPaginator.CAP."""

    paginator = CappedCountPaginator

    def has_delete_permission(self, request, obj=None):
        return False


class ReportAdmin(ViewOnly, ModelAdmin):
    """An admin whose changelist is a report page, not a list of rows: shown to anyone holding one of
    `report_roles` in at least one tenant; `report(request)` builds the page."""

    report_roles: frozenset[str] = MANAGE

    def has_module_permission(self, request):
        return tenants_for(request.user, self.report_roles).exists()

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        return self.report(request)

    def report(self, request) -> HttpResponse:
        raise NotImplementedError


class AnnouncesChanges:
    """A mixin for admins of configuration that gateway processes cache (routing, policies, budgets):
    every save (inlines included) and delete tells them to re-read it."""

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        announce_change()

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        announce_change()

    def delete_queryset(self, request, queryset):
        super().delete_queryset(request, queryset)
        announce_change()


class OperatorOnlyAdmin(AuditsChanges, PlainTextAdmin, ModelAdmin):
    """Configuration of the whole installation (providers, routing, prices, tiers, breakers, kill
    switches and their audit): superusers only, whatever permissions a user was given."""

    list_fullwidth = True
    list_filter_submit = True

    def has_module_permission(self, request):
        return request.user.is_superuser and super().has_module_permission(request)

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_view_permission(request, obj)

    def has_add_permission(self, request):
        return request.user.is_superuser and super().has_add_permission(request)

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_delete_permission(request, obj)
