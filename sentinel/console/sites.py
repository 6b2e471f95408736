"""The console's admin site: Django's admin plus the dashboard, the live circuit view and the
two-factor page; its sign-in asks for a one-time code of those enrolled (sentinel.console.twofactor)
and offers single sign-on when an operator set it up (sentinel.console.sso)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.shortcuts import redirect
from django.urls import path
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache
from unfold.sites import UnfoldAdminSite


class ConsoleSite(UnfoldAdminSite):
    """Unfold's site (sidebar by role, dark mode: see UNFOLD in settings) with the console's pages."""

    site_header = "Sentinel console"
    site_title = "Sentinel console"
    index_title = "Tenants, keys, models and spend"
    login_form = None  # set in __init__: the form imports the admin's widgets

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from sentinel.console.twofactor import ConsoleAuthenticationForm

        self.login_form = ConsoleAuthenticationForm

    def has_permission(self, request):
        from sentinel.console.factors import console_allows

        return super().has_permission(request) and console_allows(request)

    def get_urls(self):
        from sentinel.console import views
        from sentinel.console.twofactor import two_factor_view

        return [
            path("two-factor/", never_cache(lambda request: two_factor_view(request, self)), name="two_factor"),
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
        from sentinel.console.factors import must_enrol
        from sentinel.views import too_many_sign_ins

        if must_enrol(request):
            return redirect("admin:two_factor")
        extra_context = {
            **(extra_context or {}),
            "sso_name": settings.OIDC_PROVIDER_NAME if settings.OIDC_ISSUER else None,
            "sso_failed": request.GET.get("sso") == "failed",
            "password_sign_in": settings.PASSWORD_SIGN_IN,
        }
        response = super().login(request, extra_context)
        wait = refused_wait(request)
        return too_many_sign_ins(wait) if wait is not None else response

    def each_context(self, request):
        context = super().each_context(request)
        context["console_circuits"] = request.user.is_active and request.user.is_superuser
        return context
