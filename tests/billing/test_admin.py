"""Billing in the admin: the spend report page (scoped, exportable by finance, not by viewers), price
edits that never rewrite history, and the read-only ledger."""

from __future__ import annotations

import csv
import hashlib
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import openpyxl
import pytest
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from billing.ledger import STREAM
from billing.models import LedgerDeadLetter, LedgerEntry, Price
from sentinel.redis_clients import sync_redis
from tests.billing.conftest import DAYS, drain_all, hand_off_all, record
from tests.conftest import unique

PAGE = "/admin/billing/spendreport/"
RANGE = {"start": DAYS[0].isoformat(), "end": DAYS[-1].isoformat()}


def as_user(user) -> Client:
    web = Client()
    web.force_login(user)
    return web


def ledger_cost(tenant) -> Decimal:
    return LedgerEntry.objects.filter(tenant=tenant).aggregate(s=Sum("cost_usd"))["s"]


# --- spend report page -------------------------------------------------------------------------


def test_finance_finds_the_report_and_sees_its_tenant_only(spend_data):
    t = spend_data.tenancy
    finance = as_user(t.finance)
    assert PAGE in finance.get("/admin/").content.decode()

    page = finance.get(PAGE, {**RANGE, "group_by": ["tenant", "model"]})
    assert page.status_code == 200
    html = page.content.decode()
    assert t.tenant.slug in html
    assert t.other.slug not in html
    total = dict(zip(page.context["columns"], page.context["rows"][-1], strict=True))
    assert total["tenant"] == "TOTAL"
    assert Decimal(total["cost_usd"]) == ledger_cost(t.tenant)
    assert "Download CSV" in html

    # By end user (#21): read from the ledger; these requests named none.
    by_user = finance.get(PAGE, {**RANGE, "group_by": ["end_user"]})
    assert by_user.context["labels"][0] == "end user"
    rows = [dict(zip(by_user.context["columns"], row, strict=True)) for row in by_user.context["rows"]]
    assert [row["end_user"] for row in rows] == ["", "TOTAL"]
    assert Decimal(rows[0]["cost_usd"]) == Decimal(rows[1]["cost_usd"]) == ledger_cost(t.tenant)


def test_the_reports_table_escapes_what_apps_named_and_marks_the_totals(spend_data):
    """The table's rows are built in Python (billing/admin.py, table_body): every cell escaped, one
    row per group, the last one the totals."""
    t = spend_data.tenancy
    hostile = '<img src=x onerror="alert(1)">&amp;'
    entry = LedgerEntry.objects.create(
        request_id="escape-me",
        created_at=datetime.combine(DAYS[0], datetime.min.time(), tzinfo=UTC) + timedelta(hours=1),
        tenant=t.tenant,
        model_requested="gpt-4o-mini",
        status_code=200,
        cost_usd=Decimal("0.5"),
        end_user=hostile,
    )
    try:
        page = as_user(t.finance).get(PAGE, {**RANGE, "group_by": ["end_user"]})
        html = page.content.decode()
        body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
        assert "<img" not in body
        assert "<td>&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp;</td>" in body
        assert body.count("<tr") == len(page.context["rows"]) == 3  # no user, the hostile one, the totals
        assert body.count('<tr class="total"><td>TOTAL</td>') == 1 and body.endswith("</tr>")
    finally:
        entry.delete()


def test_finance_cannot_pick_another_tenant(spend_data):
    t = spend_data.tenancy
    page = as_user(t.finance).get(PAGE, {**RANGE, "tenant": t.other.slug})
    assert page.status_code == 200
    assert page.context["report"] is None
    assert "tenant" in page.context["form"].errors
    assert t.other.slug not in page.content.decode()
    export = as_user(t.finance).get(PAGE, {**RANGE, "tenant": t.other.slug, "format": "csv"})
    assert "attachment" not in export.get("content-disposition", "")


def test_finance_downloads_csv_and_xlsx(spend_data):
    t = spend_data.tenancy
    finance = as_user(t.finance)
    response = finance.get(PAGE, {**RANGE, "format": "csv", "group_by": ["day", "key"]})
    assert response["content-disposition"].startswith("attachment;")
    lines = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert list(lines[0])[:2] == ["day", "key_id"]
    assert Decimal(lines[-1]["cost_usd"]) == ledger_cost(t.tenant)

    response = finance.get(PAGE, {**RANGE, "format": "xlsx", "tenant": t.tenant.slug, "group_by": ["model"]})
    sheet = openpyxl.load_workbook(io.BytesIO(response.content))["Spend"]
    rows = list(sheet.iter_rows(values_only=True))
    cost = rows[0].index("cost_usd")
    assert [row[0] for row in rows[1:]] == ["fast", "smart", "TOTAL"]
    assert round(Decimal(str(rows[-1][cost])), 2) == round(ledger_cost(t.tenant), 2)


