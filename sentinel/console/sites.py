"""The console's admin site: Django's admin plus the dashboard and the live circuit view."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path


class ConsoleSite(admin.AdminSite):
    site_header = "Sentinel console"
    site_title = "Sentinel console"
    index_title = "Tenants, keys, models and spend"

    def get_urls(self):
        from sentinel.console import views

        return [
            path("dashboard/", self.admin_view(views.dashboard_view), name="dashboard"),
            path("circuits/", self.admin_view(views.circuits_view), name="circuits"),
            *super().get_urls(),
        ]

    def each_context(self, request):
        context = super().each_context(request)
        context["console_circuits"] = request.user.is_active and request.user.is_superuser
        return context
