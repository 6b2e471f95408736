"""Stored responses: written and read by tenant (another tenant's id is not found).

Written and read on the request path through this process's async pool (sentinel.async_db), not the
ORM's worker thread. A write commits without waiting for the WAL to reach disk
(`synchronous_commit = off`): every reader sees it at once, and only a crash of the machine itself
(not of PostgreSQL) within the WAL writer's delay (200 ms by default) could lose it, the same window
as the ledger's hand-off to Redis. That wait was most of what storing cost a request (1.2 of 1.6 ms
on this machine). Deleting stays on the ORM, durable at once: a delete never comes undone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson
from django.utils import timezone
from psycopg.types.json import Jsonb

from gateway.errors import GatewayError
from gateway.responses.models import StoredResponse
from sentinel import async_db

# StoredResponse's table (gateway_storedresponse).
INSERT = (
    "insert into gateway_storedresponse"
    " (public_id, tenant_id, key_id, request_id, response, input_items, conversation, created_at)"
    " values (%s, %s, %s, %s, %s, %s, %s, %s)"
)
SELECT = (
    "select response, input_items, conversation from gateway_storedresponse where tenant_id = %s and public_id = %s"
)


@dataclass(frozen=True)
class Stored:
    response: dict
    input_items: list[dict]
    conversation: list[dict]


async def _configure(connection) -> None:
    await connection.execute("set synchronous_commit = off")


async def _pool():
    return await async_db.pool("stored responses", _configure, max_size=4, pipelines=False)


def _json(value) -> Jsonb:
    """`value` as jsonb: serialized with orjson, or already serialized (bytes)."""
    return Jsonb(value, dumps=_dumps)


def _dumps(value) -> bytes:
    return value if isinstance(value, bytes) else orjson.dumps(value)


def not_found(response_id: str, param: str | None = None) -> GatewayError:
    return GatewayError(404, "response_not_found", f"Response with id '{response_id}' not found.", param=param)


async def response_get(*, tenant_id: int, response_id: str, param: str | None = None) -> Stored:
    async with (await _pool()).connection() as connection:
        row = await (await connection.execute(SELECT, (tenant_id, response_id), prepare=True)).fetchone()
    if row is None:
        raise not_found(response_id, param)
    return Stored(*row)


async def response_save(
    *,
    tenant_id: int,
    key_id: int,
    response_id: str,
    request_id: str,
    response: dict | bytes,
    input_items: list[dict],
    conversation: list[dict],
) -> None:
    values = (
        response_id,
        tenant_id,
        key_id,
        request_id,
        _json(response),
        _json(input_items),
        _json(conversation),
        timezone.now(),
    )
    async with (await _pool()).connection() as connection:
        await connection.execute(INSERT, values, prepare=True)


def responses_prune(*, days: int, now: datetime | None = None, batch: int = 5_000) -> int:
    """Delete the stored responses older than `days`, a batch at a time (short transactions, no long
    lock on a busy table); returns how many went."""
    cutoff = (now or timezone.now()) - timedelta(days=days)
    deleted = 0
    while True:
        ids = list(StoredResponse.objects.filter(created_at__lt=cutoff).values_list("pk", flat=True)[:batch])
        if not ids:
            return deleted
        deleted += StoredResponse.objects.filter(pk__in=ids).delete()[0]


async def response_delete(*, tenant_id: int, response_id: str) -> None:
    deleted, _ = await StoredResponse.objects.filter(tenant_id=tenant_id, public_id=response_id).adelete()
    if not deleted:
        raise not_found(response_id)
