"""The billing management API: spend reports (JSON, CSV, XLSX) and the request log, each scoped to
the tenants the caller holds the right role in."""

from __future__ import annotations

import base64
import csv
import io
from decimal import Decimal
from urllib.parse import urlencode

import httpx
import openpyxl
import pytest
from django.db.models import Sum
from django.test import Client

from billing.models import LedgerEntry
from billing.prices import KIND_COLUMNS
from tests.billing.conftest import DAYS

REPORT = "/api/v1/reports/spend"
RANGE = {"start": DAYS[0].isoformat(), "end": DAYS[-1].isoformat()}
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def as_user(user) -> Client:
    web = Client()
    web.force_login(user)
    return web


def ledger_cost(*tenants) -> Decimal:
    return LedgerEntry.objects.filter(tenant__in=tenants).aggregate(s=Sum("cost_usd"))["s"]


def assert_no_data(response, status: int) -> None:
    assert response.status_code == status, response.content
    assert response["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"detail"}, body


# --- spend report ------------------------------------------------------------------------------


def test_finance_gets_its_tenants_report_as_json(spend_data):
    a, b = spend_data.tenancy.tenant, spend_data.tenancy.other
    body = as_user(spend_data.tenancy.finance).get(REPORT, RANGE).json()

    assert body["tenants"] == [a.slug]
    assert body["group_by"] == ["day", "tenant", "key", "model", "price"]
    assert {row["tenant"]["slug"] for row in body["rows"]} == {a.slug}
    assert Decimal(body["totals"]["cost_usd"]) == ledger_cost(a)
    assert sum(Decimal(row["cost_usd"]) for row in body["rows"]) == ledger_cost(a)
    assert body["totals"]["requests"] == LedgerEntry.objects.filter(tenant=a).count()
    assert b.slug not in str(body)
    priced = next(row for row in body["rows"] if row["price"])
    assert set(priced["price"]) == {
        "id",
        "model",
        "effective_from",
        "input_per_token",
        "output_per_token",
        *KIND_COLUMNS,
    }
    assert body["totals"]["cache_read_tokens"] == sum(
        LedgerEntry.objects.filter(tenant=a).values_list("cache_read_tokens", flat=True)
    )
    assert Decimal(body["totals"]["reasoning_cost_usd"]) == sum(
        LedgerEntry.objects.filter(tenant=a).values_list("reasoning_cost_usd", flat=True)
    )


def test_group_by_and_tenant_filter(spend_data):
    a = spend_data.tenancy.tenant
    body = as_user(spend_data.tenancy.superuser).get(REPORT, {**RANGE, "group_by": "model", "tenant": a.slug}).json()
    assert body["tenants"] == [a.slug]
    assert [(row["model"], row["tenant"], row["day"]) for row in body["rows"]] == [
        ("fast", None, None),
        ("smart", None, None),
    ]
    assert Decimal(body["totals"]["cost_usd"]) == ledger_cost(a)


def test_superuser_sees_every_tenant(spend_data):
    a, b = spend_data.tenancy.tenant, spend_data.tenancy.other
    body = as_user(spend_data.tenancy.superuser).get(REPORT, {**RANGE, "group_by": "tenant"}).json()
    assert {a.slug, b.slug} <= set(body["tenants"])
    by_tenant = {row["tenant"]["slug"]: Decimal(row["cost_usd"]) for row in body["rows"]}
    assert by_tenant[a.slug] == ledger_cost(a)
    assert by_tenant[b.slug] == ledger_cost(b)


def test_finance_of_a_cannot_see_b(spend_data):
    b = spend_data.tenancy.other
    for fmt in ("json", "csv", "xlsx"):
        assert_no_data(as_user(spend_data.tenancy.finance).get(REPORT, {**RANGE, "tenant": b.slug, "format": fmt}), 404)


def test_admin_of_b_sees_only_b(spend_data):
    a, b = spend_data.tenancy.tenant, spend_data.tenancy.other
    outsider = as_user(spend_data.tenancy.outsider)
    assert_no_data(outsider.get(REPORT, {**RANGE, "tenant": a.slug}), 404)
    body = outsider.get(REPORT, RANGE).json()
    assert body["tenants"] == [b.slug]
    assert Decimal(body["totals"]["cost_usd"]) == ledger_cost(b)


@pytest.mark.parametrize("fmt", ["json", "csv", "xlsx"])
def test_a_viewer_can_neither_see_nor_export_spend(spend_data, fmt):
    a = spend_data.tenancy.tenant
    viewer = as_user(spend_data.tenancy.viewer)
    assert_no_data(viewer.get(REPORT, {**RANGE, "format": fmt}), 403)
    assert_no_data(viewer.get(REPORT, {**RANGE, "format": fmt, "tenant": a.slug}), 403)


def test_csv_export(spend_data):
    a = spend_data.tenancy.tenant
    response = as_user(spend_data.tenancy.finance).get(REPORT, {**RANGE, "format": "csv"})
    assert response.status_code == 200
    assert response["content-type"].startswith("text/csv")
    assert response["content-disposition"] == f'attachment; filename="spend-{a.slug}-{DAYS[0]}-{DAYS[-1]}.csv"'
    lines = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert lines[-1]["day"] == "TOTAL"
    assert Decimal(lines[-1]["cost_usd"]) == ledger_cost(a)
    assert sum(Decimal(line["cost_usd"]) for line in lines[:-1]) == ledger_cost(a)


def test_xlsx_export_by_accept_header(spend_data):
    a = spend_data.tenancy.tenant
    response = as_user(spend_data.tenancy.finance).get(REPORT, {**RANGE, "group_by": "key"}, HTTP_ACCEPT=XLSX)
    assert response.status_code == 200
    assert response["content-type"] == XLSX
    sheet = openpyxl.load_workbook(io.BytesIO(response.content))["Spend"]
    rows = list(sheet.iter_rows(values_only=True))
    assert rows[0][:3] == ("key_id", "key_name", "key_prefix")
    cost = rows[0].index("cost_usd")
    assert rows[-1][0] == "TOTAL"
    assert Decimal(str(rows[-1][cost])).quantize(Decimal("0.01")) == ledger_cost(a).quantize(Decimal("0.01"))


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"end": "2026-03-03"}, "start"),
        ({"start": "2026-03-05", "end": "2026-03-01"}, "end"),
        ({"start": "2026-13-01", "end": "2026-03-01"}, "start"),
        ({**RANGE, "group_by": "tenant,planet"}, "group_by"),
        ({**RANGE, "format": "pdf"}, "format"),
        ({"start": "2025-01-01", "end": "2026-03-01"}, "end"),
        ({"end": "2026-03-03", "format": "csv"}, "start"),  # errors are JSON even when a file was asked for
    ],
)
def test_bad_parameters_get_a_json_400(spend_data, params, field):
    response = as_user(spend_data.tenancy.finance).get(REPORT, params)
    assert response.status_code == 400
    assert response["content-type"] == "application/json"
    assert field in response.json()


