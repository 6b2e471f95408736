"""Tenants, members, keys, budgets and webhooks in the console. Each admin is scoped to the tenants
where the user holds a role (console.scoping); tiers are the operators'."""

from __future__ import annotations

import csv
import io
import json
import secrets
from collections.abc import Iterator
from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q
from django.http import Http404, HttpResponseRedirect, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from unfold.admin import TabularInline

from billing.money import ZERO
from billing.selectors import key_usage
from sentinel.console.fields import ModelNamesAdmin
from sentinel.console.scoping import (
    TEAM_MANAGE,
    AnnouncesChanges,
    CappedCountPaginator,
    OperatorOnlyAdmin,
    TeamFilter,
    TenantFilter,
    TenantScopedAdmin,
    TenantScopedInline,
    ViewAndDelete,
    ViewOnly,
    audit_inline_rows,
    may,
    team_ids_with,
    tenant_ids_with,
)
from sentinel.console.templatetags.console import usd
from sentinel.crypto import decrypt, encrypt
from sentinel.localstate import announce_change
from tenants.models import (
    AuditEntry,
    Budget,
    BudgetAlert,
    EndUserLimit,
    Membership,
    RateLimitTier,
    SingleSignOnRule,
    Team,
    TeamMembership,
    Tenant,
    VirtualKey,
    WebhookDelivery,
    WebhookEndpoint,
)
from tenants.selectors import ALL_ROLES, MANAGE, SEE_SPEND
from tenants.services import (
    KeyNotRotatable,
    key_create,
    key_revoke,
    key_rotate,
    membership_delete,
    membership_save,
    team_membership_delete,
    team_membership_save,
    tenant_set_status,
)

# --- members -------------------------------------------------------------------------------------


# Session entries holding a new key's secret (encrypted) until its one reveal.
REVEAL = "key-reveal:"
NOT_ADDABLE = "No account you may add has this username. An operator adds people new to your tenants."


