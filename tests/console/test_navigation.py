"""The console's sidebar by role (sentinel.console.navigation): each person sees exactly the pages
their role may open, every page offered opens for them, and pages left out answer 403."""

from __future__ import annotations

import pytest

from tests.conftest import unique
from tests.console.conftest import as_user

OVERVIEW = ["Dashboard", "Models and prices"]
SPEND = ["Request log", "Spend report and statements", "Ledger dead letters"]
TENANT_ADMIN = [
    "Tenants",
    "Members",
    "Virtual keys",
    "Budgets",
    "Budget alerts",
    "Webhooks",
    "Webhook deliveries",
    "Screening policies",
    "Screening report",
    "Cache entries",
    "Batches",
    "Knowledge bases",
]
OPERATIONS = [
    "Providers",
    "Deployments",
    "Model aliases",
    "Breaker policies",
    "Breaker transitions",
    "Kill switches",
    "Control actions",
    "Prices",
    "Rate limit tiers",
]
TWO_FACTOR = ["Two-factor sign-in"]
EXPECTED = {
    "owner": {"Overview": OVERVIEW, "Tenants": TENANT_ADMIN, "Governance": ["Audit log", *TWO_FACTOR], "Spend": SPEND},
    # Finance and viewers read their tenant's settings (read-only) but not its webhooks, screening, cache or audit log.
    "finance": {"Overview": OVERVIEW, "Tenants": TENANT_ADMIN[:5], "Governance": TWO_FACTOR, "Spend": SPEND},
    "viewer": {"Overview": OVERVIEW, "Tenants": TENANT_ADMIN[:4], "Governance": TWO_FACTOR},
    "superuser": {
        "Overview": [*OVERVIEW, "Live circuits"],
        "Tenants": TENANT_ADMIN,
        "Governance": ["Audit log", *TWO_FACTOR, "Single sign-on rules"],
        "Spend": SPEND,
        "Operations": OPERATIONS,
        "Accounts": ["Users", "Groups", "Periodic tasks"],
    },
}
# Pages each role does not get in the sidebar, and may not open either.
LEFT_OUT = {
    "owner": [
        "/admin/circuits/",
        "/admin/gateway/provider/",
        "/admin/billing/price/",
        "/admin/auth/user/",
        "/admin/tenants/singlesignonrule/",
    ],
    "finance": [
        "/admin/tenants/webhookendpoint/",
        "/admin/gateway/cacheentry/",
        "/admin/gateway/deployment/",
        "/admin/tenants/auditentry/",
    ],
    "viewer": ["/admin/billing/ledgerentry/", "/admin/billing/spendreport/", "/admin/tenants/budgetalert/"],
}


def sidebar(web) -> list[dict]:
    page = web.get("/admin/")
    assert page.status_code == 200
    return page.context["sidebar_navigation"]


@pytest.mark.parametrize("role", EXPECTED)
def test_each_role_sees_the_pages_it_may_open_and_each_opens(tenancy, role):
    web = as_user(getattr(tenancy, role))
    groups = sidebar(web)
    assert {group["title"]: [item["title"] for item in group["items"]] for group in groups} == EXPECTED[role]
    for group in groups:
        for item in group["items"]:
            assert web.get(item["link"]).status_code == 200, item["title"]
    for link in LEFT_OUT.get(role, []):
        assert web.get(link).status_code == 403, link


def test_a_signed_in_page_offers_the_dark_theme(tenancy):
    page = as_user(tenancy.owner).get("/admin/dashboard/").content.decode()
    assert 'x-data="theme(' in page  # Unfold's light/dark/auto switch, kept in the browser
    assert "console/console.css" in page


def test_a_list_builds_its_column_headers_once_not_once_a_row(tenancy, monkeypatch):
    """The key list's headers (three query strings a column) are built once per page: Unfold built
    them again for every row, 40% of a 100-row page's CPU."""
    from django.contrib.admin.views.main import ChangeList

    from tenants.services import key_create

    for _ in range(3):
        key_create(tenant=tenancy.tenant, name=unique("row"))
    built = []
    ordering_columns = ChangeList.get_ordering_field_columns  # read once for each time headers are built
    monkeypatch.setattr(ChangeList, "get_ordering_field_columns", lambda cl: built.append(1) or ordering_columns(cl))
    page = as_user(tenancy.owner).get("/admin/tenants/virtualkey/")
    assert page.status_code == 200 and page.context["cl"].result_count == 3
    assert len(built) == 1