def test_credentials_are_required(live_db):
    response = Client().get(REPORT, RANGE)
    assert response.status_code == 401
    assert response["www-authenticate"].startswith("Basic")
    assert set(response.json()) == {"detail"}


def test_http_basic_authentication(spend_data):
    finance = spend_data.tenancy.finance
    token = base64.b64encode(f"{finance.username}:{spend_data.tenancy.password}".encode()).decode()
    response = Client().get(REPORT, RANGE, HTTP_AUTHORIZATION=f"Basic {token}")
    assert response.status_code == 200
    assert response.json()["tenants"] == [spend_data.tenancy.tenant.slug]
    wrong = base64.b64encode(f"{finance.username}:wrong".encode()).decode()
    assert Client().get(REPORT, RANGE, HTTP_AUTHORIZATION=f"Basic {wrong}").status_code == 401


def test_report_through_a_running_gateway(spend_data, gateway):
    """The management API served by the real ASGI process, HTTP Basic as a script would use it."""
    finance = spend_data.tenancy.finance
    response = httpx.get(
        gateway.url + REPORT,
        params={**RANGE, "format": "csv"},
        auth=(finance.username, spend_data.tenancy.password),
        timeout=30,
    )
    assert response.status_code == 200
    lines = list(csv.DictReader(io.StringIO(response.text)))
    assert Decimal(lines[-1]["cost_usd"]) == ledger_cost(spend_data.tenancy.tenant)