class MembershipForm(forms.ModelForm):
    """Members are named by their exact username: listing accounts to pick from would show tenant
    admins every account of the installation. A tenant admin may add only accounts the console
    already shows them (members of their tenants), and hears the same for any other name, whether
    or not such an account exists; operators add any active account (`addable_from` is None)."""

    username = forms.CharField(max_length=150, help_text="The exact username of someone in one of your tenants.")
    # The tenants whose members this editor may add (set per request by the admin); None: anyone.
    addable_from: set[int] | None = set()

    class Meta:
        model = Membership
        fields = ["tenant", "role"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["username"].initial = self.instance.user.get_username()
            self.fields["username"].disabled = True

    def clean_username(self):
        if self.instance.pk:
            return self.instance.user
        accounts = get_user_model().objects.filter(username=self.cleaned_data["username"], is_active=True)
        if self.addable_from is not None:
            accounts = self.addable(accounts)
        user = accounts.first()
        if user is None:
            raise ValidationError(NOT_ADDABLE)
        return user

    def addable(self, accounts):
        """The accounts this editor may add, of `accounts` (members of the editor's tenants)."""
        return accounts.filter(memberships__tenant_id__in=self.addable_from)

    def clean(self):
        data = super().clean()
        user, tenant = data.get("username"), data.get("tenant") or getattr(self.instance, "tenant", None)
        if user is not None and tenant is not None and not self.instance.pk:
            # A tenant added on this same page has no members yet (and no pk to ask about).
            if tenant.pk is not None and Membership.objects.filter(user=user, tenant=tenant).exists():
                raise ValidationError({"username": "This account is a member of the tenant already."})
            self.instance.user = user
        return data


def addable_from(request) -> set[int] | None:
    """Whose members this editor may add to a tenant: their own tenants' (None: operators, anyone)."""
    return None if request.user.is_superuser else tenant_ids_with(request, ALL_ROLES)


class MembershipFormSet(forms.BaseInlineFormSet):
    """One row per person: the same username twice in one save is the editor's to fix."""

    def clean(self):
        super().clean()
        seen = set()
        for form in self.forms:
            if self._should_delete_form(form) or not hasattr(form, "cleaned_data"):
                continue
            user = form.cleaned_data.get("username")
            if user is None:
                continue
            if user.pk in seen:
                raise ValidationError("The same person is named more than once; keep one row for them.")
            seen.add(user.pk)


class MembershipInline(TenantScopedInline, TabularInline):
    model = Membership
    form = MembershipForm
    formset = MembershipFormSet
    fields = ["username", "role"]
    extra = 0

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        formset.form.addable_from = addable_from(request)  # a class made for this request
        return formset


# Tenant settings that change which semantic hits are served or how they are judged.
MEASURED_SETTINGS = {"semantic_cache_enabled", "semantic_threshold", "false_hit_target"}


@admin.register(Tenant)
class TenantAdmin(ModelNamesAdmin, TenantScopedAdmin):
    tenant_lookup = "pk"
    list_display = ["name", "slug", "status", "created_at"]
    list_filter = ["status"]
    search_fields = ["name", "slug"]
    inlines = [MembershipInline]
    actions = ["suspend", "reactivate"]  # the gateway's admin adds "clear_cache" (its cache entries)

    def get_prepopulated_fields(self, request, obj=None):
        return {"slug": ["name"]} if request.user.is_superuser else {}

    def get_readonly_fields(self, request, obj=None):
        # The false-hit measurement's start and the tier's own switch-off: the gateway's record.
        tightened = ["shadow_since", "semantic_tightened_at", "semantic_tightened_reason"]
        if request.user.is_superuser:
            return ["created_at", *tightened]
        # Suspension, plan (tier) and identity are the operators' to set.
        return ["slug", "status", "tier", "knowledge_quota_bytes", "created_at", *tightened]

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not request.user.is_superuser:
            actions.pop("suspend", None)
            actions.pop("reactivate", None)
        return actions

    @admin.action(description="Suspend selected tenants")
    def suspend(self, request, queryset):
        for tenant in queryset:
            tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)

    @admin.action(description="Reactivate selected tenants")
    def reactivate(self, request, queryset):
        for tenant in queryset:
            tenant_set_status(tenant=tenant, status=Tenant.Status.ACTIVE)

    def save_model(self, request, obj, form, change):
        if change and MEASURED_SETTINGS & set(form.changed_data):
            # False hits measured under other settings say nothing about the new ones: measure anew
            # (and an admin turning the semantic tier back on has seen why it was off).
            obj.shadow_since = timezone.now()
            obj.semantic_tightened_reason = ""
        super().save_model(request, obj, form, change)
        if change and "status" in form.changed_data:
            tenant_set_status(tenant=obj, status=obj.status)
        announce_change()

    def save_formset(self, request, form, formset, change):
        if formset.model is not Membership:
            return super().save_formset(request, form, formset, change)
        memberships = formset.save(commit=False)
        for membership in formset.deleted_objects:
            membership_delete(membership=membership)
        for membership in memberships:
            membership_save(tenant=form.instance, user=membership.user, role=membership.role)
        return None