def test_a_viewer_can_neither_open_nor_export_the_report(spend_data):
    viewer = as_user(spend_data.tenancy.viewer)
    assert PAGE not in viewer.get("/admin/").content.decode()
    assert viewer.get(PAGE, RANGE).status_code == 403
    response = viewer.get(PAGE, {**RANGE, "format": "csv"})
    assert response.status_code == 403
    assert "attachment" not in response.get("content-disposition", "")


def test_the_superuser_sees_every_tenant(spend_data):
    t = spend_data.tenancy
    html = as_user(t.superuser).get(PAGE, {**RANGE, "group_by": ["tenant"]}).content.decode()
    assert t.tenant.slug in html
    assert t.other.slug in html


# --- prices ------------------------------------------------------------------------------------


def price_form(price: Price, **changes) -> dict:
    moment = changes.pop("effective_from", price.effective_from)
    return {
        "model": changes.pop("model", price.model),
        "input_per_token": changes.pop("input_per_token", price.input_per_token),
        "output_per_token": changes.pop("output_per_token", price.output_per_token),
        "effective_from_0": moment.strftime("%Y-%m-%d"),
        "effective_from_1": moment.strftime("%H:%M:%S"),
    }


def billed_price(tenant) -> Price:
    price = Price.objects.create(
        model=unique("admin-price"),
        input_per_token=Decimal("0.000001"),
        output_per_token=Decimal("0.000002"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
    )
    hand_off_all([record(tenant, price_id=price.pk, at=datetime(2026, 2, 1, tzinfo=UTC))])
    drain_all()
    return price


def test_editing_a_billed_price_saves_a_new_version(tenancy, empty_queue):
    price = billed_price(tenancy.tenant)
    admin = as_user(tenancy.superuser)
    response = admin.post(
        f"/admin/billing/price/{price.pk}/change/", price_form(price, input_per_token="0.000009"), follow=True
    )
    assert response.status_code == 200
    assert "new version" in response.content.decode()

    old, new = Price.objects.filter(model=price.model).order_by("effective_from")
    assert (old.pk, old.input_per_token, old.effective_from) == (price.pk, Decimal("0.000001"), price.effective_from)
    assert new.input_per_token == Decimal("0.000009")
    assert timezone.now() - new.effective_from < timedelta(seconds=10)
    assert LedgerEntry.objects.get(price__model=price.model).price_id == old.pk


def test_an_unbilled_price_is_edited_in_place(tenancy):
    price = Price.objects.create(model=unique("unbilled"), input_per_token=1, output_per_token=2)
    admin = as_user(tenancy.superuser)
    admin.post(f"/admin/billing/price/{price.pk}/change/", price_form(price, output_per_token="3"))
    (only,) = Price.objects.filter(model=price.model)
    assert (only.pk, only.output_per_token) == (price.pk, Decimal("3"))


def test_a_new_price_cannot_reach_back_over_billed_requests(tenancy, empty_queue):
    price = billed_price(tenancy.tenant)
    admin = as_user(tenancy.superuser)
    response = admin.post(
        "/admin/billing/price/add/",
        price_form(price, input_per_token="5", effective_from=datetime(2026, 1, 20, tzinfo=UTC)),
    )
    assert response.status_code == 200  # the form again, with the error
    assert "already billed" in response.content.decode()
    assert Price.objects.filter(model=price.model).count() == 1


def test_a_billed_price_cannot_be_deleted(tenancy, empty_queue):
    price = billed_price(tenancy.tenant)
    admin = as_user(tenancy.superuser)
    assert admin.post(f"/admin/billing/price/{price.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Price.objects.filter(pk=price.pk).exists()


def test_the_ledger_is_read_only(spend_data):
    entry = LedgerEntry.objects.filter(tenant=spend_data.tenancy.tenant).first()
    admin = as_user(spend_data.tenancy.superuser)
    before = (entry.cost_usd, entry.status_code)
    assert admin.post(f"/admin/billing/ledgerentry/{entry.pk}/change/", {"cost_usd": "0"}).status_code == 403
    assert admin.post(f"/admin/billing/ledgerentry/{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    entry.refresh_from_db()
    assert (entry.cost_usd, entry.status_code) == before


# --- ledger dead letters ---------------------------------------------------------------------------

DEAD_LETTERS = "/admin/billing/ledgerdeadletter/"


@pytest.fixture
def dead_letters(tenancy, empty_queue) -> dict:
    """Records the database refused, set aside by a real drain: one of tenant A (markup and a NUL in
    it), one of B, and one naming no tenant (bytes that are not UTF-8, markup, a NUL, a terminal escape)."""
    a = record(tenancy.tenant, request_id=unique("dl-a"), model="<script>alert(1)</script>\x00")
    b = record(tenancy.other, request_id=unique("dl-b"), status=70000)
    stray = b"\xff\xfe<b>bold</b>\x00\x1b[31m " + unique("stray").encode()
    client = sync_redis()
    for raw in (a.encode(), b.encode(), stray):
        client.xadd(STREAM, {"r": raw})
    drain_all()
    return {
        name: LedgerDeadLetter.objects.get(digest=hashlib.sha256(raw).hexdigest())
        for name, raw in (("a", a.encode()), ("b", b.encode()), ("stray", stray))
    }


def listed(response) -> set[int]:
    assert response.status_code == 200, response.status_code
    return {letter.pk for letter in response.context["cl"].result_list}


def test_finance_and_admins_see_their_tenants_dead_letters_operators_all(tenancy, dead_letters):
    a, b, stray = (dead_letters[name].pk for name in ("a", "b", "stray"))
    assert listed(as_user(tenancy.finance).get(DEAD_LETTERS)) & {a, b, stray} == {a}
    assert listed(as_user(tenancy.owner).get(DEAD_LETTERS)) & {a, b, stray} == {a}
    assert listed(as_user(tenancy.outsider).get(DEAD_LETTERS)) & {a, b, stray} == {b}
    assert listed(as_user(tenancy.superuser).get(DEAD_LETTERS)) >= {a, b, stray}
    assert as_user(tenancy.viewer).get(DEAD_LETTERS).status_code == 403
    finance = as_user(tenancy.finance)
    assert DEAD_LETTERS in finance.get("/admin/").content.decode()
    assert finance.get(f"{DEAD_LETTERS}{b}/change/").status_code == 404
    assert finance.get(f"{DEAD_LETTERS}{stray}/change/").status_code == 404


def test_a_dead_letter_shows_when_whose_why_and_the_record_escaped(tenancy, dead_letters):
    letter = dead_letters["a"]
    page = as_user(tenancy.finance).get(f"{DEAD_LETTERS}{letter.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert tenancy.tenant.name in html
    assert letter.request_id in html
    assert "refused by psycopg: PostgreSQL text fields cannot contain NUL (0x00) bytes" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\u0000" in html
    assert "<script>alert" not in html
    assert "\x00" not in html

    stray = as_user(tenancy.superuser).get(f"{DEAD_LETTERS}{dead_letters['stray'].pk}/change/").content.decode()
    assert "\\xff\\xfe&lt;b&gt;bold&lt;/b&gt;\\x00\\x1b[31m" in stray
    assert "not a ledger record: not JSON" in stray
    assert "\x00" not in stray and "\x1b" not in stray

    listing = as_user(tenancy.superuser).get(DEAD_LETTERS, {"q": letter.request_id}).content.decode()
    assert "&lt;script&gt;" in listing and "<script>alert" not in listing


def test_dead_letters_are_read_only(tenancy, dead_letters):
    letter = dead_letters["a"]
    root = as_user(tenancy.superuser)
    assert root.post(f"{DEAD_LETTERS}{letter.pk}/change/", {"reason": "fine"}).status_code == 403
    assert root.post(f"{DEAD_LETTERS}{letter.pk}/delete/", {"post": "yes"}).status_code == 403
    assert root.get(f"{DEAD_LETTERS}add/").status_code == 403
    letter.refresh_from_db()
    assert letter.reason == "refused by psycopg: PostgreSQL text fields cannot contain NUL (0x00) bytes"


def test_the_report_with_every_grouping_reads_in_words_and_scrolls_inside_the_page(spend_data):
    """Grouped every way, the table was 2,432 px wide under headings like INPUT_USD_PER_TOKEN; its
    headings are words now, and it scrolls inside its own box. Exports keep the column names."""
    t = spend_data.tenancy
    every = ["day", "tenant", "key", "model", "price"]
    page = as_user(t.finance).get(PAGE, {**RANGE, "group_by": every})
    html = page.content.decode()
    headings = page.context["labels"]
    assert len(headings) == len(page.context["columns"]) == 34  # 20, 7 kinds of price, 6 of tokens and cost, images
    assert not any("_" in heading for heading in headings)
    assert "input $/token" in headings and '<th scope="col">cost $</th>' in html
    # Headings wrap and the table scrolls inside its card (console.css: .console-page th, .table-wrap).
    assert '<div class="table-wrap">\n    <table id="spend-report">' in html
    csv_head = as_user(t.finance).get(PAGE, {**RANGE, "group_by": every, "format": "csv"})
    assert b"input_usd_per_token" in b"".join(csv_head.streaming_content if csv_head.streaming else [csv_head.content])


# --- the request log ---------------------------------------------------------------------------

LOG = "/admin/billing/ledgerentry/"


def test_finance_filters_the_request_log_and_downloads_exactly_what_it_shows(spend_data):
    """Finance reads its tenant's requests (not the other tenant's), filters them by key and model,
    and the CSV and XLSX downloads hold exactly the filtered rows, with the ledger's exact costs. A
    viewer (no money) gets neither."""
    import csv
    import io

    from openpyxl import load_workbook

    t = spend_data.tenancy
    finance = as_user(t.finance)
    key = spend_data.keys_a[0]
    mine = LedgerEntry.objects.filter(tenant=t.tenant)
    model = mine.values_list("model_requested", flat=True).first()
    wanted = mine.filter(key=key, model_requested=model)
    assert 0 < wanted.count() < mine.count()

    page = finance.get(LOG, {"key__id__exact": key.pk, "model_requested": model})
    assert page.status_code == 200
    assert page.context["cl"].result_count == wanted.count()
    html = page.content.decode()
    assert 'id="export-csv"' in html and t.other.slug not in html

    query = {"key__id__exact": key.pk, "model_requested": model}
    csv_answer = finance.get(f"{LOG}export/", {**query, "format": "csv"})
    assert csv_answer.status_code == 200 and csv_answer.streaming
    assert "attachment" in csv_answer["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(csv_answer.streaming_content).decode())))
    assert sorted(r["request_id"] for r in rows) == sorted(wanted.values_list("request_id", flat=True))
    assert {r["tenant"] for r in rows} == {t.tenant.slug} and {r["key_name"] for r in rows} == {key.name}
    assert sum(Decimal(r["cost_usd"]) for r in rows) == wanted.aggregate(s=Sum("cost_usd"))["s"]

    xlsx_answer = finance.get(f"{LOG}export/", {**query, "format": "xlsx"})
    sheet = load_workbook(io.BytesIO(b"".join(xlsx_answer.streaming_content))).active
    (header, *cells) = list(sheet.values)
    assert header[1] == "request_id" and len(cells) == wanted.count()

    everything = finance.get(f"{LOG}export/", {"format": "csv"})
    all_rows = list(csv.DictReader(io.StringIO(b"".join(everything.streaming_content).decode())))
    assert len(all_rows) == mine.count() and {r["tenant"] for r in all_rows} == {t.tenant.slug}

    viewer = as_user(t.viewer)
    assert viewer.get(LOG).status_code == 403
    assert viewer.get(f"{LOG}export/", {"format": "csv"}).status_code == 403


def test_the_request_log_filters_by_utc_days_and_reads_the_ledger_only_for_its_rows(spend_data):
    """A day range includes its last day whole; the filters' choices come from small tables, never
    from a DISTINCT over the ledger (seconds at a million rows), and the ledger is counted once."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    t = spend_data.tenancy
    day = DAYS[1]
    wanted = [
        e
        for e in LedgerEntry.objects.filter(tenant=t.tenant, status_code=200)
        if e.created_at.astimezone(UTC).date() == day
    ]
    assert 0 < len(wanted) < LedgerEntry.objects.filter(tenant=t.tenant).count()
    with CaptureQueriesContext(connection) as queries:
        page = as_user(t.finance).get(
            LOG, {"created_at_from": day.isoformat(), "created_at_to": day.isoformat(), "status_code__exact": "200"}
        )
    assert page.status_code == 200 and page.context["cl"].result_count == len(wanted)
    ledger_reads = [q["sql"] for q in queries.captured_queries if "billing_ledgerentry" in q["sql"]]
    assert len(ledger_reads) == 2  # the count of the filtered rows and their page
    assert not [sql for sql in ledger_reads if "DISTINCT" in sql]


def test_the_request_log_finds_a_request_by_its_whole_id_only(spend_data):
    """The search is the exact request id (on its index): a part of one, or one in another case, is not
    a search a ledger of millions of rows can answer, and finds nothing."""
    t = spend_data.tenancy
    entry = LedgerEntry.objects.filter(tenant=t.tenant).first()
    finance = as_user(t.finance)

    def found(term: str) -> list[str]:
        return [e.request_id for e in finance.get(LOG, {"q": term}).context["cl"].result_list]

    assert (
        found(entry.request_id)
        == [entry.request_id] * LedgerEntry.objects.filter(tenant=t.tenant, request_id=entry.request_id).count()
    )
    assert found(f"  {entry.request_id} ") == found(entry.request_id)  # pasted with spaces
    assert found(entry.request_id[1:]) == []  # (its last character dropped may be another whole id: spend-60, spend-6)
    assert found(entry.request_id.swapcase()) == []


def test_the_request_log_counts_its_rows_only_up_to_a_cap(spend_data, monkeypatch):
    """Past the cap the list says "more than" instead of counting every row of a big ledger."""
    from sentinel.console.scoping import CappedCountPaginator

    finance = as_user(spend_data.tenancy.finance)
    mine = LedgerEntry.objects.filter(tenant=spend_data.tenancy.tenant).count()
    assert finance.get(LOG).context["cl"].result_count == mine  # under the cap: exact
    monkeypatch.setattr(CappedCountPaginator, "CAP", mine - 1)
    page = finance.get(LOG)
    assert page.context["cl"].result_count == mine  # counted to the cap and one more
    assert f"more than {mine - 1}" in " ".join(page.content.decode().split())
    monkeypatch.setattr(CappedCountPaginator, "CAP", mine)
    assert "more than" not in as_user(spend_data.tenancy.finance).get(LOG).content.decode()


# --- monthly statements ---------------------------------------------------------------------------

STATEMENT = "/admin/billing/spendreport/statement/"


def test_a_monthly_statement_reconciles_with_the_ledger_to_the_last_decimal(spend_data):
    """Finance downloads its tenant's statement for March 2026 as CSV and PDF: every line is a key
    and model's sum, the total is the sum of that month's ledger rows exactly (and to the cent on
    the PDF). Another tenant's statement, a viewer, or a bad month get nothing."""
    import csv
    import io

    from pypdf import PdfReader

    t = spend_data.tenancy
    finance = as_user(t.finance)
    ledger = ledger_cost(t.tenant)  # every row of spend_data is in March 2026
    assert ledger > 0

    answer = finance.get(STATEMENT, {"tenant": t.tenant.slug, "month": "2026-03", "format": "csv"})
    assert answer.status_code == 200
    assert f"statement-{t.tenant.slug}-2026-03.csv" in answer["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(answer.content.decode())))
    assert rows[0] == ["tenant", t.tenant.slug, "period", "2026-03-01", "2026-03-31"]
    lines = rows[2:-2]
    assert sum(Decimal(line[5]) for line in lines) == ledger == Decimal(rows[-2][5])
    assert sum(int(line[2]) for line in lines) == LedgerEntry.objects.filter(tenant=t.tenant).count()
    assert Decimal(rows[-1][5]) == ledger.quantize(Decimal("0.01"))
    # Each kind of token and its cost, per line and in total, as the ledger has them.
    from django.db.models import Sum

    from billing.statements import KINDS

    assert rows[1][6:] == KINDS
    sums = LedgerEntry.objects.filter(tenant=t.tenant).aggregate(**{kind: Sum(kind) for kind in KINDS})
    for column, kind in enumerate(KINDS, start=6):
        assert sum(Decimal(line[column]) for line in lines) == Decimal(rows[-2][column]) == sums[kind] > 0

    pdf = finance.get(STATEMENT, {"tenant": t.tenant.slug, "month": "2026-03", "format": "pdf"})
    assert pdf["Content-Type"] == "application/pdf"
    text = "".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf.content)).pages)
    assert f"Statement for {t.tenant.name}, March 2026" in text
    assert f"Total due: ${ledger.quantize(Decimal('0.01'))}" in text and format(ledger, "f") in text
    flat = " ".join(text.split())
    reads = f"Cache reads: {sums['cache_read_tokens']} tokens, ${format(sums['cache_read_cost_usd'], 'f')} of the total"
    assert reads in flat and f"Reasoning: {sums['reasoning_tokens']} tokens" in flat

    empty = finance.get(STATEMENT, {"tenant": t.tenant.slug, "month": "2026-04", "format": "csv"})
    assert Decimal(list(csv.reader(io.StringIO(empty.content.decode())))[-2][5]) == 0
    assert finance.get(STATEMENT, {"tenant": t.other.slug, "month": "2026-03"}).status_code == 404
    assert finance.get(STATEMENT, {"tenant": t.tenant.slug, "month": "March"}).status_code == 400
    assert as_user(t.viewer).get(STATEMENT, {"tenant": t.tenant.slug, "month": "2026-03"}).status_code == 404