def test_unknown_api_url_is_a_json_404(live_db):
    response = Client().get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert response["content-type"] == "application/json"
    assert "Unknown API URL" in response.json()["detail"]


# --- request log -------------------------------------------------------------------------------


def log_url(tenant) -> str:
    return f"/api/v1/tenants/{tenant.slug}/requests"


def test_tenant_admin_pages_through_the_request_log(spend_data):
    a = spend_data.tenancy.tenant
    owner = as_user(spend_data.tenancy.owner)
    seen, url, params = [], log_url(a), {"limit": 10}
    while url:
        body = owner.get(url, params).json()
        assert len(body["results"]) <= 10
        seen.extend(body["results"])
        url, params = body["next"], None
    assert len(seen) == len({row["id"] for row in seen}) == LedgerEntry.objects.filter(tenant=a).count()
    assert {row["id"] for row in seen} == {
        str(i) for i in LedgerEntry.objects.filter(tenant=a).values_list("id", flat=True)
    }
    stamps = [row["created_at"] for row in seen]
    assert stamps == sorted(stamps, reverse=True)
    keyed = next(row for row in seen if row["key"])
    assert set(keyed["key"]) == {"id", "name", "prefix"}


@pytest.mark.parametrize(
    "position", ["2026", "2026-13-45T00:00:00", "x' or 1=1 --", "9" * 5000, "2026-12-01T00:00:00\u0661"]
)
def test_a_forged_cursor_is_a_404_and_a_real_one_pages(spend_data, position):
    """A cursor is base64 the client holds: DRF put its position into the query as given, and a
    position that is no time was a 500. Now an invalid cursor, as DRF calls any cursor it cannot read."""
    owner = as_user(spend_data.tenancy.owner)
    url = log_url(spend_data.tenancy.tenant)
    forged = base64.b64encode(urlencode({"p": position}).encode()).decode()
    refused = owner.get(url, {"cursor": forged})
    assert (refused.status_code, refused.json()) == (404, {"detail": "Invalid cursor"})
    following = owner.get(owner.get(url, {"limit": 1}).json()["next"])
    assert following.status_code == 200 and len(following.json()["results"]) == 1


def test_request_log_filters(spend_data):
    a = spend_data.tenancy.tenant
    key = spend_data.keys_a[0]
    params = {"start": DAYS[1], "end": DAYS[1], "status": 200, "model": "fast", "cache": "miss", "key": key.pk}
    rows = as_user(spend_data.tenancy.owner).get(log_url(a), {**params, "limit": 500}).json()["results"]
    assert rows
    assert {(r["status_code"], r["model_requested"], r["cache_tier"], r["key"]["id"]) for r in rows} == {
        (200, "fast", "miss", key.pk)
    }
    assert {r["created_at"][:10] for r in rows} == {DAYS[1].isoformat()}
    expected = LedgerEntry.objects.filter(
        tenant=a, status_code=200, model_requested="fast", cache_tier="miss", key=key, created_at__date=DAYS[1]
    )
    assert len(rows) == expected.count()


@pytest.mark.parametrize(("params", "field"), [({"status": "abc"}, "status"), ({"cache": "warm"}, "cache")])
def test_request_log_bad_filters_get_a_json_400(spend_data, params, field):
    response = as_user(spend_data.tenancy.owner).get(log_url(spend_data.tenancy.tenant), params)
    assert response.status_code == 400
    assert field in response.json()


def test_request_log_is_for_the_tenant_s_admins_only(spend_data):
    t = spend_data.tenancy
    assert_no_data(as_user(t.finance).get(log_url(t.tenant)), 403)
    assert_no_data(as_user(t.viewer).get(log_url(t.tenant)), 403)
    assert_no_data(as_user(t.outsider).get(log_url(t.tenant)), 404)
    assert_no_data(as_user(t.owner).get(log_url(t.other)), 404)
    assert_no_data(as_user(t.owner).get("/api/v1/tenants/no-such-tenant/requests"), 404)
    assert as_user(t.outsider).get(log_url(t.other)).json()["results"]
    assert as_user(t.superuser).get(log_url(t.tenant)).status_code == 200
    assert Client().get(log_url(t.tenant)).status_code == 401
