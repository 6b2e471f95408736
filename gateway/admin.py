"""Providers, deployments, model aliases, breakers and kill switches in the console: the operators'
(superusers') alone. Cache entries are their tenants' to see."""

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Q
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from unfold.admin import TabularInline

from gateway.batches.models import Batch, BatchItem
from gateway.batches.services import batch_cancel
from gateway.cache.services import cache_invalidate, cache_invalidate_tenant
from gateway.knowledge.admin import VectorStoreAdmin
from gateway.knowledge.models import VectorStore
from gateway.limits.admission import deployment_in_flight, provider_spend_today
from gateway.models import (
    BreakerPolicy,
    BreakerTransition,
    CacheEntry,
    ChainEntry,
    ControlAction,
    Deployment,
    KillSwitch,
    ModelAlias,
    Provider,
    breaker_state_label,
)
from gateway.services import kill_switch_set
from gateway.upstream.breakers import breaker_force, breaker_snapshot
from gateway.upstream.load import describe_load
from sentinel.console.scoping import (
    AnnouncesChanges,
    OperatorOnlyAdmin,
    TenantFilter,
    TenantScopedAdmin,
    ViewAndDelete,
    ViewOnly,
)
from sentinel.text import PlainTextForm, PlainTextInline, count_text
from tenants import admin as tenants_admin
from tenants.models import Tenant
from tenants.selectors import MANAGE


class ProviderForm(forms.ModelForm):
    api_key = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Stored encrypted and never shown again. Leave blank to keep the current key.",
    )
    clear_api_key = forms.BooleanField(required=False, help_text="Remove the stored key.")

    class Meta:
        model = Provider
        fields = [
            "name",
            "kind",
            "api_base",
            "api_key",
            "clear_api_key",
            "api_key_env",
            "timeout_seconds",
            "first_token_timeout_seconds",
            "litellm_params",
            "daily_spend_cap_usd",
        ]


@admin.register(Provider)
class ProviderAdmin(AnnouncesChanges, OperatorOnlyAdmin):
    form = ProviderForm
    list_display = ["name", "kind", "api_base", "key_configured", "timeout_seconds", "spend_today"]
    search_fields = ["name", "kind"]
    readonly_fields = ["spend_today"]

    @admin.display(boolean=True, description="API key")
    def key_configured(self, obj):
        return obj.has_api_key

    @admin.display(description="spent today (UTC) / daily cap")
    def spend_today(self, obj):
        """As the gateway counts it in Redis: what its deployments' requests cost today. At the cap, the
        provider's deployments are skipped until the day ends."""
        spent = provider_spend_today(obj.pk)
        shown = "unknown (Redis unreachable)" if spent is None else f"${spent.normalize():f}"
        if obj.daily_spend_cap_usd is None:
            return f"{shown} (no cap)"
        reached = " — cap reached, traffic moved on" if spent is not None and spent >= obj.daily_spend_cap_usd else ""
        return f"{shown} of ${obj.daily_spend_cap_usd.normalize():f}{reached}"

    def save_model(self, request, obj, form, change):
        if form.cleaned_data.get("clear_api_key"):
            obj.set_api_key("")
        elif form.cleaned_data.get("api_key"):
            obj.set_api_key(form.cleaned_data["api_key"])
        super().save_model(request, obj, form, change)


class ReasonForm(PlainTextForm, forms.Form):
    reason = forms.CharField(max_length=300, help_text="Why: recorded with your name in the audit log.")


