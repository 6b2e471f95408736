"""CSV and XLSX exports open with the standard readers (csv, openpyxl) and match the ledger."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

import openpyxl
import pytest
from django.db.models import Count, Sum

from billing.exports import report_csv, report_xlsx
from billing.models import LedgerEntry
from billing.selectors import DIMENSIONS, spend_report
from billing.services import spend_roll_up
from tests.billing.conftest import DAYS

CENT = Decimal("0.01")


def ledger_for(line: dict, tenants) -> dict:
    """The ledger's sums for the filter one exported line stands for."""
    filters = {"tenant__in": tenants}
    if line["day"] == "TOTAL":
        start, end = DAYS[0], DAYS[-1]
    else:
        start = end = line["day"] if isinstance(line["day"], date) else date.fromisoformat(line["day"])
        filters["tenant__slug"] = line["tenant"]
        filters["key"] = int(line["key_id"]) if line["key_id"] not in ("", None) else None
        filters["model_requested"] = line["model"]
        filters["price"] = int(line["price_id"]) if line["price_id"] not in ("", None) else None
    filters["created_at__gte"] = datetime.combine(start, time.min, tzinfo=UTC)
    filters["created_at__lt"] = datetime.combine(end, time.min, tzinfo=UTC) + timedelta(days=1)
    return LedgerEntry.objects.filter(**filters).aggregate(
        requests=Count("id"),
        cost=Sum("cost_usd"),
        saved=Sum("saved_cost_usd"),
        prompt=Sum("prompt_tokens"),
        images=Sum("images"),
    )


@pytest.mark.parametrize("rolled_up", [False, True])
def test_csv_opens_with_the_csv_module_and_matches_the_ledger_exactly(spend_data, rolled_up):
    tenants = [spend_data.tenancy.tenant, spend_data.tenancy.other]
    if rolled_up:
        spend_roll_up()
    report = spend_report(tenants=tenants, start=DAYS[0], end=DAYS[-1], group_by=list(DIMENSIONS))

    lines = list(csv.DictReader(io.StringIO(report_csv(report).decode())))

    assert len(lines) == len(report.rows) + 1
    assert lines[-1]["day"] == "TOTAL"
    for line in lines:
        expected = ledger_for(line, tenants)
        assert int(line["requests"]) == expected["requests"], line
        assert Decimal(line["cost_usd"]) == expected["cost"], line
        assert Decimal(line["saved_cost_usd"]) == expected["saved"], line
        assert int(line["prompt_tokens"]) == expected["prompt"], line
        assert int(line["images"]) == expected["images"], line
    assert int(lines[-1]["images"]) > 0  # the data has images to count


def test_xlsx_opens_with_openpyxl_and_matches_the_ledger_to_the_cent(spend_data):
    tenants = [spend_data.tenancy.tenant, spend_data.tenancy.other]
    report = spend_report(tenants=tenants, start=DAYS[0], end=DAYS[-1], group_by=list(DIMENSIONS))

    workbook = openpyxl.load_workbook(io.BytesIO(report_xlsx(report)))
    sheet = workbook["Spend"]
    header, *rows = [[cell.value for cell in row] for row in sheet.iter_rows()]

    assert header[:3] == ["day", "tenant", "tenant_name"]
    assert len(rows) == len(report.rows) + 1
    assert rows[-1][0] == "TOTAL"
    for values in rows:
        line = dict(zip(header, values, strict=True))
        if isinstance(line["day"], datetime):
            line["day"] = line["day"].date()
        expected = ledger_for(line, tenants)
        assert line["requests"] == expected["requests"]
        assert Decimal(str(line["cost_usd"])).quantize(CENT) == expected["cost"].quantize(CENT)
        assert Decimal(str(line["saved_cost_usd"])).quantize(CENT) == expected["saved"].quantize(CENT)
    assert workbook["About"]["B1"].value == f"{DAYS[0]} to {DAYS[-1]} (UTC days, inclusive)"


def test_totals_only_export(spend_data):
    b = spend_data.tenancy.other
    report = spend_report(tenants=[b], start=DAYS[0], end=DAYS[-1], group_by=[])
    (line,) = list(csv.DictReader(io.StringIO(report_csv(report).decode())))
    assert Decimal(line["cost_usd"]) == LedgerEntry.objects.filter(tenant=b).aggregate(s=Sum("cost_usd"))["s"]
