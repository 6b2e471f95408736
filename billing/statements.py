"""Monthly statements: one tenant's spend for one calendar month (UTC), line by line per key and
model, as CSV (exact decimals) and PDF (reportlab). The lines and the total come from the spend
report, so a statement reconciles with the ledger rows of that month to the last decimal; the total
is also given rounded to the cent, the figure an invoice would carry."""

from __future__ import annotations

import calendar
import csv
import io
from dataclasses import dataclass
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal

from django.utils import timezone

from billing.exports import cell_text
from billing.selectors import TOKEN_KINDS, SpendReport, spend_report
from tenants.models import Tenant

CENT = Decimal("0.01")
COLUMNS = ["key", "model", "requests", "prompt_tokens", "completion_tokens", "cost_usd"]
# After the columns above, so theirs keep their places.
KINDS = list(TOKEN_KINDS)
KIND_LABELS = {"cache_read": "Cache reads", "cache_write": "Cache writes", "reasoning": "Reasoning"}


@dataclass
class Statement:
    tenant: Tenant
    month: date  # its first day
    report: SpendReport
    generated_at: datetime

    @property
    def last_day(self) -> date:
        return self.month.replace(day=calendar.monthrange(self.month.year, self.month.month)[1])

    @property
    def total(self) -> Decimal:
        return self.report.totals.metrics["cost_usd"]

    @property
    def total_in_cents(self) -> Decimal:
        return self.total.quantize(CENT, rounding=ROUND_HALF_UP)

    def lines(self) -> list[list]:
        return [
            [
                row.key.name if row.key else "(no key)",
                row.model,
                row.metrics["requests"],
                row.metrics["prompt_tokens"],
                row.metrics["completion_tokens"],
                row.metrics["cost_usd"],
                *(row.metrics[kind] for kind in KINDS),
            ]
            for row in self.report.rows
        ]

    @property
    def filename(self) -> str:
        return f"statement-{self.tenant.slug}-{self.month:%Y-%m}"


def parse_month(text: str) -> date | None:
    """'2026-11' → 2026-11-01; anything else None."""
    try:
        return date.fromisoformat(f"{text}-01") if len(text) == 7 else None
    except (TypeError, ValueError):
        return None


def statement(*, tenant: Tenant, month: date) -> Statement:
    first = month.replace(day=1)
    last = first.replace(day=calendar.monthrange(first.year, first.month)[1])
    report = spend_report(tenants=[tenant], start=first, end=last, group_by=["key", "model"])
    return Statement(tenant=tenant, month=first, report=report, generated_at=timezone.now())


def statement_csv(st: Statement) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["tenant", st.tenant.slug, "period", st.month.isoformat(), st.last_day.isoformat()])
    writer.writerow([*COLUMNS, *KINDS])
    for line in st.lines():
        writer.writerow([cell_text(value) for value in line])
    totals = st.report.totals.metrics
    writer.writerow(
        [
            "TOTAL",
            "",
            totals["requests"],
            totals["prompt_tokens"],
            totals["completion_tokens"],
            cell_text(st.total),
            *(cell_text(totals[kind]) for kind in KINDS),
        ]
    )
    writer.writerow(["TOTAL (to the cent)", "", "", "", "", cell_text(st.total_in_cents)])
    return out.getvalue().encode()


def statement_pdf(st: Statement) -> bytes:
    # Imported here: only this download needs reportlab.
    from reportlab.lib import colors
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

    styles = getSampleStyleSheet()
    buffer = io.BytesIO()
    title = f"Statement for {st.tenant.name}, {st.month:%B %Y}"
    document = SimpleDocTemplate(buffer, pagesize=A4, title=title, author="Sentinel")
    header = ["Key", "Model", "Requests", "Prompt tokens", "Completion tokens", "Cost (USD)"]
    body = [[str(cell_text(value)) for value in line[: len(COLUMNS)]] for line in st.lines()]
    totals = st.report.totals.metrics
    total_row = ["Total", "", str(totals["requests"]), str(totals["prompt_tokens"]), str(totals["completion_tokens"])]
    table = Table([header, *body, [*total_row, cell_text(st.total)]], repeatRows=1)
    table.setStyle(
        TableStyle(
            [
                ("FONTNAME", (0, 0), (-1, 0), "Helvetica-Bold"),
                ("FONTNAME", (0, -1), (-1, -1), "Helvetica-Bold"),
                ("LINEBELOW", (0, 0), (-1, 0), 0.5, colors.black),
                ("LINEABOVE", (0, -1), (-1, -1), 0.5, colors.black),
                ("ALIGN", (2, 0), (-1, -1), "RIGHT"),
                ("FONTSIZE", (0, 0), (-1, -1), 8),
            ]
        )
    )
    period = f"{st.month.isoformat()} to {st.last_day.isoformat()} (UTC days)"
    story = [
        Paragraph(title, styles["Title"]),
        Paragraph(f"Tenant {st.tenant.slug} &middot; {period}", styles["Normal"]),
        Spacer(1, 12),
        table,
        Spacer(1, 12),
        Paragraph(f"<b>Total due: ${st.total_in_cents}</b> (exactly ${cell_text(st.total)})", styles["Normal"]),
        *(
            Paragraph(
                f"{label}: {totals[f'{kind}_tokens']} tokens, ${cell_text(totals[f'{kind}_cost_usd'])} of the total",
                styles["Normal"],
            )
            for kind, label in KIND_LABELS.items()
        ),
        Paragraph(
            f"Every figure is the sum of the ledger rows it covers. Generated {st.generated_at:%Y-%m-%d %H:%M} UTC.",
            styles["Normal"],
        ),
    ]
    document.build(story)
    return buffer.getvalue()
