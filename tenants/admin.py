"""Tenants, members and keys in the Django admin."""

from django.contrib import admin, messages

from tenants.models import Membership, Tenant, VirtualKey
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
    actions = ["suspend", "reactivate"]

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