@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin):
    audited_by_services = True  # membership_save / membership_delete record the role before and after
    form = MembershipForm
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", TenantFilter]
    list_select_related = ["user", "tenant"]
    search_fields = ["user__username", "tenant__name", "tenant__slug"]
    autocomplete_fields = ["tenant"]

    def get_fields(self, request, obj=None):
        return ["tenant", "username", "role"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        form.addable_from = addable_from(request)  # a class made for this request
        return form

    def get_readonly_fields(self, request, obj=None):
        return ["tenant"] if obj else []

    def save_model(self, request, obj, form, change):
        saved = membership_save(tenant=obj.tenant, user=obj.user, role=obj.role)
        obj.pk = saved.pk

    def delete_model(self, request, obj):
        membership_delete(membership=obj)

    def delete_queryset(self, request, queryset):
        for membership in queryset:
            membership_delete(membership=membership)


# --- teams ---------------------------------------------------------------------------------------


class TeamMembershipForm(MembershipForm):
    """A team's members are named by exact username, as a tenant's are (MembershipForm): a tenant
    admin may add accounts of their own tenants (members, or members of their teams) only."""

    class Meta:
        model = TeamMembership
        fields = ["role"]

    def addable(self, accounts):
        return accounts.filter(
            Q(memberships__tenant_id__in=self.addable_from) | Q(team_memberships__team__tenant_id__in=self.addable_from)
        ).distinct()

    def clean_username(self):
        user = super().clean_username()
        self.instance.user = user  # a team's member: no tenant to check membership of first
        return user


class TeamMembershipInline(TenantScopedInline, TabularInline):
    model = TeamMembership
    form = TeamMembershipForm
    formset = MembershipFormSet
    fields = ["username", "role"]
    extra = 0
    verbose_name_plural = "members (team admins manage the team's keys; team viewers see them)"

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        formset.form.addable_from = addable_from(request)
        return formset


@admin.register(Team)
class TeamAdmin(AnnouncesChanges, ModelNamesAdmin, TenantScopedAdmin):
    """Teams (projects) inside a tenant: its admins create them and set their allowlists, limits and
    members; a team's own members see it (team admins manage its keys, on the key pages)."""

    team_lookup = "pk"
    team_manage_roles = frozenset()
    list_display = ["name", "tenant", "requests_per_minute", "tokens_per_minute", "max_concurrent", "created_at"]
    list_filter = [TenantFilter]
    list_select_related = ["tenant"]
    search_fields = ["name", "tenant__name"]
    fields = [
        "tenant",
        "name",
        "allowed_models",
        "tier",
        "requests_per_minute",
        "tokens_per_minute",
        "max_concurrent",
    ]
    inlines = [TeamMembershipInline]

    def get_readonly_fields(self, request, obj=None):
        return ["tenant"] if obj else []

    def save_formset(self, request, form, formset, change):
        if formset.model is not TeamMembership:
            return super().save_formset(request, form, formset, change)
        memberships = formset.save(commit=False)
        for membership in formset.deleted_objects:
            team_membership_delete(membership=membership)
        for membership in memberships:
            team_membership_save(team=form.instance, user=membership.user, role=membership.role)
        return None


# --- keys ----------------------------------------------------------------------------------------


class VirtualKeyForm(forms.ModelForm):
    # The tenants whose keys this editor manages whatever their team (None: operators, every tenant);
    # in any other tenant, a key must be in one of `admin_teams` (set per request by the admin).
    managed_tenants: set[int] | None = None
    admin_teams: set[int] = set()

    def clean(self):
        data = super().clean()
        tenant = data.get("tenant") or (self.instance.tenant if self.instance.pk else None)
        team = data.get("team")
        if tenant is not None and team is not None and team.tenant_id != tenant.pk:
            self.add_error("team", f"Team {team.name} belongs to another tenant: choose one of {tenant.name}'s.")
        elif (
            tenant is not None
            and self.managed_tenants is not None
            and tenant.pk not in self.managed_tenants
            and (team is None or team.pk not in self.admin_teams)
        ):
            self.add_error("team", "Choose one of the teams you administer: a team admin manages its keys only.")
        chosen = data.get("allowed_models") or []
        if tenant is not None and tenant.allowed_models:
            outside = [name for name in chosen if name not in tenant.allowed_models]
            if outside:
                message = f"Not on {tenant.name}'s list of models: {', '.join(outside)}. A key narrows it only."
                self.add_error("allowed_models", message)
        return data


class EndUserLimitInline(TenantScopedInline, TabularInline):
    """What each end user and each session of the app holding the key may spend or use (gateway.audience)."""

    model = EndUserLimit
    fields = ["scope", "period", "limit_usd", "token_cap"]
    extra = 0
    verbose_name_plural = "end-user and session limits (the OpenAI `user` field, the x-sentinel-session header)"


@admin.register(VirtualKey)
class VirtualKeyAdmin(AnnouncesChanges, ModelNamesAdmin, TenantScopedAdmin):
    audit_additions = False  # key_create records the issue
    form = VirtualKeyForm
    team_lookup = "team_id"  # team admins manage their team's keys, team viewers see them
    list_filter = ["status", TenantFilter, TeamFilter]
    list_select_related = ["tenant", "team"]
    search_fields = ["name", "prefix"]
    autocomplete_fields = ["tenant"]
    actions = ["revoke"]
    # A tenant may hold a million keys: counted up to CAP (its "select all" then names no number).
    paginator = CappedCountPaginator
    add_fields = [
        "tenant",
        "team",
        "name",
        "expires_at",
        "allowed_models",
        "tier",
        "requests_per_minute",
        "tokens_per_minute",
        "max_concurrent",
    ]
    details = ["prefix", "state", "created_at", "created_by", "last_used_at", "revoked_at", "successor"]

    def get_inlines(self, request, obj):
        return [EndUserLimitInline] if obj is not None else []

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        # A class made for this request: what this editor may put a key in.
        if request.user.is_superuser:
            form.managed_tenants = None
        else:
            form.managed_tenants = tenant_ids_with(request, self.manage_roles)
            form.admin_teams = team_ids_with(request, TEAM_MANAGE)
        return form

    def get_changeform_initial_data(self, request):
        """A team admin of one team gets its tenant and team filled in."""
        initial = super().get_changeform_initial_data(request)
        if not request.user.is_superuser and "tenant" not in initial:
            teams = list(Team.objects.filter(pk__in=team_ids_with(request, TEAM_MANAGE)))
            if len(teams) == 1:
                initial.update(tenant=teams[0].tenant_id, team=teams[0].pk)
        return initial

    def save_formset(self, request, form, formset, change):
        super().save_formset(request, form, formset, change)
        audit_inline_rows(request, formset, tenant_id=form.instance.tenant_id)

    def get_list_display(self, request):
        columns = ["name", "prefix", "tenant", "team", "state", "expires_at", "last_used_at", "requests_this_month"]
        if request.user.is_superuser or tenant_ids_with(request, SEE_SPEND):
            columns += ["cost_this_month", "budget_left"]
        return [*columns, "created_at"]

    def get_fields(self, request, obj=None):
        return self.add_fields if obj is None else [*self.details, *self.add_fields]

    def get_readonly_fields(self, request, obj=None):
        return ["tenant", *self.details] if obj else []

    @admin.display(description="state")
    def state(self, obj):
        if obj.state == "rotated":
            return f"rotated (works until {obj.expires_at:%Y-%m-%d %H:%M} UTC)"
        return obj.state

    # Usage of the keys on a changelist page, summed once for all of them (billing.selectors).
    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        keys = list(changelist.result_list)
        today = timezone.now().date()
        usage = key_usage(keys=keys, start=today.replace(day=1), end=today)
        budgets: dict[int, list[Budget]] = {}
        for budget in Budget.objects.filter(key__in=keys):
            budgets.setdefault(budget.key_id, []).append(budget)
        daily = key_usage(keys=[k for k in keys if k.pk in budgets], start=today, end=today) if budgets else {}
        for key in keys:
            key.month_usage = usage.get(key.pk)
            key.spend_visible = self.spend_visible(request, key)
            key.budget_left = self._budget_left(budgets.get(key.pk, []), daily.get(key.pk), key.month_usage)
        return changelist

    @staticmethod
    def _budget_left(budgets: list[Budget], today: dict | None, month: dict | None) -> str:
        """What the tightest of the key's own budgets has left this period ("—": none)."""
        lines = []
        for budget in budgets:
            used = (today if budget.period == Budget.Period.DAILY else month) or {}
            left = budget.limit_usd - used.get("cost_usd", ZERO)
            lines.append((left, f"{usd(max(left, ZERO), 2)} of {usd(budget.limit_usd, 2)} {budget.period}"))
        return min(lines)[1] if lines else "—"

    @admin.display(description="budget left")
    def budget_left(self, obj):
        return getattr(obj, "budget_left", "—") if getattr(obj, "spend_visible", False) else "—"

    @admin.display(description="requests this month")
    def requests_this_month(self, obj):
        usage = getattr(obj, "month_usage", None)
        return usage["requests"] if usage else 0

    @admin.display(description="cost this month (USD)")
    def cost_this_month(self, obj):
        if not getattr(obj, "spend_visible", False):
            return "—"
        usage = getattr(obj, "month_usage", None)
        return usd(usage["cost_usd"] if usage else ZERO)  # as the key's own page writes it

    def change_view(self, request, object_id, form_url="", extra_context=None):
        key = self.get_object(request, unquote(object_id))
        extra_context = dict(extra_context or {})
        if key is not None:
            extra_context["usage"] = self._usage_table(request, key)
            extra_context["may_manage"] = self.has_change_permission(request, key)
        return super().change_view(request, object_id, form_url, extra_context)

    def _usage_table(self, request, key: VirtualKey) -> dict:
        today = timezone.now().date()
        periods = {
            "today": today,
            "this month": today.replace(day=1),
            "last 30 days": today - timedelta(days=29),
        }
        rows = []
        for label, start in periods.items():
            metrics = key_usage(keys=[key], start=start, end=today).get(key.pk)
            rows.append(
                {
                    "period": label,
                    "requests": metrics["requests"] if metrics else 0,
                    "answered": metrics["successful_requests"] if metrics else 0,
                    "tokens": metrics["prompt_tokens"] + metrics["completion_tokens"] if metrics else 0,
                    "cost_usd": metrics["cost_usd"] if metrics else ZERO,
                }
            )
        return {"rows": rows, "show_cost": self.spend_visible(request, key)}

    @staticmethod
    def spend_visible(request, key: VirtualKey) -> bool:
        """A key's spend: its tenant's admins and finance, and its team's members."""
        return may(request, key.tenant_id, SEE_SPEND) or (
            key.team_id is not None and key.team_id in team_ids_with(request, frozenset(TeamMembership.Role.values))
        )

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            announce_change()
            return
        data = form.cleaned_data
        key, secret = key_create(
            tenant=data["tenant"],
            team=data.get("team"),
            name=data["name"],
            created_by=request.user,
            expires_at=data.get("expires_at"),
            allowed_models=data.get("allowed_models"),
            tier=data.get("tier"),
            requests_per_minute=data.get("requests_per_minute"),
            tokens_per_minute=data.get("tokens_per_minute"),
            max_concurrent=data.get("max_concurrent"),
        )
        obj.pk, obj.prefix = key.pk, key.prefix
        # Kept on this request only, for the page that answers it: never stored, logged or redirected.
        request.new_key_secret = secret

    def response_add(self, request, obj, post_url_continue=None):
        secret = getattr(request, "new_key_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        return self.secret_response(request, VirtualKey.objects.get(pk=obj.pk), secret)

    def secret_response(self, request, key: VirtualKey, secret: str, rotated: VirtualKey | None = None):
        """Post/redirect/get with a one-time reveal: the secret waits, encrypted, in the editor's
        session under a random handle, and the first GET of the reveal page takes it out. Reloading
        that page (or going back to it) shows no secret and makes no second key; reloading a POST
        answer used to create one."""
        handle = secrets.token_urlsafe(16)
        request.session[f"{REVEAL}{handle}"] = {
            "key": key.pk,
            "rotated": rotated.pk if rotated else None,
            "secret": encrypt(REVEAL, secret).decode(),
        }
        return HttpResponseRedirect(reverse("admin:tenants_virtualkey_reveal", args=[key.pk, handle]), status=303)

    def reveal_view(self, request, object_id, handle):
        """The one page that ever shows a key's secret, once."""
        key = self.get_object(request, unquote(object_id))
        if key is None:
            raise Http404("No virtual key with this id among yours.")
        waiting = request.session.pop(f"{REVEAL}{handle}", None)
        shown = waiting is not None and waiting["key"] == key.pk
        rotated = None
        if shown and waiting["rotated"]:
            rotated = VirtualKey.objects.filter(pk=waiting["rotated"]).first()
        response = TemplateResponse(
            request,
            "admin/tenants/virtualkey/secret.html",
            {
                **self.admin_site.each_context(request),
                "title": "Copy the new key now" if shown else "The secret was shown already",
                "opts": self.opts,
                "key": key,
                "secret": decrypt(REVEAL, waiting["secret"].encode()) if shown else None,
                "rotated": rotated,
                "change_url": reverse("admin:tenants_virtualkey_change", args=[key.pk]),
            },
        )
        add_never_cache_headers(response)
        return response

    def get_urls(self):
        urls = [
            path(
                "<path:object_id>/reveal/<str:handle>/",
                self.admin_site.admin_view(self.reveal_view),
                name="tenants_virtualkey_reveal",
            ),
            path(
                "<path:object_id>/rotate/",
                self.admin_site.admin_view(self.rotate_view),
                name="tenants_virtualkey_rotate",
            ),
            path(
                "<path:object_id>/revoke/",
                self.admin_site.admin_view(self.revoke_view),
                name="tenants_virtualkey_revoke",
            ),
        ]
        return urls + super().get_urls()

    def _managed_key(self, request, object_id) -> VirtualKey:
        key = self.get_object(request, unquote(object_id))
        if key is None:
            raise Http404("No virtual key with this id among yours.")
        if not self.has_change_permission(request, key):
            raise PermissionDenied
        return key

    def _confirm(self, request, key: VirtualKey, action: str, explanation: str):
        return TemplateResponse(
            request,
            "admin/tenants/virtualkey/confirm.html",
            {
                **self.admin_site.each_context(request),
                "title": f"{action.capitalize()} key {key}",
                "opts": self.opts,
                "key": key,
                "action": action,
                "explanation": explanation,
                "change_url": reverse("admin:tenants_virtualkey_change", args=[key.pk]),
            },
        )

    def rotate_view(self, request, object_id):
        key = self._managed_key(request, object_id)
        if request.method != "POST":
            return self._confirm(
                request,
                key,
                "rotate",
                f"A new key with the same settings replaces this one; its budgets move to the new key. "
                f"This key keeps working for {duration_text(settings.KEY_ROTATION_GRACE_SECONDS)} so your apps "
                "can switch, then it expires.",
            )
        try:
            new_key, secret = key_rotate(key=key, created_by=request.user)
        except KeyNotRotatable as error:
            self.message_user(request, str(error), messages.ERROR)
            return HttpResponseRedirect(reverse("admin:tenants_virtualkey_change", args=[key.pk]))
        key.refresh_from_db()
        self.log_change(request, key, f"Rotated; replaced by key {new_key.pk}.")
        self.log_addition(request, new_key, f"Created by rotating key {key.pk}.")
        return self.secret_response(request, new_key, secret, rotated=key)

    def revoke_view(self, request, object_id):
        key = self._managed_key(request, object_id)
        if request.method != "POST":
            return self._confirm(
                request, key, "revoke", "Every gateway process refuses the key within a second. This cannot be undone."
            )
        key_revoke(key=key)
        self.log_change(request, key, "Revoked.")
        self.message_user(request, f"Key {key} is revoked.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:tenants_virtualkey_change", args=[key.pk]))

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request, queryset):
        for key in queryset:
            key_revoke(key=key)
            self.log_change(request, key, "Revoked.")


