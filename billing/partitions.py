"""The ledger table partitioned by month (PostgreSQL declarative partitioning, docs/billing.md).

`billing_ledgerentry` is partitioned by range of `created_at`: one partition per UTC month, named
`billing_ledgerentry_yYYYYmMM`, and a default partition for rows of a month that has none yet (so an
insert is never refused for its date). Beat makes the current month's and the next months'
partitions ahead of time (`ensure_partitions`); a month made later takes its rows out of the default
partition in the same transaction. Old months are exported and detached by `manage.py
ledger_archive` (billing/archive.py); their rollups stay, and reports read rollups.

The primary key is (id, created_at): a partitioned table's unique constraints must hold the
partition key. A ledger row's id and created_at both come from its record, so a record written twice
(a batch retried, a stream message delivered again) still conflicts with itself and is dropped.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime

from django.db import connection, transaction

from billing.models import LedgerEntry

TABLE = LedgerEntry._meta.db_table
DEFAULT_PARTITION = f"{TABLE}_default"
# Months made ahead of the current one: beat runs daily, so three months leave weeks to notice a beat
# that stopped before any row lands in the default partition.
MONTHS_AHEAD = 3
_MONTH_NAME = re.compile(r"_y(\d{4})m(\d{2})$")


def month_of(moment: datetime | date) -> date:
    if isinstance(moment, datetime):
        moment = moment.astimezone(UTC)
    return date(moment.year, moment.month, 1)


def next_month(month: date) -> date:
    return date(month.year + month.month // 12, month.month % 12 + 1, 1)


def partition_name(month: date, table: str = TABLE) -> str:
    return f"{table}_y{month:%Y}m{month:%m}"


def _bound(month: date) -> str:
    return f"{month:%Y-%m-%d} 00:00:00+00"


def is_partitioned(cursor, table: str = TABLE) -> bool:
    cursor.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)", [table])
    row = cursor.fetchone()
    return bool(row and row[0])


def partitions(cursor, table: str = TABLE) -> dict[date, str]:
    """The monthly partitions attached to `table`, by month (the default partition is not one)."""
    cursor.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
        [table],
    )
    found = {}
    for (name,) in cursor.fetchall():
        if match := _MONTH_NAME.search(name):
            found[date(int(match[1]), int(match[2]), 1)] = name
    return found


def create_partition(cursor, month: date, table: str) -> bool:
    """Make `month`'s partition of `table` unless it has one, moving its rows out of the default
    partition; returns whether it made one. Runs in the caller's transaction."""
    name = partition_name(month, table)
    if month in partitions(cursor, table):
        return False
    default = f"{table}_default"
    low, high = _bound(month), _bound(next_month(month))
    # Rows routed to the default partition wait here until the new partition is attached: a row of
    # this month inserted after the move would make the attach fail.
    cursor.execute(f'LOCK TABLE "{default}" IN SHARE ROW EXCLUSIVE MODE')
    cursor.execute(f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)')
    cursor.execute(
        f'WITH moved AS (DELETE FROM "{default}" WHERE created_at >= %s AND created_at < %s RETURNING *) '  # noqa: S608
        f'INSERT INTO "{name}" SELECT * FROM moved',
        [low, high],
    )
    # Attaching builds the partition's indexes and checks its foreign keys, as the parent has them.
    cursor.execute(f"ALTER TABLE \"{table}\" ATTACH PARTITION \"{name}\" FOR VALUES FROM ('{low}') TO ('{high}')")
    return True


def ensure_partitions(*, now: datetime | None = None, ahead: int = MONTHS_AHEAD, table: str = TABLE) -> list[str]:
    """The current month's partition and the next `ahead` months', made where missing (beat, daily);
    returns the names made. A month whose partition was archived is not made again: it is in the past."""
    month = month_of(now or datetime.now(UTC))
    made = []
    for _ in range(ahead + 1):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '10s'")
            if create_partition(cursor, month, table):
                made.append(partition_name(month, table))
        month = next_month(month)
    return made


# --- converting the table (migration 0021) -----------------------------------------------------


def _definitions(cursor, table: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The indexes (but the primary key's) and the foreign keys of `table`: (name, definition)."""
    cursor.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass(%s) AND NOT i.indisprimary ORDER BY c.relname",
        [table],
    )
    indexes = cursor.fetchall()
    cursor.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = to_regclass(%s) AND contype = 'f' ORDER BY conname",
        [table],
    )
    return indexes, cursor.fetchall()


def _rebuild(cursor, table: str, *, partitioned: bool, now: datetime, ahead: int = MONTHS_AHEAD) -> None:
    """Remake `table` partitioned by month (or plain again), its rows, indexes, primary key and foreign
    keys with it, under the same names. One transaction: a failure leaves the table as it was."""
    old = f"{table}_before_rebuild"
    indexes, foreign_keys = _definitions(cursor, table)
    cursor.execute(f'ALTER TABLE "{table}" RENAME TO "{old}"')
    for name, _ in indexes:
        cursor.execute(f'DROP INDEX "{name}"')  # frees the names; the copy below reads the whole table anyway
    cursor.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype IN ('p', 'f')", [old]
    )
    for (name,) in cursor.fetchall():
        cursor.execute(f'ALTER TABLE "{old}" DROP CONSTRAINT "{name}"')
    suffix = " PARTITION BY RANGE (created_at)" if partitioned else ""
    cursor.execute(f'CREATE TABLE "{table}" (LIKE "{old}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS){suffix}')
    if partitioned:
        cursor.execute(f'CREATE TABLE "{table}_default" PARTITION OF "{table}" DEFAULT')
        cursor.execute(f'SELECT min(created_at), max(created_at) FROM "{old}"')  # noqa: S608
        first, last = cursor.fetchone()
        month, until = month_of(min(first or now, now)), month_of(now)
        for _ in range(ahead):
            until = next_month(until)
        until = max(until, month_of(last or now))
        while month <= until:
            low, high = _bound(month), _bound(next_month(month))
            cursor.execute(
                f'CREATE TABLE "{partition_name(month, table)}" PARTITION OF "{table}" '
                f"FOR VALUES FROM ('{low}') TO ('{high}')"
            )
            month = next_month(month)
    cursor.execute(f'INSERT INTO "{table}" SELECT * FROM "{old}"')  # noqa: S608
    cursor.execute(f'DROP TABLE "{old}"')
    key = "id, created_at" if partitioned else "id"
    cursor.execute(f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_pkey" PRIMARY KEY ({key})')
    on_old = re.compile(rf' ON (?:ONLY )?(?:\S+\.)?"?{re.escape(old)}"? ')
    for _, definition in indexes:
        cursor.execute(on_old.sub(f' ON "{table}" ', definition, count=1))
    for name, definition in foreign_keys:
        cursor.execute(f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {definition}')
    cursor.execute(f'ANALYZE "{table}"')


def partition_table(cursor, table: str = TABLE, *, now: datetime | None = None) -> None:
    """Migration 0021 forward: the plain ledger table becomes one partitioned by month."""
    if not is_partitioned(cursor, table):
        _rebuild(cursor, table, partitioned=True, now=now or datetime.now(UTC))


def unpartition_table(cursor, table: str = TABLE) -> None:
    """Migration 0021 backward: one plain table again, with every row of every attached partition."""
    if is_partitioned(cursor, table):
        _rebuild(cursor, table, partitioned=False, now=datetime.now(UTC))