@admin.register(Deployment)
class DeploymentAdmin(AnnouncesChanges, OperatorOnlyAdmin):
    list_display = [
        "name",
        "provider",
        "litellm_model",
        "weight",
        "enabled",
        "breaker",
        "forced_state",
        "in_flight",
        "load",
    ]
    list_filter = ["enabled", "provider", "forced_state", "self_hosted"]
    list_select_related = ["provider"]
    search_fields = ["name", "litellm_model"]
    readonly_fields = ["breaker", "forced_state", "in_flight", "load", "recent_transitions"]

    @admin.display(description="load (self-hosted)")
    def load(self, obj):
        return describe_load(obj)

    @admin.display(description="in flight / max")
    def in_flight(self, obj):
        if obj.max_concurrent is None:
            return "no limit"
        now = deployment_in_flight(obj.pk)
        return f"{'?' if now is None else now} / {obj.max_concurrent}"

    actions = ["force_open", "force_closed", "release"]

    @admin.display(description="circuit breaker")
    def breaker(self, obj):
        snapshot = breaker_snapshot(obj.pk)
        label = breaker_state_label(snapshot["state"])
        if snapshot["open_for_seconds"]:
            return f"{label} ({snapshot['open_for_seconds']:.0f} s left)"
        return label

    @admin.display(description="recent breaker transitions")
    def recent_transitions(self, obj):
        rows = obj.transitions.select_related("actor")[:10]
        if not rows:
            return "none"
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                "<li>{} · {} · {}{}</li>",
                (
                    (
                        f"{t.created_at:%Y-%m-%d %H:%M:%S}",
                        t.change,
                        t.reason,
                        f" · by {t.actor}" if t.actor else "",
                    )
                    for t in rows
                ),
            ),
        )

    def _force(self, request, queryset, state: str, label: str):
        if "apply" in request.POST:
            form = ReasonForm(request.POST)
            if form.is_valid():
                for deployment in queryset:
                    breaker_force(
                        deployment=deployment, state=state, actor=request.user, reason=form.cleaned_data["reason"]
                    )
                self.message_user(request, f"{label}: {count_text(queryset.count(), 'deployment')}.", messages.SUCCESS)
                return None
        else:
            form = ReasonForm()
        return TemplateResponse(
            request,
            "admin/gateway/force_breaker.html",
            {
                **self.admin_site.each_context(request),
                "title": label,
                "deployments": queryset,
                "form": form,
                "action": request.POST["action"],
                "opts": self.model._meta,
            },
        )

    @admin.action(description="Force breaker open (send no traffic)")
    def force_open(self, request, queryset):
        return self._force(request, queryset, "open", "Forced open")

    @admin.action(description="Force breaker closed (always try)")
    def force_closed(self, request, queryset):
        return self._force(request, queryset, "closed", "Forced closed")

    @admin.action(description="Give breaker back to automatic")
    def release(self, request, queryset):
        return self._force(request, queryset, "", "Released to automatic")


@admin.register(BreakerPolicy)
class BreakerPolicyAdmin(AnnouncesChanges, OperatorOnlyAdmin):
    list_display = [
        "name",
        "window_seconds",
        "minimum_calls",
        "failure_rate_percent",
        "slow_call_seconds",
        "slow_rate_percent",
        "open_seconds",
        "half_open_probes",
    ]


@admin.register(BreakerTransition)
class BreakerTransitionAdmin(ViewAndDelete, OperatorOnlyAdmin):
    list_display = ["created_at", "deployment", "from_state", "to_state", "reason", "actor"]
    list_filter = ["to_state", "deployment"]
    list_select_related = ["deployment", "actor"]
    date_hierarchy = "created_at"


class KillSwitchForm(forms.ModelForm):
    reason = forms.CharField(max_length=300, help_text="Why: recorded with your name in the audit log.")

    class Meta:
        model = KillSwitch
        fields = ["tenant", "fallback", "active", "reason"]


@admin.register(KillSwitch)
class KillSwitchAdmin(OperatorOnlyAdmin):
    form = KillSwitchForm
    list_display = ["__str__", "active", "reason", "updated_by", "updated_at"]
    list_select_related = ["tenant", "fallback", "updated_by"]
    autocomplete_fields = ["tenant", "fallback"]

    def save_model(self, request, obj, form, change):
        switch = kill_switch_set(
            tenant=form.cleaned_data["tenant"],
            fallback=form.cleaned_data["fallback"],
            active=form.cleaned_data["active"],
            actor=request.user,
            reason=form.cleaned_data["reason"],
        )
        obj.pk = switch.pk


@admin.register(ControlAction)
class ControlActionAdmin(ViewOnly, OperatorOnlyAdmin):
    list_display = ["created_at", "action", "subject", "reason", "actor"]
    list_filter = ["action"]
    list_select_related = ["actor"]


class ChainEntryInline(PlainTextInline, TabularInline):
    model = ChainEntry
    extra = 1
    autocomplete_fields = ["deployment"]


