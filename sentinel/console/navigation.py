"""The console's sidebar (Unfold's navigation callback): the pages each role may open, grouped by job.

An entry is shown when the page's own admin would let the user open it (its model admin's view
permission, which holds the tenant scoping of sentinel.console.scoping), so the sidebar can never
offer a link that answers 403, and never hides one that works: operators see the installation's
configuration, tenant admins their tenants, keys, members, budgets, webhooks, screening and cache,
finance the request log, spend report with statements and dead letters, everyone the dashboard,
Models and prices and their own two-factor sign-in; the audit log is for tenant admins (their
tenants' entries) and operators, single sign-on rules for operators.
"""

from __future__ import annotations

from collections.abc import Callable

from django.apps import apps
from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse

# (group, [(title, Material Symbols icon, "app_label.Model" or "admin:url_name")])
SECTIONS: list[tuple[str, list[tuple[str, str, str]]]] = [
    (
        "Overview",
        [
            ("Dashboard", "monitoring", "admin:dashboard"),
            ("Models and prices", "sell", "admin:models"),
            ("Live circuits", "electric_bolt", "admin:circuits"),
        ],
    ),
    (
        "Tenants",
        [
            ("Tenants", "apartment", "tenants.Tenant"),
            ("Members", "group", "tenants.Membership"),
            ("Virtual keys", "key", "tenants.VirtualKey"),
            ("Budgets", "savings", "tenants.Budget"),
            ("Budget alerts", "notifications", "tenants.BudgetAlert"),
            ("Webhooks", "webhook", "tenants.WebhookEndpoint"),
            ("Webhook deliveries", "outbox", "tenants.WebhookDelivery"),
            ("Screening policies", "policy", "screening.ScreeningPolicy"),
            ("Screening report", "fact_check", "screening.ScreeningReport"),
            ("Cache entries", "cached", "gateway.CacheEntry"),
            ("Batches", "stacks", "gateway.Batch"),
            ("Knowledge bases", "library_books", "gateway.VectorStore"),
        ],
    ),
    (
        "Governance",
        [
            ("Audit log", "history_edu", "tenants.AuditEntry"),
            ("Two-factor sign-in", "phonelink_lock", "admin:two_factor"),
            ("Single sign-on rules", "badge", "tenants.SingleSignOnRule"),
        ],
    ),
    (
        "Spend",
        [
            ("Request log", "receipt_long", "billing.LedgerEntry"),
            ("Spend report and statements", "request_quote", "billing.SpendReport"),
            ("Ledger dead letters", "report", "billing.LedgerDeadLetter"),
        ],
    ),
    (
        "Operations",
        [
            ("Providers", "cloud", "gateway.Provider"),
            ("Deployments", "dns", "gateway.Deployment"),
            ("Model aliases", "alt_route", "gateway.ModelAlias"),
            ("Breaker policies", "tune", "gateway.BreakerPolicy"),
            ("Breaker transitions", "timeline", "gateway.BreakerTransition"),
            ("Kill switches", "power_settings_new", "gateway.KillSwitch"),
            ("Control actions", "history", "gateway.ControlAction"),
            ("Prices", "payments", "billing.Price"),
            ("Rate limit tiers", "speed", "tenants.RateLimitTier"),
        ],
    ),
    (
        "Accounts",
        [
            ("Users", "person", "auth.User"),
            ("Groups", "groups", "auth.Group"),
            ("Periodic tasks", "schedule", "django_celery_beat.PeriodicTask"),
        ],
    ),
]


def _page(request: HttpRequest, target: str) -> tuple[str, Callable[[HttpRequest], bool]] | None:
    """The link to a page and who may open it; None when the page is not installed."""
    if target == "admin:circuits":  # the live circuit view shows every tenant's deployments
        return reverse(target), lambda r: r.user.is_active and r.user.is_superuser
    if target.startswith("admin:"):  # dashboard, models: every signed-in console user (scoped inside)
        return reverse(target), lambda r: r.user.is_active and r.user.is_staff
    model = apps.get_model(target)
    model_admin = admin.site._registry.get(model)
    if model_admin is None:
        return None
    opts = model._meta
    link = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    return link, lambda r: model_admin.has_module_permission(r) and model_admin.has_view_permission(r)


def sidebar(request: HttpRequest) -> list[dict]:
    """Unfold's SIDEBAR["navigation"]: the groups with at least one page the user may open."""
    groups = []
    for title, entries in SECTIONS:
        items = []
        for label, icon, target in entries:
            page = _page(request, target)
            if page is None:
                continue
            link, allowed = page
            if allowed(request):
                items.append({"title": label, "icon": icon, "link": link, "permission": allowed})
        if items:
            groups.append({"title": title, "separator": True, "collapsible": False, "items": items})
    return groups
