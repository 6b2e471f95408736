"""A spend report as a table, and that table as CSV (exact decimals) or XLSX (numbers a spreadsheet
can sum; money keeps ten decimal places as far as a spreadsheet's doubles allow, far below a cent)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal

from billing.prices import KIND_COLUMNS
from billing.selectors import METRICS, MONEY_METRICS, TOKEN_KINDS, SpendReport, SpendRow

DIMENSION_COLUMNS = {
    "day": ["day"],
    "tenant": ["tenant", "tenant_name"],
    "team": ["team_id", "team"],
    "key": ["key_id", "key_name", "key_prefix"],
    "end_user": ["end_user"],
    "model": ["model"],
    "price": [
        "price_id",
        "price_model",
        "price_effective_from",
        "input_usd_per_token",
        "output_usd_per_token",
        # Added later, so last: the other kinds' prices (empty: the kind falls back, docs/billing.md).
        *(column.replace("_per_token", "_usd_per_token") for column in KIND_COLUMNS),
    ],
}
# The page's headings (exports keep the column names above, which scripts read).
COLUMN_LABELS = {
    "tenant_name": "tenant name",
    "team_id": "team id",
    "key_id": "key id",
    "key_name": "key",
    "key_prefix": "key prefix",
    "end_user": "end user",
    "price_id": "price id",
    "price_model": "priced as",
    "price_effective_from": "price from",
    "input_usd_per_token": "input $/token",
    "output_usd_per_token": "output $/token",
    "successful_requests": "answered",
    "prompt_tokens": "prompt tokens",
    "completion_tokens": "completion tokens",
    "cost_usd": "cost $",
    "exact_hits": "exact hits",
    "semantic_hits": "semantic hits",
    "saved_cost_usd": "saved $",
    "cache_read_usd_per_token": "cache read $/token",
    "cache_write_usd_per_token": "cache write $/token",
    "reasoning_usd_per_token": "reasoning $/token",
    "batch_input_usd_per_token": "batch input $/token",
    "batch_output_usd_per_token": "batch output $/token",
    "batch_cache_read_usd_per_token": "batch cache read $/token",
    "batch_cache_write_usd_per_token": "batch cache write $/token",
    "cache_read_tokens": "cache read tokens",
    "cache_write_tokens": "cache write tokens",
    "reasoning_tokens": "reasoning tokens",
    "cache_read_cost_usd": "cache read $",
    "cache_write_cost_usd": "cache write $",
    "reasoning_cost_usd": "reasoning $",
    "images": "images",
}
MONEY_FORMAT = "#,##0.00########"
PRICE_FORMAT = "0.000000000000000"


def report_columns(report: SpendReport) -> list[str]:
    return [column for name in report.group_by for column in DIMENSION_COLUMNS[name]] + list(METRICS)


def report_labels(report: SpendReport) -> list[str]:
    return [COLUMN_LABELS.get(column, column) for column in report_columns(report)]


def _dimension_values(name: str, row: SpendRow) -> list:
    if name == "day":
        return [row.day]
    if name == "tenant":
        return [row.tenant.slug, row.tenant.name] if row.tenant else [None, None]
    if name == "team":
        return [row.team.pk, row.team.name] if row.team else [None, None]
    if name == "key":
        return [row.key.pk, row.key.name, row.key.prefix] if row.key else [None, None, None]
    if name == "model":
        return [row.model]
    if name == "end_user":
        return [row.end_user]
    price = row.price
    if price is None:
        return [None] * len(DIMENSION_COLUMNS["price"])
    return [
        price.pk,
        price.model,
        price.effective_from,
        price.input_per_token,
        price.output_per_token,
        *(getattr(price, column) for column in KIND_COLUMNS),
    ]


def report_rows(report: SpendReport) -> list[list]:
    """The table's rows, the totals last (labelled TOTAL in the first column)."""
    rows = []
    for row in report.rows:
        values = [value for name in report.group_by for value in _dimension_values(name, row)]
        rows.append(values + [row.metrics[name] for name in METRICS])
    width = len(report_columns(report)) - len(METRICS)
    label = ["TOTAL"] + [None] * (width - 1) if width else []
    rows.append(label + [report.totals.metrics[name] for name in METRICS])
    return rows


def cell_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def report_csv(report: SpendReport) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(report_columns(report))
    for row in report_rows(report):
        writer.writerow([cell_text(value) for value in row])
    return out.getvalue().encode()


