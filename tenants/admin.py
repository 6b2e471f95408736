"""Tenants, members and keys in the Django admin."""

from django import forms
from django.contrib import admin, messages

from gateway.localstate import announce_change
from tenants.models import (
    Budget,
    BudgetAlert,
    Membership,
    RateLimitTier,
    Tenant,
    VirtualKey,
    WebhookDelivery,
    WebhookEndpoint,
)
from tenants.services import key_create, key_revoke, tenant_set_status


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "status", "created_at"]
    list_filter = ["status"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]
    actions = ["suspend", "reactivate", "clear_cache"]

    @admin.action(description="Clear the cache of selected tenants")
    def clear_cache(self, request, queryset):
        from gateway.cache.services import cache_invalidate_tenant

        removed = sum(cache_invalidate_tenant(tenant=tenant) for tenant in queryset)
        self.message_user(request, f"Invalidated {removed} cache entries.", messages.SUCCESS)

    @admin.action(description="Suspend selected tenants")
    def suspend(self, request, queryset):
        for tenant in queryset:
            tenant_set_status(tenant=tenant, status=Tenant.Status.SUSPENDED)

    @admin.action(description="Reactivate selected tenants")
    def reactivate(self, request, queryset):
        for tenant in queryset:
            tenant_set_status(tenant=tenant, status=Tenant.Status.ACTIVE)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and "status" in form.changed_data:
            tenant_set_status(tenant=obj, status=obj.status)
        announce_change()


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role"]
    list_filter = ["role"]
    list_select_related = ["user", "tenant"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(VirtualKey)
class VirtualKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "tenant", "status", "expires_at", "last_used_at", "created_at"]
    list_filter = ["status", "tenant"]
    list_select_related = ["tenant"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "status", "created_at", "created_by", "revoked_at", "last_used_at"]
    autocomplete_fields = ["tenant"]
    actions = ["revoke"]

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        return fields + ["tenant"] if obj else fields

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            announce_change()
            return
        key, secret = key_create(
            tenant=obj.tenant,
            name=obj.name,
            created_by=request.user,
            expires_at=obj.expires_at,
            allowed_models=obj.allowed_models,
        )
        obj.pk = key.pk
        messages.warning(request, f"New key {key.name}: {secret} — copy it now, it will not be shown again.")

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        for key in queryset:
            key_revoke(key=key)


@admin.register(RateLimitTier)
class RateLimitTierAdmin(admin.ModelAdmin):
    list_display = ["name", "requests_per_minute", "tokens_per_minute", "max_concurrent"]
    search_fields = ["name"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        announce_change()


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ["tenant", "key", "period", "limit_usd", "alert_at_percent", "hard"]
    list_filter = ["period", "hard"]
    list_select_related = ["tenant", "key"]
    autocomplete_fields = ["tenant", "key"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        announce_change()

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        announce_change()


@admin.register(BudgetAlert)
class BudgetAlertAdmin(admin.ModelAdmin):
    list_display = ["budget", "period_start", "spent_usd", "created_at"]
    list_select_related = ["budget__tenant", "budget__key"]
    readonly_fields = ["budget", "period_start", "spent_usd", "created_at"]

    def has_add_permission(self, request):
        return False


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
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ["url", "tenant", "events", "active"]
    list_filter = ["active"]
    list_select_related = ["tenant"]
    autocomplete_fields = ["tenant"]

    def save_model(self, request, obj, form, change):
        if form.cleaned_data.get("secret"):
            obj.set_secret(form.cleaned_data["secret"])
        super().save_model(request, obj, form, change)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ["created_at", "event", "endpoint", "status", "attempts", "last_status_code", "last_error"]
    list_filter = ["status", "event"]
    list_select_related = ["endpoint"]
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]

    def has_add_permission(self, request):
        return False
