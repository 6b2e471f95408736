from datetime import UTC, date, datetime
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError

from billing.archive import ArchiveError, archivable_months, archive_months


def _month(text: str) -> date:
    try:
        return datetime.strptime(text, "%Y-%m").replace(tzinfo=UTC).date()
    except ValueError as exc:
        raise CommandError(f"--before takes a month as YYYY-MM, not {text!r}") from exc


class Command(BaseCommand):
    help = (
        "Export every month of the ledger before --before to a gzip'd CSV in --to, check the file against "
        "the table, then detach the month (kept as a table, or dropped with --drop). Rollups stay, so "
        "spend reports are unchanged. docs/billing.md, 'Years of ledger'."
    )

    def add_arguments(self, parser):
        parser.add_argument("--before", required=True, help="The first month kept, YYYY-MM (at most the current one).")
        parser.add_argument("--to", required=True, type=Path, help="The directory the files are written to.")
        parser.add_argument("--drop", action="store_true", help="Drop each month's table once its file is checked.")
        parser.add_argument("--dry-run", action="store_true", help="Only list the months that would be archived.")
        parser.add_argument(
            "--lock-timeout",
            type=float,
            default=10.0,
            help="Seconds a month waits for its locks (the detach waits for queries reading the ledger).",
        )

    def handle(self, *args, before, to, drop, dry_run, lock_timeout=10.0, **options):
        month = _month(before)
        if dry_run:
            for found in archivable_months(month):
                self.stdout.write(f"would archive {found:%Y-%m}")
            return
        try:
            archived = archive_months(before=month, to=Path(to), drop=drop, lock_timeout=float(lock_timeout))
        except ArchiveError as exc:
            raise CommandError(str(exc)) from exc
        except OperationalError as exc:  # a lock not had in time: the month is as it was
            raise CommandError(f"the database refused: {str(exc).strip()}; nothing of that month changed") from exc
        for done in archived:
            self.stdout.write(f"archived {done.month:%Y-%m}: {done.rows} rows, {done.cost_usd} USD -> {done.path}")
        if not archived:
            self.stdout.write(f"nothing to archive before {month:%Y-%m}")
