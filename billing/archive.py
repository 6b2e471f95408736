"""Old months of the ledger out of the table: exported, checked, then detached (docs/billing.md,
"Years of ledger"). `manage.py ledger_archive` calls `archive_months`.

A month goes in one transaction: its partition locked against writes, every row copied to a gzip'd
CSV file (written aside, synced, then renamed), the file read back and its row count and cost sum
compared with the table's, a LedgerArchive row recorded, and the partition detached (and dropped,
or kept as a plain table under another name). Any failure rolls all of it back, leaving the month
in the ledger. The month's rollups stay, so reports over it are unchanged.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import logging
import os
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

from django.db import connection, transaction

from billing.models import LedgerArchive, LedgerEntry, RollupDue
from billing.partitions import (
    DEFAULT_PARTITION,
    TABLE,
    create_partition,
    month_of,
    next_month,
    partition_name,
    partitions,
)
from billing.services import spend_roll_up

logger = logging.getLogger(__name__)

# Not "billing_ledgerarchive…": that is LedgerArchive's own table, and its sequence.
ARCHIVED_PREFIX = "ledger_archived"


class ArchiveError(Exception):
    """A month that cannot be archived, and why; nothing was changed for it."""


@dataclass(frozen=True)
class Archived:
    month: date
    path: Path
    rows: int
    cost_usd: Decimal


def archivable_months(before: date) -> list[date]:
    """The months before `before` that hold ledger rows: attached partitions, and months whose rows
    wait in the default partition (rows of a month that had none)."""
    with connection.cursor() as cursor:
        months = {month for month in partitions(cursor) if month < before}
        cursor.execute(
            f"SELECT DISTINCT date_trunc('month', created_at AT TIME ZONE 'UTC')::date FROM \"{DEFAULT_PARTITION}\" "  # noqa: S608
            "WHERE created_at < %s",
            [datetime(before.year, before.month, 1, tzinfo=UTC)],
        )
        months |= {row[0] for row in cursor.fetchall()}
    return sorted(months)


def archive_months(
    *, before: date, to: Path, drop: bool, now: datetime | None = None, lock_timeout: float = 10.0
) -> list[Archived]:
    """Archive every month of the ledger before `before` (the first of a month, no later than the
    current month's) into files in `to`; returns what was archived, oldest first."""
    before = month_of(before)
    if before > month_of(now or datetime.now(UTC)):
        raise ArchiveError("Only months already over can be archived: --before may be the current month at the latest.")
    to.mkdir(parents=True, exist_ok=True)
    while spend_roll_up():  # every row's day folded into its rollups before the rows leave
        pass
    return [_archive_month(month, to, drop=drop, lock_timeout=lock_timeout) for month in archivable_months(before)]


def _archive_month(month: date, to: Path, *, drop: bool, lock_timeout: float) -> Archived:
    low = datetime(month.year, month.month, 1, tzinfo=UTC)
    high = datetime(next_month(month).year, next_month(month).month, 1, tzinfo=UTC)
    final = _free_path(to, month)
    partial = final.with_name(final.name + ".partial")
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            # The detach waits for every query reading the ledger, and holds new ones meanwhile: briefly.
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{int(lock_timeout * 1000)}ms"])
            create_partition(cursor, month, TABLE)  # rows of a month without one leave the default partition
            name = partition_name(month)
            cursor.execute(f'LOCK TABLE "{name}" IN SHARE MODE')  # no row added while it is exported
            if RollupDue.objects.filter(day__gte=low.date(), day__lt=high.date()).exists():
                raise ArchiveError(f"{month:%Y-%m} has rows not yet in its rollups; run the rollup job, then again.")
            cursor.execute(f'SELECT count(*), coalesce(sum(cost_usd), 0) FROM "{name}"')  # noqa: S608
            rows, cost = cursor.fetchone()
            digest = hashlib.sha256()
            export = f'COPY (SELECT * FROM "{name}" ORDER BY created_at, id) TO STDOUT WITH (FORMAT csv, HEADER)'  # noqa: S608
            with open(partial, "wb") as raw:
                with (
                    gzip.GzipFile(fileobj=_Hashing(raw, digest), mode="wb", mtime=0) as out,
                    cursor.copy(export) as copy,
                ):
                    for chunk in copy:
                        out.write(chunk)
                raw.flush()
                os.fsync(raw.fileno())
            read_rows, read_cost = read_back(partial)
            if (read_rows, read_cost) != (rows, cost):
                raise ArchiveError(
                    f"{month:%Y-%m}: the file holds {read_rows} rows costing {read_cost}, "
                    f"the table {rows} costing {cost}"
                )
            kept_as = "" if drop else _free_table(cursor, f"{ARCHIVED_PREFIX}_y{month:%Y}m{month:%m}")
            cursor.execute(f'ALTER TABLE "{TABLE}" DETACH PARTITION "{name}"')
            if drop:
                cursor.execute(f'DROP TABLE "{name}"')
            else:
                cursor.execute(f'ALTER TABLE "{name}" RENAME TO "{kept_as}"')
            LedgerArchive.objects.create(
                month=month, path=str(final), rows=rows, cost_usd=cost, sha256=digest.hexdigest(), kept_as=kept_as
            )
            # Named last: a month the detach failed for (a lock not had in time) leaves no file behind.
            os.replace(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    logger.info("ledger: archived %s, %d rows costing %s, to %s", f"{month:%Y-%m}", rows, cost, final)
    return Archived(month=month, path=final, rows=rows, cost_usd=cost)


def restore(path: Path) -> Archived:
    """Put an exported month back into the ledger (its partition made again where it was dropped);
    rows already there are skipped. The file's archive record goes, so the month's rollups are
    recomputed from the ledger again once no other part of it is archived."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with gzip.open(path, "rt", newline="", encoding="utf-8") as text:
        columns = next(csv.reader(text), None)
    known = {field.column for field in LedgerEntry._meta.concrete_fields}
    if not columns or not set(columns) <= known or "created_at" not in columns:
        raise ArchiveError(f"{path} is no ledger export: its header names columns the ledger does not have")
    listed = ", ".join(f'"{column}"' for column in columns)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '10s'")
        cursor.execute(
            f'CREATE TEMP TABLE ledger_restoring (LIKE "{TABLE}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS) '
            "ON COMMIT DROP"
        )
        with (
            gzip.open(path, "rb") as raw,
            cursor.copy(f"COPY ledger_restoring ({listed}) FROM STDIN WITH (FORMAT csv, HEADER)") as copy,
        ):
            while chunk := raw.read(1 << 20):
                copy.write(chunk)
        cursor.execute(
            "SELECT count(*), coalesce(sum(cost_usd), 0), min(created_at), max(created_at) FROM ledger_restoring"
        )
        rows, cost, first, last = cursor.fetchone()
        if not rows:
            raise ArchiveError(f"{path} holds no rows")
        month = month_of(first)
        if month_of(last) != month:
            raise ArchiveError(f"{path} holds rows of more than one month ({first:%Y-%m} to {last:%Y-%m})")
        create_partition(cursor, month, TABLE)
        cursor.execute(
            f'INSERT INTO "{TABLE}" SELECT * FROM ledger_restoring ON CONFLICT (id, created_at) DO NOTHING'  # noqa: S608
        )
        LedgerArchive.objects.filter(month=month, sha256=digest).delete()
    logger.info("ledger: restored %s, %d rows costing %s, from %s", f"{month:%Y-%m}", rows, cost, path)
    return Archived(month=month, path=path, rows=rows, cost_usd=cost)


def read_back(path: Path) -> tuple[int, Decimal]:
    """The rows of an export and their cost, read from the file as a restore would."""
    rows, cost = 0, Decimal(0)
    with gzip.open(path, "rt", newline="", encoding="utf-8") as text:
        for row in csv.DictReader(text):
            rows += 1
            cost += Decimal(row["cost_usd"])
    return rows, cost


def _free_path(to: Path, month: date) -> Path:
    """`ledger-YYYY-MM.csv.gz`, or with a number when that month was archived before (rows that came late)."""
    path, number = to / f"ledger-{month:%Y-%m}.csv.gz", 1
    while path.exists():
        number += 1
        path = to / f"ledger-{month:%Y-%m}-{number}.csv.gz"
    return path


def _free_table(cursor, name: str) -> str:
    candidate, number = name, 1
    while True:
        cursor.execute("SELECT to_regclass(%s) IS NULL", [candidate])
        if cursor.fetchone()[0]:
            return candidate
        number += 1
        candidate = f"{name}_{number}"


class _Hashing(io.RawIOBase):
    """A write-only file that hashes what passes through it."""

    def __init__(self, raw, digest) -> None:
        self.raw, self.digest = raw, digest

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.digest.update(data)
        return self.raw.write(data)
