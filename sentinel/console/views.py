"""The console's own pages (served by console.sites under /admin/): the dashboard and the live
circuit view. Both render their figures on the server and then follow the console's websocket."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.template.response import TemplateResponse

from billing.money import format_usd
from gateway.cache import shadow
from sentinel.console.selectors import (
    DEFAULT_WINDOW,
    WINDOWS,
    Dashboard,
    circuits,
    dashboard,
    models_offered,
    recent_transitions,
)
from tenants.models import Tenant
from tenants.selectors import SEE_SPEND, tenant_ids_for, tenants_for

WINDOW_LABELS = {"1h": "Last hour", "24h": "Last 24 hours", "7d": "Last 7 days", "30d": "Last 30 days"}
SPEND_CHART_TENANTS = 10


def _money(value) -> str | None:
    return None if value is None else format_usd(value)


def chart_data(data: Dashboard, tenant: Tenant | None) -> dict:
    """What the page's charts draw (money as exact decimal strings)."""
    totals = data.totals
    money = data.spend is not None

    def drawn(line: dict) -> dict:
        shown = {"name": line["name"], "requests": line["requests"]}
        if money:
            shown["cost_usd"] = [format_usd(cost) for cost in line["cost_usd"]]
        return shown

    return {
        "tenant": tenant.slug if tenant else None,
        "window": data.window,
        "series": [
            {**point, "cost_usd": format_usd(point["cost_usd"])}
            if money
            else {name: value for name, value in point.items() if name != "cost_usd"}
            for point in data.series
        ],
        "keys": [drawn(line) for line in data.keys_over_time],
        "models": [drawn(line) for line in data.models_over_time],
        "latency": {name: totals[name] for name in ("p50", "p95", "p99")},
        "cache": {"exact": totals["exact_hits"], "semantic": totals["semantic_hits"], "miss": totals["misses"]},
        "providers": [
            {"provider": p.provider, "requests": p.requests, "share": p.share, "error_rate": p.error_rate}
            for p in data.providers
        ],
        "spend": None
        if data.spend is None
        else [
            {
                "tenant": line.tenant.name,
                "today": _money(line.today),
                "month": _money(line.month),
                "daily_budget": _money(line.daily_budget),
                "monthly_budget": _money(line.monthly_budget),
            }
            for line in data.spend[:SPEND_CHART_TENANTS]
        ],
    }


def dashboard_view(request):
    user = request.user
    visible = tenants_for(user)
    if not user.is_superuser and not visible.exists():
        raise PermissionDenied
    context = {"title": "Dashboard", "windows": WINDOW_LABELS, "tenants": visible.order_by("name")}
    window = request.GET.get("window") or DEFAULT_WINDOW
    if window not in WINDOWS:
        context["error"] = f"Unknown window {window!r}: use {' or '.join(WINDOWS)}."
        return TemplateResponse(
            request, "admin/console/dashboard.html", {**request_context(request), **context}, status=400
        )
    tenant = None
    if request.GET.get("tenant"):
        tenant = visible.filter(slug=request.GET["tenant"]).first()
        if tenant is None:
            raise Http404("No such tenant among yours.")
    if user.is_superuser:
        tenant_ids = [tenant.pk] if tenant else None
        spend_tenants = [tenant] if tenant else list(Tenant.objects.all())
    else:
        spend_ids = tenant_ids_for(user, SEE_SPEND)
        tenant_ids = [tenant.pk] if tenant else sorted(visible.values_list("pk", flat=True))
        spend_tenants = [
            t for t in ([tenant] if tenant else Tenant.objects.filter(pk__in=spend_ids)) if t.pk in spend_ids
        ]
    data = dashboard(tenant_ids=tenant_ids, spend_tenants=spend_tenants or None, window=window)
    context.update(
        {
            "data": data,
            "tenant": tenant,
            "window": window,
            "charts": chart_data(data, tenant),
            "false_hits": shadow.false_hits(tenant) if tenant else None,
            "live": {"tenant_ids": tenant_ids, "show_money": data.spend is not None},
        }
    )
    return TemplateResponse(request, "admin/console/dashboard.html", {**request_context(request), **context})


def circuits_view(request):
    """Operators only: deployments and their providers are the installation's, not a tenant's."""
    if not request.user.is_superuser:
        raise PermissionDenied
    search = request.GET.get("q", "").strip()
    rows = circuits(search=search)
    shown = [row.deployment for row in rows] if search else None
    context = {
        "title": "Live circuits",
        "search": search,
        "circuits": rows,
        "transitions": recent_transitions(deployments=shown),
    }
    return TemplateResponse(request, "admin/console/circuits.html", {**request_context(request), **context})


def models_view(request):
    """Models and prices: what a tenant's keys may call, read-only, for everyone in the tenant."""
    visible = tenants_for(request.user).order_by("name")
    if not request.user.is_superuser and not visible.exists():
        raise PermissionDenied
    tenant = visible.filter(slug=request.GET["tenant"]).first() if request.GET.get("tenant") else visible.first()
    if tenant is None and request.GET.get("tenant"):
        raise Http404("No such tenant among yours.")
    context = {
        "title": "Models and prices",
        "tenants": visible,
        "tenant": tenant,
        "offers": models_offered(tenant) if tenant else [],
    }
    return TemplateResponse(request, "admin/console/models.html", {**request_context(request), **context})


def request_context(request) -> dict:
    from django.contrib import admin

    return admin.site.each_context(request)
