"""Screening policies in the console (a tenant's admins see and edit their tenant's; the moderation
provider, an operator's account, is picked by superusers) and the screening report: decisions and
outages per tenant and check."""

from datetime import timedelta

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.utils import timezone
from unfold.admin import ModelAdmin

from gateway.localstate import announce_change
from gateway.screening.models import ScreeningPolicy, ScreeningReport
from gateway.screening.selectors import screening_decisions, screening_outages
from sentinel.console.scoping import TenantFilter, TenantScopedAdmin
from tenants.selectors import MANAGE, tenant_ids_for, tenants_for

REPORT_DAYS = (1, 7, 30, 90)


class ScreeningPolicyForm(forms.ModelForm):
    guardrail_secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="HMAC-SHA256 signing secret for the guardrail. Stored encrypted, never shown again; "
        "blank keeps the current one.",
    )

    class Meta:
        model = ScreeningPolicy
        fields = [
            f.name for f in ScreeningPolicy._meta.get_fields() if getattr(f, "editable", False) and f.concrete
        ] + ["guardrail_secret"]

    def clean_phone_region(self):
        import phonenumbers

        region = self.cleaned_data["phone_region"].upper()
        if region not in phonenumbers.SUPPORTED_REGIONS:
            raise forms.ValidationError("Not a country phonenumbers knows (two letters, e.g. US, GB, DE).")
        return region


@admin.register(ScreeningPolicy)
class ScreeningPolicyAdmin(TenantScopedAdmin):
    view_roles = MANAGE
    form = ScreeningPolicyForm
    list_display = ["tenant", "enabled", "email", "payment_card", "secret", "injection", "moderation", "guardrail"]
    list_filter = ["enabled", TenantFilter]
    list_select_related = ["tenant"]
    search_fields = ["tenant__name", "tenant__slug"]
    autocomplete_fields = ["tenant"]
    fieldsets = [
        (None, {"fields": ["tenant", "enabled"]}),
        (
            "Input",
            {
                "fields": [
                    "email",
                    "phone",
                    "phone_region",
                    "payment_card",
                    "iban",
                    "national_id",
                    "ip_address",
                    "secret",
                    "injection",
                    "moderation",
                ]
            },
        ),
        ("Output", {"fields": ["output_personal_data", "output_moderation", "stream_window"]}),
        (
            "Moderation provider",
            {
                "fields": [
                    "moderation_provider",
                    "moderation_model",
                    "moderation_timeout_ms",
                    "moderation_input_outage",
                    "moderation_output_outage",
                ]
            },
        ),
        (
            "Custom guardrail",
            {"fields": ["guardrail_url", "guardrail_secret", "guardrail_timeout_ms", "guardrail_outage"]},
        ),
    ]

    @admin.display(boolean=True)
    def guardrail(self, obj):
        return bool(obj.guardrail_url)

    def get_readonly_fields(self, request, obj=None):
        # Providers are operators' accounts: tenants' admins see which one screens them, not the list.
        return [] if request.user.is_superuser else ["moderation_provider"]

    def save_model(self, request, obj, form, change):
        if form.cleaned_data.get("guardrail_secret"):
            obj.set_guardrail_secret(form.cleaned_data["guardrail_secret"])
        super().save_model(request, obj, form, change)
        announce_change()  # every process re-reads the keys' settings, which carry the policy

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        announce_change()

    def delete_queryset(self, request, queryset):
        super().delete_queryset(request, queryset)
        announce_change()


@admin.register(ScreeningReport)
class ScreeningReportAdmin(ModelAdmin):
    """Not a list of rows: the changelist is the report, over the tenants the user manages."""

    def has_module_permission(self, request):
        return tenants_for(request.user, MANAGE).exists()

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            days = int(request.GET.get("days", 7))
        except ValueError:
            days = 7
        days = days if days in REPORT_DAYS else 7
        since = timezone.now() - timedelta(days=days)
        tenant_ids = sorted(tenant_ids_for(request.user, MANAGE))
        context = {
            **self.admin_site.each_context(request),
            "title": "Screening report",
            "opts": self.model._meta,
            "days": days,
            "day_choices": REPORT_DAYS,
            "decisions": screening_decisions(since=since, tenant_ids=tenant_ids),
            "outages": screening_outages(since=since, tenant_ids=tenant_ids),
        }
        return TemplateResponse(request, "admin/screening/report.html", context)
