"""Leases on batch items, against the real database: one holder at a time, a lapsed holder cannot
write, a repeated run is billed once, and closing a batch writes its files once."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import orjson
import pytest
from django.db import connection
from django.utils import timezone

from billing.ledger import LedgerRecord, drain, hand_off
from billing.models import LedgerEntry
from gateway.batches import services
from gateway.batches.models import Batch, BatchFile, BatchItem
from gateway.call import Queued
from tenants.models import VirtualKey
from tests.gateway.batches.conftest import stored_batch


@pytest.fixture
def make_batch(make_tenant, make_key):
    def make(items: int) -> Batch:
        tenant = make_tenant()
        make_key(tenant)
        batch = stored_batch(tenant, VirtualKey.objects.get(tenant=tenant))
        BatchItem.objects.bulk_create(
            [BatchItem(batch=batch, line=i, custom_id=f"c{i}", body={"n": i}) for i in range(1, items + 1)]
        )
        return batch

    return make


def claim(batch: Batch, owner: str, count: int, lease: float = 30.0) -> list[int]:
    return [
        item.line for item in services.items_claim(batch_id=batch.pk, owner=owner, count=count, lease_seconds=lease)
    ]


def test_items_are_claimed_in_order_by_one_worker_at_a_time(make_batch):
    batch = make_batch(5)
    assert claim(batch, "a", 2) == [1, 2]
    assert claim(batch, "b", 10) == [3, 4, 5]
    assert claim(batch, "c", 10) == []  # every lease is live
    assert set(BatchItem.objects.filter(batch=batch).values_list("lease_owner", flat=True)) == {"a", "b"}


def test_concurrent_claims_never_share_an_item(make_batch):
    batch = make_batch(60)

    def worker(name: str) -> list[int]:
        taken = []
        try:
            while lines := claim(batch, name, 3):
                taken.extend(lines)
        finally:
            connection.close()
        return taken

    with ThreadPoolExecutor(4) as pool:
        shares = list(pool.map(worker, ["w1", "w2", "w3", "w4"]))
    taken = [line for share in shares for line in share]
    assert sorted(taken) == list(range(1, 61))  # each item exactly once, none lost


def test_a_lapsed_lease_is_taken_over_and_the_late_worker_cannot_write(make_batch):
    batch = make_batch(1)
    (item,) = services.items_claim(batch_id=batch.pk, owner="slow", count=1, lease_seconds=0.2)
    assert claim(batch, "other", 1) == []
    time.sleep(0.3)
    assert claim(batch, "other", 1) == [1]  # the slow worker's lease ran out

    assert (
        services.item_finish(
            item_id=item.pk, owner="slow", succeeded=True, response_status=200, response={"by": "slow"}
        )
        is False
    )
    assert services.item_retry(item_id=item.pk, owner="slow", delay_seconds=0) is False
    assert (
        services.item_finish(
            item_id=item.pk, owner="other", succeeded=True, response_status=200, response={"by": "other"}
        )
        is True
    )
    item.refresh_from_db()
    assert (item.status, item.response, item.lease_owner, item.tries) == ("succeeded", {"by": "other"}, "", 0)
    # A result is written once: not even its holder rewrites it.
    assert (
        services.item_finish(item_id=item.pk, owner="other", succeeded=False, response_status=500, response={}) is False
    )


def test_renewal_keeps_a_lease_and_a_retry_backs_off(make_batch):
    batch = make_batch(1)
    (item,) = services.items_claim(batch_id=batch.pk, owner="a", count=1, lease_seconds=0.3)
    for _ in range(3):
        time.sleep(0.15)
        assert services.leases_renew(owner="a", item_ids=[item.pk], lease_seconds=0.3) == 1
    assert claim(batch, "b", 1) == []  # renewed: still a's

    assert services.item_retry(item_id=item.pk, owner="a", delay_seconds=0.3) is True
    assert claim(batch, "b", 1) == []  # backing off
    time.sleep(0.35)
    (again,) = services.items_claim(batch_id=batch.pk, owner="b", count=1, lease_seconds=30)
    assert again.tries == 1  # a new run: its own ledger record


@pytest.mark.parametrize("drains", ["one drain", "a drain each"])
def test_a_run_repeated_after_a_lost_lease_is_billed_once(make_batch, drains):
    """Both runs of the same try hand off a record with the same id, each at its own time: the
    ledger keeps one, whether the two land in one batch or in two. A retry after a failure is a new
    run, with a record of its own."""
    batch = make_batch(1)
    request_id = f"{batch.public_id}:1"

    def record(run: int, cost: str) -> LedgerRecord:
        return LedgerRecord(
            request_id=request_id,
            tenant_id=batch.tenant_id,
            key_id=batch.key_id,
            model_requested="m",
            status_code=200,
            id=Queued(key_digest="d", request_id=request_id, run=run).record_id,
            cost_usd=cost,
            batch=True,  # as every batch item's record (gateway.settlement)
        )

    async def hand(records):
        for r in records:
            await hand_off(r)

    first, again, retried = record(0, "0.001"), record(0, "0.0011"), record(1, "0.002")
    assert again.created_at > first.created_at  # the key (id, created_at) alone would keep both
    if drains == "one drain":
        asyncio.run(hand([first, again, retried]))
        drain()
    else:
        for one in (first, again, retried):
            asyncio.run(hand([one]))
            drain()
    rows = LedgerEntry.objects.filter(request_id=request_id)
    assert sorted(str(cost) for cost in rows.values_list("cost_usd", flat=True)) == ["0.0010000000", "0.0020000000"]


def test_a_batch_closes_once_with_its_files(make_batch):
    batch = make_batch(3)
    claimed = services.items_claim(batch_id=batch.pk, owner="a", count=3, lease_seconds=30)
    assert services.batch_finalize(batch_id=batch.pk) is False  # work in flight
    services.item_finish(item_id=claimed[0].pk, owner="a", succeeded=True, response_status=200, response={"ok": 1})
    services.item_finish(item_id=claimed[1].pk, owner="a", succeeded=False, response_status=400, response={"no": 1})
    services.item_finish(item_id=claimed[2].pk, owner="a", succeeded=True, response_status=200, response={"ok": 3})

    assert services.batch_finalize(batch_id=batch.pk) is True
    assert services.batch_finalize(batch_id=batch.pk) is False  # once
    batch.refresh_from_db()
    assert batch.status == "completed"
    output = [orjson.loads(line) for line in bytes(batch.output_file.content).splitlines()]
    errors = [orjson.loads(line) for line in bytes(batch.error_file.content).splitlines()]
    assert [(row["custom_id"], row["response"]["body"]) for row in output] == [("c1", {"ok": 1}), ("c3", {"ok": 3})]
    assert [(row["custom_id"], row["response"]["status_code"]) for row in errors] == [("c2", 400)]
    assert BatchFile.objects.filter(tenant=batch.tenant, purpose="batch_output").count() == 2


def test_expiry_fails_what_did_not_run_and_closes_when_flights_land(make_batch):
    batch = make_batch(3)
    (running,) = services.items_claim(batch_id=batch.pk, owner="a", count=1, lease_seconds=30)
    assert services.item_start(item_id=running.pk, batch_id=batch.pk, owner="a") is True
    Batch.objects.filter(pk=batch.pk).update(expires_at=timezone.now())

    assert services.batches_sweep().to_expire == [batch.pk]
    assert services.batch_expire(batch_id=batch.pk) is True
    batch.refresh_from_db()
    assert batch.status == "in_progress"  # one request still in flight
    services.item_finish(item_id=running.pk, owner="a", succeeded=True, response_status=200, response={"ok": 1})
    assert services.batch_finalize(batch_id=batch.pk) is True
    batch.refresh_from_db()
    assert batch.status == "expired" and batch.expired_at is not None
    errors = [orjson.loads(line) for line in bytes(batch.error_file.content).splitlines()]
    assert [(row["custom_id"], row["error"]["code"]) for row in errors] == [
        ("c2", "batch_expired"),
        ("c3", "batch_expired"),
    ]


def test_the_sweep_finds_work_a_dead_worker_left(make_batch):
    batch = make_batch(2)
    services.items_claim(batch_id=batch.pk, owner="dead", count=2, lease_seconds=0.2)
    assert batch.pk not in services.batches_sweep().to_run  # its leases are live
    time.sleep(0.3)
    assert batch.pk in services.batches_sweep().to_run


@pytest.fixture
def validating_batch(make_tenant, make_key):
    def make(content: bytes) -> Batch:
        tenant = make_tenant()
        make_key(tenant)
        # Created long ago: the sweep would start it again if it were left validating.
        return stored_batch(
            tenant,
            VirtualKey.objects.get(tenant=tenant),
            content,
            status=Batch.Status.VALIDATING,
            created_at=timezone.now() - timedelta(hours=1),
            expires_at=timezone.now() + timedelta(hours=23),
        )

    return make


def test_a_file_whose_reading_fails_fails_its_batch_once_and_the_sweep_leaves_it(validating_batch, monkeypatch):
    batch = validating_batch(b'{"custom_id": "a"}\n')

    def broken(*args, **kwargs):
        raise RecursionError("a bug in reading")

    monkeypatch.setattr(services, "read_requests", broken)  # stands for any bug on the way
    assert services.batch_start(batch_id=batch.pk) is False
    batch.refresh_from_db()
    assert batch.status == Batch.Status.FAILED
    assert batch.errors == {
        "object": "list",
        "data": [{"code": "invalid_file", "message": "The input file could not be read.", "param": None, "line": None}],
    }
    assert not BatchItem.objects.filter(batch=batch).exists()
    assert batch.pk not in services.batches_sweep().to_start


def test_a_line_nested_300_deep_fails_the_batch_with_the_line_named(validating_batch):
    """Issue #15, 5: reading such a line crashed (orjson.dumps gives up past 255 levels), and the
    sweep started the batch again and again."""
    good = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
    deep = {**good, "custom_id": "b", "body": {**good["body"], "x": [[]]}}
    content = orjson.dumps(good) + b"\n" + orjson.dumps(deep).replace(b"[[]]", b"[" * 300 + b"]" * 300)
    batch = validating_batch(content)

    assert services.batch_start(batch_id=batch.pk) is False
    batch.refresh_from_db()
    assert batch.status == Batch.Status.FAILED
    assert [(e["line"], e["code"], e["param"]) for e in batch.errors["data"]] == [(2, "nesting_too_deep", "body.x")]
    assert batch.pk not in services.batches_sweep().to_start


def statuses(batch: Batch) -> dict[int, str]:
    return dict(BatchItem.objects.filter(batch=batch).values_list("line", "status"))


def test_cancel_releases_claimed_items_at_once_and_nothing_starts_after_it(make_batch):
    """Issue 25: a worker's claimed items ran after the cancel (16 upstream calls while `cancelling`)."""
    batch = make_batch(6)
    claimed = services.items_claim(batch_id=batch.pk, owner="a", count=4, lease_seconds=30)
    assert services.item_start(item_id=claimed[0].pk, batch_id=batch.pk, owner="a") is True  # upstream now
    assert statuses(batch) == {1: "running", 2: "queued", 3: "queued", 4: "queued", 5: "queued", 6: "queued"}

    services.batch_cancel(batch=batch)
    # Claimed but not started (2-4) are released with the unclaimed ones, at once.
    assert statuses(batch) == {
        1: "running",
        2: "cancelled",
        3: "cancelled",
        4: "cancelled",
        5: "cancelled",
        6: "cancelled",
    }
    assert BatchItem.objects.filter(batch=batch, status="cancelled").exclude(lease_owner="").count() == 0
    for item in claimed[1:]:
        assert services.item_start(item_id=item.pk, batch_id=batch.pk, owner="a") is False
        assert (
            services.item_finish(item_id=item.pk, owner="a", succeeded=True, response_status=200, response={}) is False
        )
    assert claim(batch, "b", 10) == []
    assert statuses(batch)[2] == "cancelled"  # nothing moved

    # The request in flight finishes and the batch closes with it.
    assert services.item_finish(
        item_id=claimed[0].pk, owner="a", succeeded=True, response_status=200, response={"ok": 1}
    )
    assert services.batch_finalize(batch_id=batch.pk) is True
    batch.refresh_from_db()
    assert batch.status == "cancelled"
    assert statuses(batch) == {
        1: "succeeded",
        2: "cancelled",
        3: "cancelled",
        4: "cancelled",
        5: "cancelled",
        6: "cancelled",
    }


def test_a_start_waits_for_a_cancel_in_progress_and_is_refused(make_batch):
    """The batch row's lock orders a start and a cancel: a start that comes while a cancel holds the
    row waits for it, then sees the batch cancelling."""
    batch = make_batch(2)
    (item, _) = services.items_claim(batch_id=batch.pk, owner="a", count=2, lease_seconds=30)

    def start_elsewhere() -> bool:
        try:
            return services.item_start(item_id=item.pk, batch_id=batch.pk, owner="a")
        finally:
            connection.close()

    from django.db import transaction

    with ThreadPoolExecutor(1) as pool, transaction.atomic():
        Batch.objects.select_for_update().get(pk=batch.pk)  # what batch_cancel holds while it writes
        pending = pool.submit(start_elsewhere)
        time.sleep(0.3)
        assert not pending.done()  # waiting on the lock
        Batch.objects.filter(pk=batch.pk).update(status=Batch.Status.CANCELLING)
        BatchItem.objects.filter(batch=batch, status="queued").update(status="cancelled")
    assert pending.result(timeout=10) is False
    assert statuses(batch) == {1: "cancelled", 2: "cancelled"}
