"""Providers, deployments and model aliases in the Django admin."""

from django import forms
from django.contrib import admin

from gateway.localstate import announce_change
from gateway.models import ChainEntry, Deployment, ModelAlias, Provider


class AnnouncesChanges(admin.ModelAdmin):
    """Gateway processes cache routing configuration: tell them when the admin changes it."""

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        announce_change()

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        announce_change()

    def delete_queryset(self, request, queryset):
        super().delete_queryset(request, queryset)
        announce_change()


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
        ]


@admin.register(Provider)
class ProviderAdmin(AnnouncesChanges):
    form = ProviderForm
    list_display = ["name", "kind", "api_base", "key_configured", "timeout_seconds"]
    search_fields = ["name", "kind"]

    @admin.display(boolean=True, description="API key")
    def key_configured(self, obj):
        return obj.has_api_key

    def save_model(self, request, obj, form, change):
        if form.cleaned_data.get("clear_api_key"):
            obj.set_api_key("")
        elif form.cleaned_data.get("api_key"):
            obj.set_api_key(form.cleaned_data["api_key"])
        super().save_model(request, obj, form, change)


@admin.register(Deployment)
class DeploymentAdmin(AnnouncesChanges):
    list_display = ["name", "provider", "litellm_model", "weight", "enabled"]
    list_filter = ["enabled", "provider"]
    list_select_related = ["provider"]
    search_fields = ["name", "litellm_model"]


class ChainEntryInline(admin.TabularInline):
    model = ChainEntry
    extra = 1
    autocomplete_fields = ["deployment"]


@admin.register(ModelAlias)
class ModelAliasAdmin(AnnouncesChanges):
    list_display = ["name", "description"]
    search_fields = ["name"]
    inlines = [ChainEntryInline]
