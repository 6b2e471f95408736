"""The ledger partitioned by month (billing/partitions.py) and its old months archived
(billing/archive.py, `manage.py ledger_archive`), on the real PostgreSQL."""

from __future__ import annotations

import csv
import gzip
import hashlib
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from billing.models import DailyRollup, LedgerArchive, LedgerEntry, RollupDue
from billing.partitions import (
    DEFAULT_PARTITION,
    MONTHS_AHEAD,
    TABLE,
    ensure_partitions,
    is_partitioned,
    month_of,
    next_month,
    partition_table,
    partitions,
    unpartition_table,
)
from billing.selectors import spend_report
from billing.services import spend_roll_up
from tests.servers import database_url_for


def sql(query: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(query, params or [])
        return cursor.fetchall() if cursor.description else []


def where(entry_id) -> str:
    """The partition a ledger row is stored in."""
    return sql(f"SELECT tableoid::regclass::text FROM {TABLE} WHERE id = %s", [entry_id])[0][0]  # noqa: S608


def entry(tenant, at: datetime, cost: str, **fields) -> LedgerEntry:
    return LedgerEntry.objects.create(
        request_id=fields.pop("request_id", f"req-{uuid.uuid4().hex[:8]}"),
        created_at=at,
        tenant=tenant,
        model_requested=fields.pop("model", "gpt-4o-mini"),
        status_code=200,
        prompt_tokens=10,
        completion_tokens=20,
        cost_usd=Decimal(cost),
        **fields,
    )


def drop_partition(month: date) -> None:
    """Put the ledger back as it was for a month a test made a partition of (the database is shared)."""
    name = f"{TABLE}_y{month:%Y}m{month:%m}"
    if sql("SELECT to_regclass(%s) IS NOT NULL", [name])[0][0]:
        sql(f'DELETE FROM "{name}"')  # noqa: S608
        sql(f'ALTER TABLE {TABLE} DETACH PARTITION "{name}"')
        sql(f'DROP TABLE "{name}"')


def test_the_ledger_is_partitioned_by_month_with_months_made_ahead(live_db, make_tenant):
    tenant = make_tenant()
    now = datetime.now(UTC)
    with connection.cursor() as cursor:
        assert is_partitioned(cursor)
        months = partitions(cursor)
    month, ahead = month_of(now), []
    for _ in range(MONTHS_AHEAD + 1):
        ahead.append(month)
        month = next_month(month)
    assert set(ahead) <= set(months), months
    recent = entry(tenant, now, "0.0010")
    ancient = entry(tenant, datetime(2001, 1, 5, tzinfo=UTC), "0.0020")
    try:
        assert where(recent.pk) == f"{TABLE}_y{now:%Y}m{now:%m}"
        assert where(ancient.pk) == DEFAULT_PARTITION  # a month without a partition still takes its rows
        # The primary key holds the partition key; the ORM still finds a row by its id alone.
        assert sql(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
            [TABLE],
        ) == [("PRIMARY KEY (id, created_at)",)]
        assert LedgerEntry.objects.get(pk=ancient.pk).cost_usd == Decimal("0.0020")
    finally:
        LedgerEntry.objects.filter(tenant=tenant).delete()


def test_a_month_made_later_takes_its_rows_out_of_the_default_partition(live_db, make_tenant):
    tenant = make_tenant()
    month = date(2031, 1, 1)
    rows = [entry(tenant, datetime(2031, 1, day, 12, tzinfo=UTC), f"0.00{day}") for day in (1, 15, 31)]
    outside = entry(tenant, datetime(2031, 2, 1, tzinfo=UTC), "0.5")  # the next month's first moment
    before = sorted(LedgerEntry.objects.filter(tenant=tenant).values_list("id", "created_at", "cost_usd"))
    try:
        assert {where(row.pk) for row in rows} == {DEFAULT_PARTITION}

        made = ensure_partitions(now=datetime(2031, 1, 20, tzinfo=UTC), ahead=0)

        assert made == [f"{TABLE}_y2031m01"]
        assert {where(row.pk) for row in rows} == {f"{TABLE}_y2031m01"}
        assert where(outside.pk) == DEFAULT_PARTITION
        after = sorted(LedgerEntry.objects.filter(tenant=tenant).values_list("id", "created_at", "cost_usd"))
        assert after == before  # moved, not copied nor lost
        # The new partition has the parent's indexes and foreign keys.
        indexes = {name for (name,) in sql("SELECT indexname FROM pg_indexes WHERE tablename = %s", [made[0]])}
        assert len(indexes) == len(
            {name for (name,) in sql("SELECT indexname FROM pg_indexes WHERE tablename = %s", [f"{TABLE}_default"])}
        )
        assert ensure_partitions(now=datetime(2031, 1, 20, tzinfo=UTC), ahead=0) == []  # once
    finally:
        LedgerEntry.objects.filter(tenant=tenant).delete()
        drop_partition(month)


SCRATCH = "ledger_scratch"


@pytest.fixture
def scratch(live_db, make_tenant):
    """A plain table shaped as the ledger was before migration 0021, with an index, a partial index and
    a foreign key named as Django names them, and rows in three months."""
    tenant = make_tenant()
    sql(f"DROP TABLE IF EXISTS {SCRATCH}")
    sql(f"CREATE TABLE {SCRATCH} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    sql(f"ALTER TABLE {SCRATCH} ADD CONSTRAINT {SCRATCH}_pkey PRIMARY KEY (id)")
    sql(f"CREATE INDEX {SCRATCH}_window ON {SCRATCH} (tenant_id, created_at) INCLUDE (status_code)")
    sql(f"CREATE INDEX {SCRATCH}_user ON {SCRATCH} (key_id, end_user, created_at) WHERE end_user <> ''")
    sql(
        f"ALTER TABLE {SCRATCH} ADD CONSTRAINT {SCRATCH}_tenant_fk FOREIGN KEY (tenant_id) "
        "REFERENCES tenants_tenant (id) DEFERRABLE INITIALLY DEFERRED"
    )
    for at, cost, user in [
        (datetime(2026, 9, 30, 23, 59, 59, 999999, tzinfo=UTC), "0.1", ""),
        (datetime(2026, 10, 1, tzinfo=UTC), "0.2", "u1"),
        (datetime(2027, 1, 2, tzinfo=UTC), "0.0000000003", "u2"),
    ]:
        sql(
            f"INSERT INTO {SCRATCH} (id, request_id, created_at, tenant_id, model_requested, status_code, stream, "  # noqa: S608
            "error_code, prompt_tokens, completion_tokens, cost_usd, cache_tier, saved_cost_usd, latency_ms, "
            "fallbacks, model_served, deployment, provider, route, route_reason, escalated_from, end_user) "
            "VALUES (gen_random_uuid(), 'r', %s, %s, 'm', 200, false, '', 1, 2, %s, 'miss', 0, 0, 0, '', '', '', "
            "'', '', '', %s)",
            [at, tenant.pk, Decimal(cost), user],
        )
    yield tenant
    sql(f"DROP TABLE IF EXISTS {SCRATCH}")


def scratch_state() -> tuple[list, set, list]:
    rows = sql(f"SELECT * FROM {SCRATCH} ORDER BY id")  # noqa: S608
    indexes = {
        (name, definition.replace(" ONLY ", " "))
        for name, definition in sql(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname <> %s",
            [SCRATCH, f"{SCRATCH}_pkey"],
        )
    }
    constraints = sql(
        "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass "
        "AND contype IN ('f', 'c') ORDER BY conname",
        [SCRATCH],
    )
    return rows, indexes, constraints


def test_migrating_to_partitions_and_back_keeps_every_row_index_and_constraint(scratch):
    rows, indexes, constraints = scratch_state()
    assert len(rows) == 3 and len(indexes) == 2 and len(constraints) > 5

    with connection.cursor() as cursor:
        partition_table(cursor, SCRATCH, now=datetime(2026, 12, 5, tzinfo=UTC))
        assert is_partitioned(cursor, SCRATCH)
        months = partitions(cursor, SCRATCH)

    # Every month from the oldest row's to three after the current one (past the newest row), and a default one.
    assert sorted(months) == [date(2026, m, 1) for m in (9, 10, 11, 12)] + [date(2027, m, 1) for m in (1, 2, 3)]
    assert scratch_state() == (rows, indexes, constraints)
    assert sql(
        f"SELECT tableoid::regclass::text, cost_usd FROM {SCRATCH} ORDER BY created_at"  # noqa: S608
    ) == [
        (f"{SCRATCH}_y2026m09", Decimal("0.1000000000")),
        (f"{SCRATCH}_y2026m10", Decimal("0.2000000000")),
        (f"{SCRATCH}_y2027m01", Decimal("0.0000000003")),
    ]
    assert sql(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
        [SCRATCH],
    ) == [("PRIMARY KEY (id, created_at)",)]

    with connection.cursor() as cursor:
        unpartition_table(cursor, SCRATCH)
        assert not is_partitioned(cursor, SCRATCH)
    assert scratch_state() == (rows, indexes, constraints)
    assert sql(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
        [SCRATCH],
    ) == [("PRIMARY KEY (id)",)]
    assert sql("SELECT count(*) FROM pg_class WHERE relname LIKE %s", [f"{SCRATCH}_y%"]) == [(0,)]


# --- archiving old months ------------------------------------------------------------------------------

OLD = date(2019, 3, 1)


@pytest.fixture
def old_month(live_db, make_tenant):
    """A tenant with rows in March 2019 (and one in April), rolled up; cleaned away after."""
    tenant = make_tenant()
    at = [datetime(2019, 3, day, hour, tzinfo=UTC) for day, hour in [(1, 0), (1, 5), (17, 9), (31, 23)]]
    rows = [
        entry(tenant, moment, cost, model=model, end_user=user)
        for moment, cost, model, user in zip(
            at,
            ["0.0000000001", "1.25", "0.333", "7"],
            ["gpt-4o-mini", "gpt-4o", "gpt-4o-mini", "gpt-4o"],
            ["", "alice", 'quote"comma,\nnewline', ""],
            strict=True,
        )
    ]
    kept = entry(tenant, datetime(2019, 4, 1, tzinfo=UTC), "2")
    RollupDue.objects.bulk_create(
        RollupDue(tenant=tenant, day=day) for day in {row.created_at.date() for row in [*rows, kept]}
    )
    while spend_roll_up():
        pass
    yield tenant, rows, kept
    LedgerArchive.objects.filter(month=OLD).delete()
    LedgerEntry.objects.filter(tenant=tenant).delete()
    DailyRollup.objects.filter(tenant=tenant).delete()
    for name in ("ledger_archived_y2019m03", "ledger_archived_y2019m03_2"):
        sql(f'DROP TABLE IF EXISTS "{name}"')
    drop_partition(OLD)


def report(tenant) -> list:
    found = spend_report(tenants=[tenant], start=OLD, end=date(2019, 4, 30), group_by=["day", "model"])
    return [(row.day, row.model, row.metrics) for row in found.rows]


def exported(path) -> list[dict]:
    with gzip.open(path, "rt", newline="", encoding="utf-8") as text:
        return list(csv.DictReader(text))


def test_archiving_exports_checks_and_detaches_a_month_and_reports_stay(old_month, tmp_path, caplog):
    tenant, rows, kept = old_month
    before = report(tenant)
    assert sum(metrics["requests"] for _, _, metrics in before) == 5

    call_command("ledger_archive", before="2019-04", to=str(tmp_path))

    # The file holds exactly the month's rows, every value as the ledger had it, amounts exact.
    path = tmp_path / "ledger-2019-03.csv.gz"
    lines = exported(path)
    assert [line["id"] for line in lines] == [str(row.pk) for row in rows]
    assert [Decimal(line["cost_usd"]) for line in lines] == [row.cost_usd for row in rows]
    assert [line["end_user"] for line in lines] == [row.end_user for row in rows]
    archive = LedgerArchive.objects.get(month=OLD)
    assert (archive.rows, archive.cost_usd, archive.path) == (4, Decimal("8.5830000001"), str(path))
    assert archive.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert archive.kept_as == "ledger_archived_y2019m03"
    # Out of the ledger, kept aside as a detached table; April untouched.
    assert list(LedgerEntry.objects.filter(tenant=tenant).values_list("pk", flat=True)) == [kept.pk]
    with connection.cursor() as cursor:
        assert OLD not in partitions(cursor)
    assert sql('SELECT count(*) FROM "ledger_archived_y2019m03"') == [(4,)]
    assert report(tenant) == before  # the rollups stayed

    # A row that comes late for the archived month waits in the ledger; the rollups do not lose the month.
    late = entry(tenant, datetime(2019, 3, 20, tzinfo=UTC), "100")
    RollupDue.objects.create(tenant=tenant, day=date(2019, 3, 20))
    with caplog.at_level("WARNING", logger="billing.services"):
        spend_roll_up()
    assert "archived months got rows late" in caplog.text
    assert where(late.pk) == DEFAULT_PARTITION
    assert report(tenant) == before
    # The next run archives it in a file of its own, dropping the table this time.
    call_command("ledger_archive", before="2019-04", to=str(tmp_path), drop=True)
    assert [line["id"] for line in exported(tmp_path / "ledger-2019-03-2.csv.gz")] == [str(late.pk)]
    assert sql("SELECT to_regclass('ledger_archived_y2019m03_2')") == [(None,)]
    assert list(LedgerArchive.objects.filter(month=OLD).values_list("rows", "kept_as")) == [
        (1, ""),
        (4, "ledger_archived_y2019m03"),
    ]

    # Both files put back: every row as it was, once, however often restored; the month is the
    # ledger's again (no archive record left, so its rollups follow the ledger again).
    everything = sorted([*rows, late, kept], key=lambda row: row.pk)
    files = [str(path), str(tmp_path / "ledger-2019-03-2.csv.gz")]
    call_command("ledger_restore", *files)
    call_command("ledger_restore", *files)
    restored = LedgerEntry.objects.filter(tenant=tenant).order_by("pk")
    assert [(row.pk, row.created_at, row.cost_usd, row.end_user, row.model_requested) for row in restored] == [
        (row.pk, row.created_at, row.cost_usd, row.end_user, row.model_requested) for row in everything
    ]
    assert {where(row.pk) for row in rows} == {f"{TABLE}_y2019m03"}
    assert not LedgerArchive.objects.filter(month=OLD).exists()


def test_restoring_what_is_no_export_is_refused_and_changes_nothing(old_month, tmp_path):
    tenant, _, _ = old_month
    not_gzip = tmp_path / "notes.csv.gz"
    not_gzip.write_text("id,cost_usd\n1,2\n")
    foreign = tmp_path / "foreign.csv.gz"
    with gzip.open(foreign, "wt") as out:
        out.write("id,created_at,password\nx,2019-03-01,hunter2\n")
    bad_value = tmp_path / "bad.csv.gz"
    with gzip.open(bad_value, "wt") as out:
        out.write("id,created_at,cost_usd\nnot-a-uuid,2019-03-01 00:00:00+00,1\n")
    for path, message in [
        (not_gzip, "Not a gzipped file"),
        (foreign, "header names columns the ledger does not have"),
        (bad_value, "invalid input syntax for type uuid"),
        (tmp_path / "missing.csv.gz", "No such file"),
    ]:
        with pytest.raises(CommandError, match=message):
            call_command("ledger_restore", str(path))
    assert LedgerEntry.objects.filter(tenant=tenant).count() == 5
    with connection.cursor() as cursor:
        assert OLD not in partitions(cursor)


def test_a_month_that_cannot_get_its_locks_in_time_stays_whole(old_month, tmp_path, test_database_name):
    """Another session reading the ledger holds its partitions: the month's attach (or detach) waits
    its --lock-timeout, then everything of that month rolls back, the file included."""
    tenant, _, _ = old_month
    with psycopg.connect(database_url_for(test_database_name)) as reader:
        reader.execute(f"SELECT count(*) FROM {TABLE}")  # noqa: S608 - its transaction stays open
        with pytest.raises(CommandError, match="lock timeout; nothing of that month changed"):
            call_command("ledger_archive", before="2019-04", to=str(tmp_path), lock_timeout=0.5)
    assert list(tmp_path.iterdir()) == []
    assert not LedgerArchive.objects.filter(month=OLD).exists()
    assert LedgerEntry.objects.filter(tenant=tenant).count() == 5
    assert {where(row) for row in LedgerEntry.objects.filter(tenant=tenant).values_list("pk", flat=True)} == {
        DEFAULT_PARTITION
    }


@pytest.mark.parametrize(
    ("before", "message"),
    [
        ("2019-3-01", "--before takes a month as YYYY-MM"),
        (f"{next_month(month_of(datetime.now(UTC))):%Y-%m}", "Only months already over can be archived"),
    ],
)
def test_archiving_refuses_a_bad_month_and_changes_nothing(old_month, tmp_path, before, message):
    tenant, _, _ = old_month
    with pytest.raises(CommandError, match=message):
        call_command("ledger_archive", before=before, to=str(tmp_path))
    assert LedgerEntry.objects.filter(tenant=tenant).count() == 5
    assert not LedgerArchive.objects.filter(month=OLD).exists()
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_lists_the_months_and_changes_nothing(old_month, tmp_path, capsys):
    tenant, _, _ = old_month
    call_command("ledger_archive", before="2019-04", to=str(tmp_path), dry_run=True)
    assert "would archive 2019-03" in capsys.readouterr().out
    assert LedgerEntry.objects.filter(tenant=tenant).count() == 5
    assert list(tmp_path.iterdir()) == []
