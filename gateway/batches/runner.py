"""A Celery worker's share of a batch: claim items under a lease, run each through the request path
(gateway.pipeline, with the batch's key: cache, admission, budgets, routing, ledger), write the
result while the lease is still ours, and renew the leases of the items in flight.

A worker runs a batch in slices of SLICE_SECONDS, then hands the rest to a fresh task, so a long
batch never holds a worker's slot away from other work (ledger batches) for long. Items are paced
per tenant across every worker (pace.lua) and wait for capacity at admission instead of failing
(429 and `overloaded` are waited out); failures retrying can fix go back to the queue with backoff.

A claimed item is started (services.item_start) only right before its request goes upstream, after
its turn in the pace and its admission. A cancel releases the items claimed and not started at
once (in the database; this worker stops waiting on them when it next looks at the batch's status),
and no item starts after it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings

from gateway import pipeline
from gateway.batches import selectors, services
from gateway.batches.models import Batch, BatchItem
from gateway.cache import engine as cache
from gateway.call import Queued, follow_ups_done
from gateway.lua import scripts
from sentinel import redis_keys
from sentinel.redis_clients import UNREACHABLE

log = logging.getLogger(__name__)

SLICE_SECONDS = 30.0
RETRYABLE = frozenset({429, 500, 502, 503, 504})  # worth another run later (tries permitting)


@dataclass(frozen=True)
class Job:
    batch_id: int
    public_id: str
    tenant_id: int
    key_digest: str
    pace: int | None  # batch requests per minute for the tenant
    status: str


def _job(batch_id: int) -> Job | None:
    batch = Batch.objects.select_related("key", "tenant__tier").filter(pk=batch_id).first()
    if batch is None:
        return None
    return Job(batch.pk, batch.public_id, batch.tenant_id, batch.key.digest, batch.tenant.batch_pace(), batch.status)


def _status(batch_id: int) -> str | None:
    return Batch.objects.filter(pk=batch_id).values_list("status", flat=True).first()


async def take_turn(tenant_id: int, per_minute: int | None) -> None:
    """Wait for this request's moment in the tenant's batch schedule (none without a pace)."""
    if not per_minute:
        return
    try:
        wait_ms = await scripts.pace(keys=[redis_keys.batch_pace(tenant_id)], args=[60_000 // per_minute])
    except UNREACHABLE:
        return  # admission still applies the tenant's limits, by its Redis-outage policy
    if wait_ms > 0:
        await asyncio.sleep(wait_ms / 1000)


class Runner:
    def __init__(self, batch_id: int) -> None:
        self.batch_id = batch_id
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self.lease = settings.BATCH_LEASE_SECONDS
        self.poll = min(1.0, self.lease / 4)
        self.running: dict[asyncio.Task, BatchItem] = {}
        self.starting: set[asyncio.Task] = set()  # past their wait: asking to start, or started

    async def run(self) -> bool:
        """Run the batch's items for one slice; True when work is left for another slice."""
        job = await sync_to_async(_job)(self.batch_id)
        if job is None:
            return False
        if job.status == Batch.Status.IN_PROGRESS:
            renewing = asyncio.create_task(self.renew())
            try:
                await self.work(job)
            finally:
                renewing.cancel()
                await follow_ups_done()
        if await sync_to_async(services.batch_finalize)(batch_id=self.batch_id):
            return False
        return await sync_to_async(_status)(self.batch_id) == Batch.Status.IN_PROGRESS

    async def work(self, job: Job) -> None:
        deadline = time.monotonic() + SLICE_SECONDS
        claiming, checked = True, 0.0
        while True:
            now = time.monotonic()
            if claiming and now >= deadline:
                claiming = False  # finish what is in flight, leave the rest to the next slice
            if claiming and now - checked >= self.poll:
                claiming = await sync_to_async(_status)(self.batch_id) == Batch.Status.IN_PROGRESS
                checked = now
                if not claiming:
                    self.stop_waiting()
            free = settings.BATCH_CONCURRENCY - len(self.running)
            if claiming and free > 0:
                for item in await sync_to_async(services.items_claim)(
                    batch_id=self.batch_id, owner=self.owner, count=free, lease_seconds=self.lease
                ):
                    self.running[asyncio.create_task(self.execute(job, item))] = item
            if not self.running:
                if not claiming:
                    return
                # Nothing to claim now: retries back off, or another worker holds the rest (if it
                # died, its leases run out and the items are ours to claim).
                wait = await sync_to_async(selectors.seconds_until_claimable)(batch_id=self.batch_id)
                if wait is None:
                    return
                await asyncio.sleep(min(max(wait, 0.05), self.poll))
                continue
            done, _ = await asyncio.wait(self.running, timeout=self.poll, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                self.running.pop(task)

    def stop_waiting(self) -> None:
        """The batch stopped (cancelled, expiring): items still waiting for their turn will not
        start; stop waiting on them (their rows were released by the cancel)."""
        for task in self.running:
            if task not in self.starting:
                task.cancel()

    async def renew(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            ids = [item.pk for item in self.running.values()]
            try:
                await sync_to_async(services.leases_renew)(owner=self.owner, item_ids=ids, lease_seconds=self.lease)
            except Exception:  # the next renewal may succeed; until the lease ends the items are ours
                log.exception("batch %s: could not renew leases", self.batch_id)

    async def execute(self, job: Job, item: BatchItem) -> None:
        request_id = f"{job.public_id}:{item.line}"
        task = asyncio.current_task()
        started = False

        async def start() -> bool:
            nonlocal started
            self.starting.add(task)  # from here on, stop_waiting leaves this item alone
            started = await sync_to_async(services.item_start)(
                item_id=item.pk, batch_id=self.batch_id, owner=self.owner
            )
            return started

        try:
            try:
                await take_turn(job.tenant_id, job.pace)
                reply = await pipeline.chat_completions(
                    {},
                    orjson.dumps(item.body),
                    queued=Queued(key_digest=job.key_digest, request_id=request_id, run=item.tries, start=start),
                )
                status, body = reply.status, orjson.loads(reply.body)
            except asyncio.CancelledError:
                if task in self.starting:
                    raise
                return  # released before it started (stop_waiting): the cancel already wrote its row
            except Exception:
                log.exception("batch item %s failed unexpectedly", request_id)
                status, body = 500, pipeline.INTERNAL_ERROR.payload()
                reply = None
            if not started and (body.get("error") or {}).get("code") == pipeline.BATCH_CANCELLED.code:
                return  # refused at the start: the batch was cancelled while this item waited
            self.starting.add(task)
            await sync_to_async(self.record)(item, request_id, status, body, reply.headers if reply else {})
        finally:
            self.starting.discard(task)

    def record(self, item: BatchItem, request_id: str, status: int, body: dict, headers: dict) -> None:
        if status in RETRYABLE and item.tries + 1 < settings.BATCH_MAX_TRIES:
            delay = max(settings.BATCH_RETRY_SECONDS * 2**item.tries, float(headers.get("retry-after") or 0))
            kept = services.item_retry(item_id=item.pk, owner=self.owner, delay_seconds=delay)
        else:
            usage = (body.get("usage") or {}) if status == 200 else {}
            kept = services.item_finish(
                item_id=item.pk,
                owner=self.owner,
                succeeded=status == 200,
                response_status=status,
                response=body,
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
            )
        if not kept:
            log.warning("batch item %s: lease lost to another worker; this run's result is dropped", request_id)


def run_slice(batch_id: int) -> bool:
    """One slice of a batch's work in this worker (the Celery task's body)."""

    async def run() -> bool:
        try:
            return await Runner(batch_id).run()
        finally:
            # The slice's event loop ends here: its vector-store pool is closed with it. Left open,
            # a pool still connecting took the loop's final cancellation for a failed connection and
            # retried it, so the loop never closed and the worker hung on its next batch.
            await cache.close_pool()

    return asyncio.run(run())
