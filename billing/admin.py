"""Prices and the ledger in the Django admin (the ledger is read-only)."""

from django.contrib import admin

from billing.models import LedgerEntry, Price


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = ["model", "input_per_token", "output_per_token", "effective_from", "source"]
    search_fields = ["model"]
    list_filter = ["source"]


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "request_id",
        "tenant",
        "model_requested",
        "provider",
        "status_code",
        "prompt_tokens",
        "completion_tokens",
        "cost_usd",
        "cache_tier",
        "latency_ms",
    ]
    list_filter = ["status_code", "cache_tier", "provider"]
    list_select_related = ["tenant"]
    search_fields = ["request_id"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
