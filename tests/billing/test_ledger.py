"""The ledger's path: hand-off to the Redis stream, batches into Postgres, idempotence, refused
records, and what survives a kill -9 of a Celery worker holding a batch or of a web process that
just answered."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal

import openai
import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.db.models import Sum
from django.db.models.functions import TruncDate
from openai import AsyncOpenAI

from billing.ledger import COLUMNS, DEAD_LETTERS, GROUP, STREAM, LedgerRecord, drain, hand_off
from billing.models import DailyRollup, LedgerEntry, RollupDue
from billing.selectors import ledger_totals, spend_in_period, spend_report
from billing.services import spend_roll_up
from sentinel.celery import app as celery_app
from sentinel.redis_clients import sync_redis
from tests.billing.conftest import drain_all, hand_off_all, record
from tests.servers import database_url_for, free_port, start_celery_worker, start_gateway


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
        (r.day, r.key_id, r.model, r.price_id): {
            "requests": r.requests,
            "successful_requests": r.successful_requests,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "cost_usd": r.cost_usd,
            "exact_hits": r.exact_hits,
            "semantic_hits": r.semantic_hits,
            "saved_cost_usd": r.saved_cost_usd,
        }
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
    assert RollupDue.objects.filter(tenant=tenant, day=datetime(2026, 5, 1).date()).exists()


def test_rows_mark_their_tenant_days_for_the_rollup(empty_queue, tenant):
    days = [datetime(2026, 3, d, 12, tzinfo=UTC) for d in (1, 1, 2)]
    hand_off_all([record(tenant, at=at) for at in days])
    drain_all()
    assert set(RollupDue.objects.filter(tenant=tenant).values_list("day", flat=True)) == {
        datetime(2026, 3, 1).date(),
        datetime(2026, 3, 2).date(),
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


def test_a_refused_record_goes_to_dead_letters_and_the_rest_go_in(empty_queue, tenant):
    client = sync_redis()
    dead_before = client.xlen(DEAD_LETTERS)
    good = [record(tenant, request_id=f"good{i}") for i in range(5)]
    orphan = LedgerRecord(
        request_id="orphan", tenant_id=2_000_000_000, key_id=None, model_requested="m", status_code=200
    )
    hand_off_all(good[:2] + [orphan] + good[2:])
    client.xadd(STREAM, {"r": b"{not json"})

    drain_all()

    assert set(LedgerEntry.objects.filter(tenant=tenant).values_list("request_id", flat=True)) == {
        f"good{i}" for i in range(5)
    }
    assert not LedgerEntry.objects.filter(request_id="orphan").exists()
    assert client.xlen(STREAM) == 0
    dead = client.xrange(DEAD_LETTERS)[dead_before:]
    reasons = {fields[b"r"]: fields[b"reason"].decode() for _, fields in dead}
    assert reasons[orphan.encode()].startswith("refused by Postgres")
    assert reasons[b"{not json"].startswith("unreadable record")
    client.xdel(DEAD_LETTERS, *[message_id for message_id, _ in dead])


# --- crashes -----------------------------------------------------------------------------------


@contextmanager
def ledger_table_locked(database: str):
    """Hold a lock every INSERT into the ledger must wait for (SELECTs still pass)."""
    with psycopg.connect(database_url_for(database)) as conn:
        conn.execute("LOCK TABLE billing_ledgerentry IN SHARE ROW EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


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
        except Exception:  # cut off by the kill: connection reset or refused, stream broken off
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
