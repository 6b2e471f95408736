from pathlib import Path

import psycopg
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from billing.archive import ArchiveError, restore


class Command(BaseCommand):
    help = (
        "Put months exported by ledger_archive back into the ledger (rows already there are skipped). "
        "docs/billing.md, 'Years of ledger'."
    )

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+", type=Path, help="ledger-YYYY-MM.csv.gz files written by ledger_archive")

    def handle(self, *args, files, **options):
        for path in files:
            try:
                done = restore(Path(path))
            except (ArchiveError, OSError, DatabaseError, psycopg.Error) as exc:  # not a file it wrote, or not whole
                raise CommandError(f"{path}: {exc}") from exc
            self.stdout.write(f"restored {done.month:%Y-%m}: {done.rows} rows, {done.cost_usd} USD from {path}")
