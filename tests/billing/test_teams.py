"""Spend by team (#21 point 1): the spend report groups by team and narrows to one (selectors, CSV,
the management API, the console page), each request counted for the team its key was in when it was
made; a team's members see their own team's spend and no other team's."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from billing.exports import report_csv
from billing.models import LedgerEntry
from billing.selectors import spend_report
from tenants.audit import AuditEntry
from tenants.models import Team
from tenants.services import key_create, team_membership_save
from tests.conftest import unique
from tests.console.conftest import as_user

TODAY = datetime.now(UTC).date()


@pytest.fixture
def spend(tenancy):
    """Tenant A's teams search and support and a key of none, with requests of $1, $2 and $4; a
    key that moved from support to search keeps its earlier $8 in support. Tenant B spends $16."""
    tenant = tenancy.tenant
    search = Team.objects.create(tenant=tenant, name="search")
    support = Team.objects.create(tenant=tenant, name="support")
    moved, _ = key_create(tenant=tenant, name="moved", team=search)
    now = datetime.now(UTC)
    rows = [
        (tenant, key_create(tenant=tenant, name="s", team=search)[0], search, "1"),
        (tenant, key_create(tenant=tenant, name="u", team=support)[0], support, "2"),
        (tenant, key_create(tenant=tenant, name="n")[0], None, "4"),
        (tenant, moved, support, "8"),
        (tenancy.other, key_create(tenant=tenancy.other, name="b")[0], None, "16"),
    ]
    for i, (owner, key, team, cost) in enumerate(rows):
        LedgerEntry.objects.create(
            request_id=unique("req"),
            created_at=now - timedelta(seconds=i),
            tenant=owner,
            key=key,
            team=team,
            model_requested="m",
            status_code=200,
            cost_usd=Decimal(cost),
        )
    return tenancy, search, support


def test_the_report_groups_by_team_and_narrows_to_one(spend):
    tenancy, search, support = spend
    report = spend_report(tenants=[tenancy.tenant], start=TODAY, end=TODAY, group_by=["team"])
    assert [(r.team.name if r.team else None, r.metrics["cost_usd"]) for r in report.rows] == [
        (None, Decimal("4")),
        ("search", Decimal("1")),
        ("support", Decimal("10")),  # the moved key's earlier request stays with support
    ]
    assert report.totals.metrics["cost_usd"] == Decimal("15")
    lines = list(csv.DictReader(io.StringIO(report_csv(report).decode())))
    assert [(line["team_id"], line["team"], line["cost_usd"]) for line in lines][:3] == [
        ("", "", "4.0000000000"),
        (str(search.pk), "search", "1.0000000000"),
        (str(support.pk), "support", "10.0000000000"),
    ]
    one = spend_report(tenants=[tenancy.tenant], start=TODAY, end=TODAY, group_by=["key"], team_ids=[support.pk])
    assert sorted((r.key.name, r.metrics["cost_usd"]) for r in one.rows) == [
        ("moved", Decimal("8")),
        ("u", Decimal("2")),
    ]


def api(web, **params):
    return web.get("/api/v1/reports/spend", {"start": TODAY, "end": TODAY, **params})


def test_the_api_groups_by_team_and_refuses_another_tenants_team(spend):
    tenancy, search, support = spend
    web = as_user(tenancy.finance)
    body = api(web, group_by="team").json()
    assert [(row["team"], row["cost_usd"]) for row in body["rows"]] == [
        (None, "4.0000000000"),
        ({"id": search.pk, "name": "search"}, "1.0000000000"),
        ({"id": support.pk, "name": "support"}, "10.0000000000"),
    ]
    assert api(web, team=support.pk, group_by="").json()["totals"]["cost_usd"] == "10.0000000000"
    # Tenant B's admin: A's team is not theirs, a 404 that says nothing about it.
    refused = api(as_user(tenancy.outsider), team=support.pk)
    assert (refused.status_code, refused.json()) == (404, {"detail": "No such team in your tenants."})
    assert api(web, team="x").status_code == 400


def test_a_team_member_sees_only_their_teams_spend_on_the_report_page(spend):
    tenancy, search, support = spend
    lead = get_user_model().objects.create_user(unique("lead"), password=tenancy.password, is_staff=True)
    team_membership_save(team=search, user=lead, role="admin")
    web = as_user(lead)
    page = reverse("admin:billing_spendreport_changelist")
    query = {"start": TODAY, "end": TODAY, "group_by": ["team", "key"]}
    response = web.get(page, query)
    assert response.status_code == 200
    report = response.context["report"]
    assert [(r.team.name, r.key.name, r.metrics["cost_usd"]) for r in report.rows] == [("search", "s", Decimal("1"))]
    assert [team.pk for team in response.context["form"].fields["team"].queryset] == [search.pk]
    # Another team is not a choice: the form refuses it and no report is made.
    refused = web.get(page, {**query, "team": support.pk})
    assert refused.context["report"] is None and "team" in refused.context["form"].errors
    # Its export: its team's rows alone, and the download is in the tenant's audit log.
    exported = web.get(page, {**query, "format": "csv"})
    lines = list(csv.DictReader(io.StringIO(exported.content.decode())))
    assert [(line["team_id"], line["team"], line["key_name"], line["cost_usd"]) for line in lines] == [
        (str(search.pk), "search", "s", "1.0000000000"),
        ("TOTAL", "", "", "1.0000000000"),
    ]
    assert AuditEntry.objects.filter(tenant=tenancy.tenant, actor=lead, action="export.downloaded").count() == 1


def test_the_dashboard_shows_each_teams_spend_against_its_budgets(spend):
    from tenants.models import Budget

    tenancy, search, _ = spend
    Budget.objects.create(tenant=tenancy.tenant, team=search, period="daily", limit_usd=Decimal("4"))
    Budget.objects.create(tenant=tenancy.tenant, period="monthly", limit_usd=Decimal("100"))
    page = as_user(tenancy.finance).get(reverse("admin:dashboard"))
    assert page.status_code == 200
    data = page.context["data"]
    assert [(line.team.name, line.today, line.month, line.daily_budget) for line in data.team_spend] == [
        ("support", Decimal("10"), Decimal("10"), None),
        ("search", Decimal("1"), Decimal("1"), Decimal("4")),
    ]
    assert data.team_spend[1].today_used == 0.25
    assert 'id="team-spend-table"' in page.content.decode()
    # The tenant's own line counts its monthly budget, not the team's daily one as the tenant's.
    (line,) = [line for line in data.spend if line.tenant == tenancy.tenant]
    assert (line.daily_budget, line.monthly_budget) == (None, Decimal("100"))


HOSTILE_TEAMS = ["0", "-1", "1.5", "x", "9" * 30, "1\x00", "1\r\n2", "\u0661", " 1", "1" * 5000]


@pytest.mark.parametrize("value", HOSTILE_TEAMS)
def test_a_hostile_team_parameter_is_a_400_on_the_api_and_selects_nothing_in_the_console(spend, value):
    """Zero, negatives, decimals, words, numbers past bigint, NUL and line breaks, other digits (an
    Arabic-Indic one), padding, 5,000 digits: the API answers 400 naming `team`; the console's list
    filters by team select no row, the request log's status filter ignores it, and the report page's
    form names the field (NUL: a 400 on every console page). Never a 500, and nothing is exported or
    audited."""
    tenancy = spend[0]
    finance, owner = as_user(tenancy.finance), as_user(tenancy.owner)
    audited = AuditEntry.objects.count()
    refused = api(finance, team=value)
    assert refused.status_code == 400, value
    assert list(refused.json()) == ["team"]
    log = owner.get(f"/api/v1/tenants/{tenancy.tenant.slug}/requests", {"key": value})
    assert (log.status_code, list(log.json())) == (400, ["key"]), value
    if "\x00" in value:  # refused before any console page reads it (sentinel.middleware)
        for page in ("admin:tenants_virtualkey_changelist", "admin:billing_spendreport_changelist"):
            assert owner.get(reverse(page), {"team": value}).status_code == 400, page
        assert AuditEntry.objects.count() == audited
        return
    for page in ("admin:tenants_virtualkey_changelist", "admin:billing_ledgerentry_changelist"):
        listed = owner.get(reverse(page), {"team": value})
        assert listed.status_code == 200, (page, value)
        assert listed.context["cl"].result_count == 0, (page, value)
    # The request log's status filter ignores what is not a number; its tenant filter selects nothing.
    everything = owner.get(reverse("admin:billing_ledgerentry_changelist")).context["cl"].result_count
    for param, count in (("status_code__exact", everything), ("tenant", 0)):
        listed = owner.get(reverse("admin:billing_ledgerentry_changelist"), {param: value})
        assert (listed.status_code, listed.context["cl"].result_count) == (200, count), (param, value)
    report = finance.get(
        reverse("admin:billing_spendreport_changelist"),
        {"start": TODAY, "end": TODAY, "group_by": "team", "team": value, "format": "csv"},
    )
    assert report.status_code == 200
    assert report["Content-Type"].startswith("text/html")  # the page with its form error, no download
    assert report.context["report"] is None and "team" in report.context["form"].errors
    assert AuditEntry.objects.count() == audited
