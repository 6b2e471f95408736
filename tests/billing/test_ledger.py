"""The ledger's path: hand-off to the Redis stream, batches into Postgres, idempotence, refused
records, and what survives a kill -9 of a Celery worker holding a batch or of a web process that
just answered."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import os
import signal
import socket
import time
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from types import SimpleNamespace

import django.db
import openai
import orjson
import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.db.models import Sum
from django.db.models.functions import TruncDate
from openai import AsyncOpenAI

from billing.ledger import COLUMNS, GROUP, OLD_DEAD_LETTERS, STREAM, drain, hand_off, hand_off_encoded
from billing.models import DailyRollup, LedgerDeadLetter, LedgerEntry, RollupDue
from billing.partitions import month_of, partition_name
from billing.selectors import METRICS, ledger_totals, spend_in_period, spend_report
from billing.services import spend_roll_up
from sentinel.celery import app as celery_app
from sentinel.redis_clients import async_redis, sync_redis
from tests.billing.conftest import drain_all, hand_off_all, record
from tests.conftest import wait_for
from tests.servers import database_url_for, free_port, scrape_metrics, start_celery_worker, start_gateway


def ask(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def pending_by_consumer() -> dict[str, int]:
    info = sync_redis().xpending(STREAM, GROUP)
    return {
        (c["name"].decode() if isinstance(c["name"], bytes) else c["name"]): int(c["pending"])
        for c in info["consumers"]
    }


def rollups_match_ledger(tenant) -> None:
    """Every rollup row of the tenant equals the ledger's sums for its group, and no group is missing."""
    dims = ["day", "key_id", "model_requested", "price_id"]
    ledger = {
        tuple(row.pop(d) for d in dims): row
        for row in ledger_totals(
            LedgerEntry.objects.filter(tenant=tenant).annotate(day=TruncDate("created_at", tzinfo=UTC)), dims
        )
    }
    rollups = {
        (r.day, r.key_id, r.model, r.price_id): {name: getattr(r, name) for name in METRICS}
        for r in DailyRollup.objects.filter(tenant=tenant)
    }
    assert rollups == ledger


# --- the batch path ----------------------------------------------------------------------------


def test_a_record_carries_every_column_of_the_ledger():
    assert set(COLUMNS) == {f.attname for f in LedgerEntry._meta.concrete_fields}


def test_every_record_reaches_postgres_once(empty_queue, tenant):
    records = [record(tenant, request_id=f"r{i}") for i in range(2500)]  # three batches
    hand_off_all(records)
    assert drain() == 2500

    assert set(LedgerEntry.objects.filter(tenant=tenant).values_list("id", flat=True)) == {
        uuid.UUID(r.id) for r in records
    }
    # The same records again (a worker that died after its insert, before its acknowledgement):
    hand_off_all(records[:700])
    drain_all()
    assert LedgerEntry.objects.filter(tenant=tenant).count() == 2500
    assert sync_redis().xlen(STREAM) == 0


def test_request_ids_may_repeat_the_record_id_is_the_key(empty_queue, tenant):
    """A client may send the same x-sentinel-request-id twice: two requests, two rows."""
    hand_off_all([record(tenant, request_id="client-chosen"), record(tenant, request_id="client-chosen")])
    drain_all()
    assert LedgerEntry.objects.filter(tenant=tenant, request_id="client-chosen").count() == 2


