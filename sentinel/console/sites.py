"""The console's admin site: Django's admin plus the dashboard and the live circuit view."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.urls import path
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache
from unfold.sites import UnfoldAdminSite


class ConsoleSite(UnfoldAdminSite):
    """Unfold's site (sidebar by role, dark mode: see UNFOLD in settings) with the console's pages."""

    site_header = "Sentinel console"
    site_title = "Sentinel console"
    index_title = "Tenants, keys, models and spend"

    def get_urls(self):
        from sentinel.console import views

        return [
            path("dashboard/", self.admin_view(views.dashboard_view), name="dashboard"),
            path("circuits/", self.admin_view(views.circuits_view), name="circuits"),
            path("models/", self.admin_view(views.models_view), name="models"),
            *super().get_urls(),
        ]

    @method_decorator(never_cache)
    @login_not_required
    def login(self, request, extra_context=None):
        """Django's login page; a sign-in the brute-force guard refused is 429 with Retry-After
        (sentinel.authentication), not the form again."""
        from sentinel.authentication import refused_wait
        from sentinel.views import too_many_sign_ins

        response = super().login(request, extra_context)
        wait = refused_wait(request)
        return too_many_sign_ins(wait) if wait is not None else response

    def each_context(self, request):
        context = super().each_context(request)
        context["console_circuits"] = request.user.is_active and request.user.is_superuser
        return context