def report_xlsx(report: SpendReport) -> bytes:
    # Imported here: openpyxl pulls in numpy, half a second that every process loading the admin
    # (gateway and worker processes included) would otherwise pay at start for a rare export.
    from openpyxl import Workbook
    from openpyxl.cell import WriteOnlyCell
    from openpyxl.styles import Font

    workbook = Workbook(write_only=True)
    sheet = workbook.create_sheet("Spend")
    columns = report_columns(report)
    bold = Font(bold=True)
    header = []
    for column in columns:
        cell = WriteOnlyCell(sheet, value=column)
        cell.font = bold
        header.append(cell)
    sheet.append(header)
    rows = report_rows(report)
    for index, row in enumerate(rows):
        cells = []
        for column, value in zip(columns, row, strict=True):
            if isinstance(value, datetime):
                value = value.replace(tzinfo=None)  # Excel has no time zones; every time here is UTC
            cell = WriteOnlyCell(sheet, value=value)
            if column in MONEY_METRICS:
                cell.number_format = MONEY_FORMAT
            elif column.endswith("_per_token"):
                cell.number_format = PRICE_FORMAT
            elif isinstance(value, date):
                cell.number_format = "yyyy-mm-dd hh:mm:ss" if isinstance(value, datetime) else "yyyy-mm-dd"
            if index == len(rows) - 1:
                cell.font = bold
            cells.append(cell)
        sheet.append(cells)
    info = workbook.create_sheet("About")
    info.append(["Spend report", f"{report.start.isoformat()} to {report.end.isoformat()} (UTC days, inclusive)"])
    info.append(["Tenants", ", ".join(tenant.slug for tenant in report.tenants)])
    info.append(["Grouped by", ", ".join(report.group_by) or "(totals only)"])
    out = io.BytesIO()
    workbook.save(out)
    return out.getvalue()


def report_filename(report: SpendReport, extension: str) -> str:
    scope = report.tenants[0].slug if len(report.tenants) == 1 else "all-tenants"
    return f"spend-{scope}-{report.start.isoformat()}-{report.end.isoformat()}.{extension}"


# --- the request log ----------------------------------------------------------------------------

REQUEST_LOG_COLUMNS = [
    "created_at",
    "request_id",
    "tenant",
    "key_id",
    "key_name",
    "end_user",
    "model_requested",
    "model_served",
    "provider",
    "stream",
    "status_code",
    "error_code",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "cache_tier",
    "saved_cost_usd",
    "latency_ms",
    # Added later, so last.
    *TOKEN_KINDS,
    "batch",
    "images",
    "retrieval_tokens",
    "retrieval_cost_usd",
    "team_id",
    "team",
]


def request_log_rows(entries) -> Iterator[list]:
    """The ledger rows of `entries` (a queryset), read in chunks: a year of requests never sits in memory."""
    fields = [c for c in REQUEST_LOG_COLUMNS if c not in ("tenant", "key_id", "key_name", "team")]
    rows = entries.select_related("tenant", "key", "team").order_by("created_at", "id")
    for entry in rows.iterator(chunk_size=2000):
        values = {name: getattr(entry, name) for name in fields}
        values["tenant"] = entry.tenant.slug
        values["key_id"] = entry.key_id
        values["key_name"] = entry.key.name if entry.key else None
        values["team"] = entry.team.name if entry.team else None  # a deleted team's id stays, its name not
        yield [values[name] for name in REQUEST_LOG_COLUMNS]


class _Line:
    """A file csv.writer writes one line to, handed back at once (for a streamed response)."""

    def write(self, text: str) -> str:
        return text


def request_log_csv(entries) -> Iterator[bytes]:
    writer = csv.writer(_Line())
    yield writer.writerow(REQUEST_LOG_COLUMNS).encode()
    for row in request_log_rows(entries):
        yield writer.writerow([cell_text(value) for value in row]).encode()


def request_log_xlsx(entries, path) -> None:
    """Written to `path` row by row (openpyxl's write-only mode keeps no rows in memory)."""
    from openpyxl import Workbook

    workbook = Workbook(write_only=True)
    sheet = workbook.create_sheet("Requests")
    sheet.append(REQUEST_LOG_COLUMNS)
    for row in request_log_rows(entries):
        sheet.append([value.replace(tzinfo=None) if isinstance(value, datetime) else value for value in row])
    workbook.save(path)