def test_while_redis_is_unreachable_a_record_goes_straight_to_postgres(empty_queue, tenant, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    lone = record(tenant, at=datetime(2026, 5, 1, 8, tzinfo=UTC), request_id="no-redis")

    async def hand_off_and_hang_up() -> None:
        await hand_off(lone)
        await sync_to_async(connections.close_all)()  # the insert's thread holds a connection

    asyncio.run(hand_off_and_hang_up())
    row = LedgerEntry.objects.get(tenant=tenant)
    assert (str(row.id), row.request_id, row.cost_usd) == (lone.id, "no-redis", Decimal(lone.cost_usd))
    assert RollupDue.objects.filter(tenant=tenant, day=date(2026, 5, 1)).exists()


def test_rows_mark_their_tenant_days_for_the_rollup(empty_queue, tenant):
    days = [datetime(2026, 3, d, 12, tzinfo=UTC) for d in (1, 1, 2)]
    hand_off_all([record(tenant, at=at) for at in days])
    drain_all()
    assert set(RollupDue.objects.filter(tenant=tenant).values_list("day", flat=True)) == {
        date(2026, 3, 1),
        date(2026, 3, 2),
    }


def test_batches_move_keys_last_used_time_forward_only(empty_queue, tenant, make_virtual_key):
    key, other = make_virtual_key(tenant), make_virtual_key(tenant)
    times = [datetime(2026, 5, 1, 10, minute, tzinfo=UTC) for minute in (7, 3, 9, 1)]
    hand_off_all([record(tenant, key=key, at=at, request_id=f"used-{i}") for i, at in enumerate(times)])
    drain_all()
    key.refresh_from_db()
    other.refresh_from_db()
    assert key.last_used_at == max(times)
    assert other.last_used_at is None  # keys without requests in the batch are not touched

    hand_off_all([record(tenant, key=key, at=datetime(2026, 5, 1, 9, tzinfo=UTC), request_id="late")])
    drain_all()
    key.refresh_from_db()
    assert key.last_used_at == max(times)  # an older record arriving late never moves it back


# --- refused records -----------------------------------------------------------------------------


@dataclass
class Poison:
    """A stream message the ledger cannot take, and the dead letter it must become."""

    message: dict
    kind: str
    reason: str  # the dead letter's reason starts with this
    tenant: object | None  # the tenant the dead letter names

    @property
    def raw(self) -> bytes:
        """What the dead letter keeps: the record, or the whole message (as Redis returns it) without one."""
        if "r" in self.message:
            return self.message["r"]
        return repr({name.encode(): value for name, value in self.message.items()}).encode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()


def partition_of(message: dict) -> str:
    """The ledger partition (billing/partitions.py) a record's row goes to: its month's."""
    created = datetime.fromtimestamp(orjson.loads(message["r"])["created_at"], UTC)
    return partition_name(month_of(created))


def poisons(tenant) -> dict[str, Poison]:
    """Every kind of refusal: values psycopg will not send, values and rows PostgreSQL refuses, and
    messages that are no ledger record at all."""

    def changed(name: str, **fields) -> dict:
        data = orjson.loads(record(tenant, request_id=f"poison-{name}").encode())
        return {"r": orjson.dumps({**data, **fields})}

    def value(name: str, reason: str, **fields) -> Poison:
        return Poison(changed(name, **fields), "value", reason, tenant)

    def undecodable(message: dict, reason: str) -> Poison:
        return Poison(message, "undecodable", f"not a ledger record: {reason}", None)

    missing = orjson.loads(record(tenant).encode())
    del missing["tenant_id"]
    unique = uuid.uuid4().hex  # every message new, so each must become a new dead letter
    return {
        "nul in a string": value(
            "nul",
            "refused by psycopg: PostgreSQL text fields cannot contain NUL (0x00) bytes",
            model_requested="gpt\x00",
        ),
        "nul in json": value(
            "nul-json",
            "refused by PostgreSQL (22P05): unsupported Unicode escape sequence; \\u0000 cannot be converted to text.",
            screening={"checks": ["pii\x00"]},
        ),
        "oversize model": value(
            "long-model",
            "refused by PostgreSQL (22001): value too long for type character varying(200)",
            model_requested="m" * 5000,
        ),
        "oversize request id": Poison(
            changed("long-id", request_id="r" * 1000),
            "value",
            "refused by PostgreSQL (22001): value too long for type character varying(128)",
            tenant,
        ),
        "out of range": value(
            "range", 'refused by PostgreSQL (22003): value "70000" is out of range for type smallint', status_code=70000
        ),
        "not an amount": value("nan", "invalid value: cost_usd 'NaN' is not an amount", cost_usd="NaN"),
        "not a uuid": value("uuid", "invalid value: id 'not-a-uuid' is not a UUID", id="not-a-uuid"),
        "not a time": value("time", "invalid value: created_at 1e+20 is not a time", created_at=1e20),
        "no such tenant": Poison(
            orphan := changed("orphan", tenant_id=2_000_000_000),
            "constraint",
            f'refused by PostgreSQL (23503): insert or update on table "{partition_of(orphan)}" violates foreign '
            'key constraint "billing_ledgerentry_tenant_id_',
            None,
        ),
        "negative tokens": Poison(
            negative := changed("negative", prompt_tokens=-5),
            "constraint",
            f'refused by PostgreSQL (23514): new row for relation "{partition_of(negative)}" violates check '
            'constraint "billing_ledgerentry_prompt_tokens_check"',
            tenant,
        ),
        "not json": undecodable({"r": f"{{not json {unique}".encode()}, "not JSON ("),
        "not an object": undecodable({"r": f'[1, "{unique}"]'.encode()}, "a JSON array"),
        "a field missing": Poison(
            {"r": orjson.dumps(missing)}, "undecodable", "not a ledger record: no tenant_id", None
        ),
        "a field of the wrong type": Poison(
            changed("type", prompt_tokens="eleven"),
            "undecodable",
            "not a ledger record: prompt_tokens is a JSON string",
            tenant,
        ),
        "no record in the message": undecodable({"x": unique.encode()}, "the message carries none"),
    }


def dead_letter_of(poison: Poison) -> LedgerDeadLetter:
    return LedgerDeadLetter.objects.get(digest=poison.digest)


def assert_set_aside(poison: Poison, *, stream: bool = True) -> None:
    letter = dead_letter_of(poison)
    assert (letter.kind, letter.tenant_id) == (poison.kind, poison.tenant.pk if poison.tenant else None)
    assert letter.reason.startswith(poison.reason), letter.reason
    assert bytes(letter.record) == poison.raw
    assert bool(letter.stream_id) is stream


async def answered_requests(gateway, api_keys: list[str], alias: str, count: int) -> list[tuple[str, Decimal]]:
    """`count` chat completions per key, all keys at once (request id, cost billed per the headers)."""
    clients = [AsyncOpenAI(base_url=gateway.base_url, api_key=k, max_retries=0, timeout=60) for k in api_keys]

    async def one(client, i: int) -> tuple[str, Decimal]:
        raw = await client.chat.completions.with_raw_response.create(
            model=alias, messages=ask(f"question {uuid.uuid4().hex} {i}"), max_tokens=1 + i % 30
        )
        return raw.headers["x-sentinel-request-id"], Decimal(raw.headers["x-sentinel-cost-usd"])

    try:
        return await asyncio.gather(*(one(client, i) for client in clients for i in range(count)))
    finally:
        for client in clients:
            await client.close()


def test_poison_amid_other_tenants_traffic_is_set_aside_and_every_answer_is_billed(
    gateway, empty_queue, make_tenant, make_key, make_model
):
    """The issue's case and every variant: bad records queued between other tenants' answered
    requests. One drain bills every answered request and sets each bad record aside, with its reason,
    counted in /metrics."""
    alias, _ = make_model()
    a, b, attacker = make_tenant(), make_tenant(), make_tenant()
    keys = {a: make_key(a), b: make_key(b)}
    bad = poisons(attacker)
    before = scrape_metrics(gateway.url)

    async def traffic_with_poison_in_the_middle() -> list[tuple[str, Decimal]]:
        answered = await answered_requests(gateway, list(keys.values()), alias, 20)
        redis = async_redis()
        for poison in bad.values():
            await redis.xadd(STREAM, poison.message)
        return answered + await answered_requests(gateway, list(keys.values()), alias, 20)

    answered = dict(asyncio.run(traffic_with_poison_in_the_middle()))
    queued = scrape_metrics(gateway.url)
    assert queued.value("sentinel_ledger_queued_records") == 80 + len(bad)
    assert queued.value("sentinel_ledger_oldest_record_age_seconds") > 0

    drain_all()

    rows = LedgerEntry.objects.filter(tenant__in=[a, b])
    assert len(answered) == 80
    assert dict(rows.values_list("request_id", "cost_usd")) == answered
    assert rows.count() == 80
    assert {tenant: rows.filter(tenant=tenant).count() for tenant in keys} == {a: 40, b: 40}
    assert rows.aggregate(s=Sum("cost_usd"))["s"] == sum(answered.values())
    assert not LedgerEntry.objects.filter(tenant=attacker).exists()
    for poison in bad.values():
        assert_set_aside(poison)
    assert sync_redis().xlen(STREAM) == 0
    after = scrape_metrics(gateway.url)
    kinds = Counter(poison.kind for poison in bad.values())
    for kind in ("undecodable", "value", "constraint", "other"):
        counted = after.value("sentinel_ledger_dead_letters_total", reason=kind)
        assert counted - before.value("sentinel_ledger_dead_letters_total", reason=kind) == kinds[kind], kind
    assert (
        after.value("sentinel_ledger_queued_records"),
        after.value("sentinel_ledger_oldest_record_age_seconds"),
    ) == (
        0,
        0,
    )


POISONS = list(poisons(SimpleNamespace(pk=0)))  # their names


@pytest.mark.parametrize("name", POISONS)
def test_a_refused_record_is_set_aside_and_its_batch_goes_in(empty_queue, make_tenant, name):
    tenant, attacker = make_tenant(), make_tenant()
    poison = poisons(attacker)[name]
    good = [record(tenant, request_id=f"good{i}", cost=f"0.00{i + 1}") for i in range(9)]
    hand_off_all(good[:4])
    sync_redis().xadd(STREAM, poison.message)
    hand_off_all(good[4:])

    drain_all()

    rows = LedgerEntry.objects.filter(tenant=tenant)
    assert dict(rows.values_list("request_id", "cost_usd")) == {r.request_id: Decimal(r.cost_usd) for r in good}
    assert not LedgerEntry.objects.filter(tenant=attacker).exists()
    assert_set_aside(poison)
    assert sync_redis().xlen(STREAM) == 0
    # Queued again (a worker that died before its acknowledgement): still one dead letter.
    sync_redis().xadd(STREAM, poison.message)
    drain_all()
    assert LedgerDeadLetter.objects.filter(digest=poison.digest).count() == 1


def test_several_refused_records_in_a_large_batch_all_go_aside_and_the_rest_in(empty_queue, make_tenant):
    tenant, attacker = make_tenant(), make_tenant()
    bad = poisons(attacker)
    good = [record(tenant, request_id=f"many{i}") for i in range(900)]
    client = sync_redis()
    for i, poison in enumerate(bad.values()):
        hand_off_all(good[i * 60 : (i + 1) * 60])
        client.xadd(STREAM, poison.message)

    drain_all()

    assert LedgerEntry.objects.filter(tenant=tenant).count() == 900
    for poison in bad.values():
        assert_set_aside(poison)
    assert client.xlen(STREAM) == 0


def drain_in_its_own_session(*session_sql: str) -> Future:
    """A drain on a database session of its own (a thread's), after `session_sql`; its outcome."""

    def run() -> int:
        try:
            with connection.cursor() as cursor:
                for sql in session_sql:
                    cursor.execute(sql)
            return drain()
        finally:
            connections.close_all()

    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future


def fail_on_lock_timeout(database: str, tenant, good) -> BaseException:
    with ledger_table_locked(database):
        return drain_in_its_own_session("SET lock_timeout = '200ms'").exception(timeout=60)


def fail_on_statement_timeout(database: str, tenant, good) -> BaseException:
    with ledger_table_locked(database):
        return drain_in_its_own_session("SET statement_timeout = '200ms'").exception(timeout=60)


def fail_on_a_lost_connection(database: str, tenant, good) -> BaseException:
    with ledger_table_locked(database):
        outcome = drain_in_its_own_session()
        backend = wait_for(blocked_ledger_insert, 60, "the drain's INSERT to wait on the lock")
        with psycopg.connect(database_url_for(database), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [backend])
        return outcome.exception(timeout=60)


def fail_on_a_serialization_failure(database: str, tenant, good) -> BaseException:
    """The drain's snapshot predates a row another session commits with one of its ids: under
    repeatable read, its ON CONFLICT cannot decide, and PostgreSQL answers 40001."""
    with ledger_table_locked(database) as other:
        outcome = drain_in_its_own_session("SET default_transaction_isolation = 'repeatable read'")
        wait_for(blocked_ledger_insert, 60, "the drain's INSERT to wait on the lock")
        taken = good[0]
        other.execute(
            "INSERT INTO billing_ledgerentry (id, request_id, created_at, tenant_id, model_requested, status_code, "
            "stream, error_code, prompt_tokens, completion_tokens, cost_usd, cache_tier, saved_cost_usd, latency_ms, "
            "fallbacks, model_served, deployment, provider, route, route_reason, escalated_from) "
            "VALUES (%s, %s, %s, %s, 'm', 200, false, '', 11, 40, %s, 'miss', 0, 0, 0, '', '', '', '', '', '')",
            [
                taken.id,
                taken.request_id,
                datetime.fromtimestamp(taken.created_at, UTC),  # the key is (id, created_at): the same row
                tenant.pk,
                Decimal(taken.cost_usd),
            ],
        )
        other.commit()
        return outcome.exception(timeout=60)


def fail_with_the_database_unreachable(database: str, tenant, good) -> BaseException:
    """The process's connection pool pointed where nothing listens, as when PostgreSQL is down."""
    saved = copy.deepcopy(connection.settings_dict)
    connection.close()
    connection.close_pool()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    connection.settings_dict["OPTIONS"]["pool"] = {**saved["OPTIONS"]["pool"], "timeout": 1}
    try:
        with pytest.raises(Exception) as failure:  # noqa: PT011 - the caller asserts which one
            drain()
        return failure.value
    finally:
        connection.close()
        connection.close_pool()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


TRANSIENT = {
    "lock timeout": (fail_on_lock_timeout, "55P03"),
    "statement timeout": (fail_on_statement_timeout, "57014"),
    "connection lost": (fail_on_a_lost_connection, "57P01"),
    "serialization failure": (fail_on_a_serialization_failure, "40001"),
    "database unreachable": (fail_with_the_database_unreachable, None),
}


@pytest.mark.parametrize("name", TRANSIENT)
def test_the_databases_own_failures_set_nothing_aside_and_a_retry_lands_everything(
    empty_queue, make_tenant, test_database_name, settings, name
):
    """Faults of the database rather than of the records (each made for real) leave every record
    queued, the bad one included; nothing is set aside, nothing acknowledged. The retry lands each
    good record once and sets the bad one aside."""
    fail, sqlstate = TRANSIENT[name]
    tenant, attacker = make_tenant(), make_tenant()
    poison = poisons(attacker)["nul in a string"]
    good = [record(tenant, request_id=f"transient{i}", cost=f"0.0{i + 1}") for i in range(6)]
    hand_off_all(good[:3])
    sync_redis().xadd(STREAM, poison.message)
    hand_off_all(good[3:])
    dead_before = LedgerDeadLetter.objects.count()

    error = fail(test_database_name, tenant, good)

    assert isinstance(error, (django.db.OperationalError, psycopg.OperationalError)), repr(error)
    cause = error.__cause__ if isinstance(error, django.db.Error) else error
    assert getattr(cause, "sqlstate", None) == sqlstate
    assert LedgerDeadLetter.objects.count() == dead_before
    assert sync_redis().xlen(STREAM) == 7
    assert sum(pending_by_consumer().values()) == 7
    landed = 1 if name == "serialization failure" else 0  # the other session's row
    assert LedgerEntry.objects.filter(tenant=tenant).count() == landed

    settings.LEDGER_CLAIM_IDLE_MS = 0  # take the failed batch back now rather than in 30 s
    drain_all()

    rows = LedgerEntry.objects.filter(tenant=tenant)
    assert dict(rows.values_list("request_id", "cost_usd")) == {r.request_id: Decimal(r.cost_usd) for r in good}
    assert_set_aside(poison)
    assert LedgerDeadLetter.objects.count() == dead_before + 1
    assert sync_redis().xlen(STREAM) == 0


def test_with_redis_unreachable_a_refused_record_is_set_aside_not_raised(empty_queue, make_tenant, settings):
    """The direct write (Redis away) runs inside the request that handed the record off: a refused
    record is set aside there too, and the request goes on."""
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    tenant, attacker = make_tenant(), make_tenant()
    bad = {name: poison for name, poison in poisons(attacker).items() if "r" in poison.message}
    good = record(tenant, request_id="direct-good")

    async def hand_off_everything() -> None:
        for poison in bad.values():
            await hand_off_encoded(poison.message["r"])
        await hand_off(good)
        await sync_to_async(connections.close_all)()  # the inserts' thread holds a connection

    asyncio.run(hand_off_everything())

    for poison in bad.values():
        assert_set_aside(poison, stream=False)
    assert list(LedgerEntry.objects.filter(tenant=tenant).values_list("request_id", flat=True)) == ["direct-good"]
    assert not LedgerEntry.objects.filter(tenant=attacker).exists()


def test_dead_letters_an_earlier_version_kept_in_redis_move_to_the_table(empty_queue, tenant):
    client = sync_redis()
    old = record(tenant, request_id="old-dead-letter")
    client.xadd(
        OLD_DEAD_LETTERS,
        {"r": old.encode(), "reason": b"refused by Postgres: something", "stream_id": b"1767225600000-0"},
    )

    drain_all()

    letter = LedgerDeadLetter.objects.get(digest=hashlib.sha256(old.encode()).hexdigest())
    assert (letter.kind, letter.reason, letter.tenant_id, letter.request_id) == (
        "other",
        "refused by Postgres: something",
        tenant.pk,
        "old-dead-letter",
    )
    assert (letter.stream_id, letter.queued_at) == ("1767225600000-0", datetime(2026, 1, 1, tzinfo=UTC))
    assert client.xlen(OLD_DEAD_LETTERS) == 0


# --- crashes -----------------------------------------------------------------------------------


@contextmanager
def ledger_table_locked(database: str):
    """Hold a lock every INSERT into the ledger must wait for (SELECTs still pass); yields the
    session holding it (commit to let go)."""
    with psycopg.connect(database_url_for(database)) as conn:
        conn.execute("LOCK TABLE billing_ledgerentry IN SHARE ROW EXCLUSIVE MODE")
        try:
            yield conn
        finally:
            conn.rollback()


def blocked_ledger_insert() -> int | None:
    """The pid of a backend whose ledger INSERT waits for a lock, if one does."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND query LIKE 'INSERT INTO billing_ledgerentry%%'"
        )
        row = cursor.fetchone()
    return row[0] if row else None


def backend_gone(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0] == 0


@pytest.mark.parametrize("moment", ["waiting_for_its_insert", "after_its_commit_before_its_ack"])
def test_worker_killed_holding_a_batch_loses_and_duplicates_nothing(
    moment, empty_queue, tenant, make_virtual_key, test_database_name
):
    key = make_virtual_key(tenant)
    records = [record(tenant, key=key, request_id=f"batch{i}", cost=f"0.00000{i % 9 + 1}") for i in range(300)]
    hand_off_all(records)
    redis = sync_redis()
    fast_claim = {"SENTINEL_LEDGER_CLAIM_IDLE_MS": "1000"}
    worker = start_celery_worker(test_database_name, env=fast_claim)
    try:
        with ledger_table_locked(test_database_name):
            celery_app.send_task("billing.tasks.drain_ledger")
            backend = wait_for(blocked_ledger_insert, 60, "the worker's INSERT to wait on the lock")
            consumer = f"{socket.gethostname()}-{worker.pid}"
            assert pending_by_consumer() == {consumer: 300}  # it holds the whole batch
            if moment == "waiting_for_its_insert":
                worker.kill()
            else:
                redis.client_pause(30_000, all=False)  # writes (its XACK) wait; its commit does not
        try:
            if moment == "after_its_commit_before_its_ack":
                wait_for(lambda: LedgerEntry.objects.filter(tenant=tenant).count() == 300, 30, "the commit")
                worker.kill()
        finally:
            redis.client_unpause()
        wait_for(lambda: backend_gone(backend), 30, "the dead worker's database session to end")

        # The batch is in Postgres (or not) exactly as far as the dead worker got, and still pending.
        expected_before = 0 if moment == "waiting_for_its_insert" else 300
        assert LedgerEntry.objects.filter(tenant=tenant).count() == expected_before
        assert pending_by_consumer() == {consumer: 300}

        worker = start_celery_worker(test_database_name, env=fast_claim)

        asked = [0.0]

        def drained() -> bool:
            if time.monotonic() - asked[0] > 1.0:  # what beat does: ask again every second
                celery_app.send_task("billing.tasks.drain_ledger")
                asked[0] = time.monotonic()
            return redis.xlen(STREAM) == 0 and not pending_by_consumer()

        wait_for(drained, 90, "a new worker to take the batch over")
    finally:
        worker.stop()
        celery_app.control.purge()

    rows = LedgerEntry.objects.filter(tenant=tenant)
    assert rows.count() == 300
    assert set(rows.values_list("id", flat=True)) == {uuid.UUID(r.id) for r in records}
    assert rows.aggregate(s=Sum("cost_usd"))["s"] == sum(Decimal(r.cost_usd) for r in records)
    spend_roll_up()
    rollups_match_ledger(tenant)


async def load_until_killed(gateway, api_key: str, alias: str, *, answers: int, concurrency: int) -> tuple:
    """Requests with client-chosen ids, half of them streamed; kill -9 the gateway as soon as
    `answers` were fully received, with other requests still in flight."""
    client = AsyncOpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30)
    sent, answered = set(), set()
    killed = asyncio.Event()
    counter = iter(range(10_000))

    async def one(i: int) -> None:
        request_id = f"crash-{uuid.uuid4().hex}"
        sent.add(request_id)
        headers = {"x-sentinel-request-id": request_id}
        try:
            if i % 2:
                stream = await client.chat.completions.create(
                    model=alias, messages=ask(f"stream {i}"), stream=True, extra_headers=headers
                )
                async for _ in stream:
                    pass
            else:
                await client.chat.completions.create(model=alias, messages=ask(f"plain {i}"), extra_headers=headers)
        except Exception:  # noqa: BLE001 - cut off by the kill: connection reset or refused, stream broken off
            return
        answered.add(request_id)
        if len(answered) >= answers and not killed.is_set():
            os.killpg(gateway.process.pid, signal.SIGKILL)
            killed.set()

    async def worker() -> None:
        for i in counter:
            if killed.is_set():
                return
            await one(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return sent, answered


def test_web_process_killed_right_after_answering_loses_nothing(
    test_database_name, mock_provider, tenant, make_key, make_model
):
    alias, _ = make_model()
    api_key = make_key(tenant)
    server = start_gateway(test_database_name)
    try:
        sent, answered = asyncio.run(load_until_killed(server, api_key, alias, answers=150, concurrency=8))
    finally:
        server.stop()
    assert server.process.returncode == -signal.SIGKILL

    drain_all()
    counts = Counter(LedgerEntry.objects.filter(tenant=tenant).values_list("request_id", flat=True))
    assert len(answered) >= 150
    assert all(counts[request_id] == 1 for request_id in answered), "an answered request has no ledger row"
    assert max(counts.values()) == 1  # none twice
    assert set(counts) <= sent
    assert LedgerEntry.objects.filter(request_id__in=answered, status_code=200).count() == len(answered)


# --- a thousand requests -----------------------------------------------------------------------


async def thousand_requests(gateway, keys: list[str], alias: str, total: int, concurrency: int) -> list[tuple]:
    clients = [AsyncOpenAI(base_url=gateway.base_url, api_key=k, max_retries=0, timeout=60) for k in keys]
    results = []
    counter = iter(range(total))

    async def worker() -> None:
        for i in counter:
            client = clients[i % len(clients)]
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model=alias, messages=ask(f"question {i}"), max_tokens=1 + i % 40
                )
                results.append((200, raw.headers["x-sentinel-request-id"], Decimal(raw.headers["x-sentinel-cost-usd"])))
            except openai.APIStatusError as error:
                results.append((error.status_code, error.response.headers["x-sentinel-request-id"], None))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    for client in clients:
        await client.close()
    return results


def test_a_thousand_requests_reconcile_ledger_headers_and_rollups(gateway, mock_provider, tenant, make_key, make_model):
    alias, (provider,) = make_model()
    # Failures retrying cannot cure (a 5xx would be retried into a success): they reach the client.
    mock_provider.control(provider, error_rate=0.02, error_status=400)
    keys = [make_key(tenant), make_key(tenant)]
    started = datetime.now(UTC)

    results = asyncio.run(thousand_requests(gateway, keys, alias, total=1000, concurrency=16))
    drain_all()

    successes = [r for r in results if r[0] == 200]
    assert len(results) == 1000
    assert {status for status, _, _ in results} == {200, 400}
    assert 0 < 1000 - len(successes) < 100  # the provider's injected failures
    rows = LedgerEntry.objects.filter(tenant=tenant)
    assert rows.count() == 1000  # refused requests are recorded too, at zero cost
    assert rows.filter(status_code=200).count() == len(successes)
    header_total = sum(cost for _, _, cost in successes)
    assert rows.aggregate(s=Sum("cost_usd"))["s"] == header_total
    by_request = dict(rows.values_list("request_id", "cost_usd"))
    assert all(by_request[request_id] == cost for _, request_id, cost in successes)

    spend_roll_up()
    rollups_match_ledger(tenant)
    assert DailyRollup.objects.filter(tenant=tenant).aggregate(s=Sum("requests"))["s"] == 1000
    assert spend_in_period(tenant_id=tenant.pk, start=started, end=datetime.now(UTC)) == (header_total)
    report = spend_report(tenants=[tenant], start=started.date(), end=datetime.now(UTC).date(), group_by=["key"])
    assert report.totals.metrics["cost_usd"] == header_total
    assert report.totals.metrics["successful_requests"] == len(successes)
    assert len(report.rows) == 2