def duration_text(seconds: int) -> str:
    for unit, size in (("day", 86_400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"


@admin.register(RateLimitTier)
class RateLimitTierAdmin(AnnouncesChanges, OperatorOnlyAdmin):
    list_display = ["name", "requests_per_minute", "tokens_per_minute", "max_concurrent"]
    search_fields = ["name"]


# --- budgets -------------------------------------------------------------------------------------


class BudgetForm(forms.ModelForm):
    class Meta:
        model = Budget
        fields = ["tenant", "team", "key", "period", "limit_usd", "alert_at_percent", "hard"]

    def clean(self):
        data = super().clean()
        tenant, key = data.get("tenant"), data.get("key")
        if tenant is not None and key is not None and key.tenant_id != tenant.pk:
            raise ValidationError({"key": "This key belongs to another tenant."})
        return data


@admin.register(Budget)
class BudgetAdmin(AnnouncesChanges, TenantScopedAdmin):
    form = BudgetForm
    team_lookup = "team_id"  # a team's members see its budgets; its tenant's admins set them
    team_manage_roles = frozenset()
    list_display = ["tenant", "team", "key", "period", "limit_usd", "alert_at_percent", "hard"]
    list_filter = ["period", "hard", TenantFilter, TeamFilter]
    list_select_related = ["tenant", "team", "key"]
    search_fields = ["tenant__name", "key__name", "key__prefix"]
    autocomplete_fields = ["tenant", "key"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not change or {"limit_usd", "alert_at_percent", "period", "key", "team"} & set(form.changed_data):
            from tenants.tasks import budget_check

            transaction.on_commit(lambda: budget_check.delay(obj.pk))


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ViewAndDelete, TenantScopedAdmin):
    tenant_lookup = "budget__tenant_id"
    view_roles = SEE_SPEND
    list_display = ["budget", "period_start", "spent_usd", "created_at"]
    list_filter = [TenantFilter]
    list_select_related = ["budget__tenant", "budget__key"]
    search_fields = ["budget__tenant__name", "budget__key__name"]
    readonly_fields = ["budget", "period_start", "spent_usd", "created_at"]


# --- webhooks ------------------------------------------------------------------------------------


class WebhookEndpointForm(forms.ModelForm):
    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Signing secret (HMAC-SHA256). Stored encrypted, never shown again; blank keeps the current one.",
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["tenant", "url", "secret", "events", "active"]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(TenantScopedAdmin):
    form = WebhookEndpointForm
    view_roles = MANAGE
    list_display = ["url", "tenant", "events", "active"]
    list_filter = ["active", TenantFilter]
    list_select_related = ["tenant"]
    search_fields = ["url", "tenant__name"]
    autocomplete_fields = ["tenant"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        if not request.user.is_superuser:
            form.base_fields["tenant"].required = True  # endpoints without a tenant get every tenant's events
        return form

    def save_model(self, request, obj, form, change):
        if form.cleaned_data.get("secret"):
            obj.set_secret(form.cleaned_data["secret"])
        super().save_model(request, obj, form, change)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(TenantScopedAdmin):
    tenant_lookup = "endpoint__tenant_id"
    view_roles = MANAGE
    list_display = ["created_at", "event", "endpoint", "status", "attempts", "last_status_code", "last_error"]
    list_filter = ["status", "event", TenantFilter]
    list_select_related = ["endpoint"]
    search_fields = ["event", "endpoint__url"]
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # a delivery log: read (and linked) as "View", never "Change"


# --- governance: the audit log, single sign-on rules ---------------------------------------------


def audit_csv(entries) -> Iterator[str]:
    """The entries as CSV, a row at a time (an export may be long)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    columns = ["created_at", "tenant_id", "actor_name", "address", "action", "target", "changes", "detail"]
    writer.writerow(columns)
    for entry in entries.iterator(chunk_size=2000):
        writer.writerow(
            [
                entry.created_at.isoformat(),
                entry.tenant_id or "",
                entry.actor_name,
                entry.address or "",
                entry.action,
                entry.target,
                json_text(entry.changes),
                entry.detail,
            ]
        )
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue()


def json_text(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False) if value else ""


@admin.register(AuditEntry)
class AuditEntryAdmin(ViewOnly, TenantScopedAdmin):
    """The audit log: a tenant's admins read their tenant's entries, operators every entry (those of
    no tenant too); nobody adds, edits or deletes one here (nor can anyone in the database: see
    AuditEntry). Filters select what the CSV export holds."""

    view_roles = MANAGE
    manage_roles = frozenset()
    list_display = ["created_at", "tenant", "actor_name", "action", "target", "changes_text", "address"]
    list_filter = ["action", TenantFilter]
    list_select_related = ["tenant"]
    search_fields = ["actor_name", "target", "detail"]
    date_hierarchy = "created_at"
    fields = ["created_at", "tenant", "actor_name", "address", "action", "target", "changes_text", "detail"]
    readonly_fields = fields
    change_list_template = "admin/tenants/auditentry/change_list.html"

    @admin.display(description="changes (before → after)")
    def changes_text(self, obj: AuditEntry) -> str:
        return "; ".join(f"{name}: {pair[0]!r} → {pair[1]!r}" for name, pair in obj.changes.items()) or "—"

    def get_urls(self):
        export = path("export/", self.admin_site.admin_view(self.export_view), name="tenants_auditentry_export")
        return [export, *super().get_urls()]

    def export_view(self, request):
        """The entries the changelist's filters select (the same query string), as CSV."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        entries = self.get_changelist_instance(request).get_queryset(request)
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response = StreamingHttpResponse(audit_csv(entries), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.csv"'
        return response


@admin.register(SingleSignOnRule)
class SingleSignOnRuleAdmin(OperatorOnlyAdmin):
    list_display = ["tenant", "role", "team", "team_role", "email_domain", "group"]
    list_filter = ["role", "team_role"]
    list_select_related = ["tenant", "team"]
    search_fields = ["tenant__name", "email_domain", "group"]
    autocomplete_fields = ["tenant"]