@admin.register(ModelAlias)
class ModelAliasAdmin(AnnouncesChanges, OperatorOnlyAdmin):
    list_display = ["name", "description"]
    search_fields = ["name"]
    inlines = [ChainEntryInline]


@admin.register(CacheEntry)
class CacheEntryAdmin(ViewAndDelete, TenantScopedAdmin):
    """A tenant's cached answers, for its admins to inspect and invalidate. Invalidating (or deleting
    one) goes through gateway.cache.services, which also clears the exact tier in Redis and in every
    process; a plain row delete would not."""

    view_roles = MANAGE
    list_display = ["created_at", "tenant", "model", "short_prompt", "hits", "last_hit_at", "expires_at"]
    list_filter = [TenantFilter, "model"]
    list_select_related = ["tenant"]
    search_fields = ["prompt", "model"]
    fields = ["tenant", "model", "prompt", "answer", "cost_usd", "hits", "created_at", "last_hit_at", "expires_at"]
    readonly_fields = fields
    actions = ["invalidate"]

    def get_queryset(self, request):
        return super().get_queryset(request).defer("embedding")

    @admin.display(description="prompt")
    def short_prompt(self, obj):
        return obj.prompt[:80]

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # deleting must also clear Redis and every process
        return actions

    @admin.action(description="Invalidate selected entries", permissions=["delete"])
    def invalidate(self, request, queryset):
        removed = cache_invalidate(entries=queryset)
        self.message_user(request, f"Invalidated {removed} cache entries.", messages.SUCCESS)

    def delete_model(self, request, obj):
        cache_invalidate(entries=CacheEntry.objects.filter(pk=obj.pk))


@admin.register(Batch)
class BatchAdmin(ViewOnly, TenantScopedAdmin):  # a batch is its tenant's record of the work: cancel it
    """Batches as their tenants see them through /v1/batches: read only; tenant admins (and operators)
    may cancel them."""

    list_display = ["public_id", "tenant", "status", "requests", "succeeded", "failed", "created_at", "expires_at"]
    list_filter = ["status", TenantFilter]
    list_select_related = ["tenant"]
    search_fields = ["public_id", "input_file__filename"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in Batch._meta.fields]
    actions = ["cancel"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .defer("errors", "metadata")
            .annotate(
                item_count=Count("items"),
                succeeded_count=Count("items", filter=Q(items__status=BatchItem.Status.SUCCEEDED)),
                failed_count=Count(
                    "items", filter=Q(items__status__in=(BatchItem.Status.FAILED, BatchItem.Status.EXPIRED))
                ),
            )
        )

    @admin.display(description="requests", ordering="item_count")
    def requests(self, obj):
        return obj.item_count

    @admin.display(description="succeeded", ordering="succeeded_count")
    def succeeded(self, obj):
        return obj.succeeded_count

    @admin.display(description="failed", ordering="failed_count")
    def failed(self, obj):
        return obj.failed_count

    @admin.action(description="Cancel selected batches (requests in flight finish)", permissions=["cancel"])
    def cancel(self, request, queryset):
        # response_action has already narrowed the selection to the tenants the user manages.
        running = queryset.filter(status__in=(Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS))
        for batch in running:
            batch_cancel(batch=batch)
        self.message_user(request, f"Cancelling {len(running)} batch(es).", messages.SUCCESS)

    def has_cancel_permission(self, request):
        return self.has_view_permission(request) and self._allowed(request, None, self.manage_roles, frozenset())


admin.site.register(VectorStore, VectorStoreAdmin)


# The tenants app sits below the gateway and knows nothing of its cache: the gateway extends the
# tenants' page with the action that empties a tenant's cache entries.
admin.site.unregister(Tenant)


@admin.register(Tenant)
class TenantAdmin(tenants_admin.TenantAdmin):
    actions = [*tenants_admin.TenantAdmin.actions, "clear_cache"]

    @admin.action(description="Clear the cache of selected tenants", permissions=["change"])
    def clear_cache(self, request, queryset):
        removed = sum(cache_invalidate_tenant(tenant=tenant) for tenant in queryset)
        self.message_user(request, f"Invalidated {removed} cache entries.", messages.SUCCESS)
