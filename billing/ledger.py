"""The ledger's path: the request hands its record to a Redis stream (durable, one XADD), and
workers move records to Postgres in batches.

A worker reads with a consumer group, inserts with ON CONFLICT DO NOTHING on the record id (and time), and only
then acknowledges. A worker that dies mid-batch leaves its records pending; the next drain claims
them after SENTINEL_LEDGER_CLAIM_IDLE_MS and inserts them again, which the conflict clause makes
harmless. So a record is never lost once XADD returned, and never counted twice.

A record the database refuses, for whatever reason (a NUL byte psycopg will not send, a value too
long or out of range, a tenant that does not exist), or that is no ledger record at all, would fail
its whole batch on every retry and hold up every other tenant's billing. A refused batch is split in
halves until each refused record stands alone, every other record goes in during the same drain, and
the refused ones are set aside with the reason (LedgerDeadLetter, shown in the console and counted in
/metrics). Errors that are the database's rather than a record's (connection lost, server down or
shutting down, out of resources, a lock or serialization failure, a schema problem) set nothing
aside: the batch stays queued and is retried.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import time
import typing
import uuid
from collections import Counter
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import django.db
import orjson
import psycopg
import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from billing.models import LedgerDeadLetter, LedgerEntry, RollupDue
from sentinel import redis_keys
from sentinel.redis_clients import UNREACHABLE, async_redis, sync_redis
from tenants.models import Tenant
from tenants.services import key_mark_used

log = logging.getLogger(__name__)

STREAM = redis_keys.LEDGER_STREAM
# Where earlier versions kept dead letters; the drain moves any left there into LedgerDeadLetter.
OLD_DEAD_LETTERS = redis_keys.LEDGER_OLD_DEAD_LETTERS
GROUP = "ledger-writers"


@dataclass
class LedgerRecord:
    request_id: str
    tenant_id: int
    key_id: int | None
    model_requested: str
    status_code: int
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    created_at: float = field(default_factory=lambda: datetime.now(UTC).timestamp())
    model_served: str = ""
    deployment: str = ""
    provider: str = ""
    stream: bool = False
    error_code: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_read_tokens: int = 0  # of the prompt tokens (billing.money.Tokens)
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0  # of the completion tokens
    cost_usd: str = "0"
    cache_read_cost_usd: str = "0"  # parts of cost_usd
    cache_write_cost_usd: str = "0"
    reasoning_cost_usd: str = "0"
    batch: bool = False  # a Batch API item, billed at batch rates
    price_id: int | None = None
    cache_tier: str = "miss"
    saved_cost_usd: str = "0"
    latency_ms: int = 0
    ttft_ms: int | None = None
    fallbacks: int = 0
    fallback_reasons: str = ""  # "<deployment>=<why it was passed over>, ..." (gateway.pipeline)
    route: str = ""
    route_reason: str = ""
    escalated_from: str = ""
    screening: dict | None = None  # checks that ran, fired and what was done (gateway.screening), never text
    end_user: str = ""  # the client's `user` field, as sent (gateway.audience)
    session_id: str = ""  # x-sentinel-session or metadata.session_id, as sent
    images: int = 0  # images generated (gateway.images), billed per image in cost_usd
    retrieval_tokens: int = 0  # of the queries embedded to search vector stores (gateway.knowledge)
    retrieval_cost_usd: str = "0"  # what the searches cost: part of cost_usd
    team_id: int | None = None  # the key's team (tenants.Team), None for a key of no team

    def encode(self) -> bytes:
        # orjson serializes dataclasses itself, much faster than through asdict(): this is on the request path.
        return orjson.dumps(self)


async def hand_off(record: LedgerRecord) -> None:
    """Queue one record durably; returns once Redis has it. While Redis is unreachable the record
    goes straight to Postgres instead (slower, equally durable, idempotent on the same id)."""
    await hand_off_encoded(record.encode())


async def hand_off_encoded(encoded: bytes) -> None:
    try:
        await async_redis().xadd(STREAM, {"r": encoded})
    except UNREACHABLE:
        await write_directly(encoded)


async def write_directly(encoded: bytes) -> None:
    """The fallback when Redis is unreachable: the record straight into Postgres (idempotent on id)."""
    await sync_to_async(_insert_directly)(encoded)


def _insert_directly(encoded: bytes) -> None:
    # A refused record is set aside here too, never raised into the request that handed it off.
    _land([Queued(encoded)])


def _ensure_group(client: redis.Redis) -> None:
    try:
        client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


# The record's fields are the ledger table's columns (tests hold the two together).
COLUMNS = tuple(f.name for f in fields(LedgerRecord))
_COLUMN_SET = frozenset(COLUMNS)
# A record queued by an older version lacks the fields added since: they take their defaults. The
# id and the time have none (made per record), so a record without them is no record.
_DEFAULTS = {f.name: f.default for f in fields(LedgerRecord) if f.default is not MISSING}
# What JSON types each field may have (as tuples, which isinstance checks fastest); a timestamp may
# come as a whole number.
_TYPES = {
    name: (int, float) if hint is float else typing.get_args(hint) or (hint,)
    for name, hint in typing.get_type_hints(LedgerRecord).items()
}


class Refused(Exception):
    """A record the ledger cannot take: what kind of refusal (LedgerDeadLetter.Kind) and why."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a UUID") from None


def _moment(stamp: float) -> datetime:
    try:
        return datetime.fromtimestamp(stamp, UTC)
    except (ValueError, OverflowError, OSError):
        raise ValueError(f"{stamp!r} is not a time") from None


def _amount(text: str) -> Decimal:
    """Money as Decimal; NaN and infinities are refused here, because Postgres would store a NaN and
    every sum over it would be NaN."""
    try:
        amount = Decimal(text)
    except ArithmeticError:
        amount = None
    if amount is None or not amount.is_finite():
        raise ValueError(f"{text!r} is not an amount")
    return amount


_CONVERT = {
    "screening": lambda value: Jsonb(value) if value is not None else None,
    "id": _uuid,
    "created_at": _moment,
    "cost_usd": _amount,
    "cache_read_cost_usd": _amount,
    "cache_write_cost_usd": _amount,
    "reasoning_cost_usd": _amount,
    "saved_cost_usd": _amount,
    "retrieval_cost_usd": _amount,
}


def _json_type(value: object) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object", list: "array"}.get(
        type(value), "null"
    )


def _row(raw: bytes) -> tuple:
    """A queued record as a row of the ledger table; raises Refused for a record that cannot be one."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Refused(LedgerDeadLetter.Kind.UNDECODABLE, f"not a ledger record: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise Refused(LedgerDeadLetter.Kind.UNDECODABLE, f"not a ledger record: a JSON {_json_type(data)}")
    if not data.keys() >= _COLUMN_SET:
        data = {**_DEFAULTS, **data}
        missing = [name for name in COLUMNS if name not in data]
        if missing:
            raise Refused(LedgerDeadLetter.Kind.UNDECODABLE, f"not a ledger record: no {', '.join(missing)}")
    for name, expected in _TYPES.items():
        value = data[name]
        # bool is an int to isinstance, never to a ledger column
        if not isinstance(value, expected) or ((value is True or value is False) and expected != (bool,)):
            raise Refused(
                LedgerDeadLetter.Kind.UNDECODABLE, f"not a ledger record: {name} is a JSON {_json_type(value)}"
            )
    for name, convert in _CONVERT.items():
        try:
            data[name] = convert(data[name])
        except ValueError as exc:
            raise Refused(LedgerDeadLetter.Kind.VALUE, f"invalid value: {name} {exc}") from None
    return tuple(data[name] for name in COLUMNS)


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def drain(*, batch_size: int = 1000, max_batches: int = 50) -> int:
    """Move queued records to Postgres; returns how many were read. Safe to run concurrently."""
    client = sync_redis()
    _ensure_group(client)
    _adopt_old_dead_letters(client, batch_size)
    consumer = consumer_name()
    moved = 0
    for _ in range(max_batches):
        # Records a dead worker left pending first, then new ones.
        _, claimed, _ = client.xautoclaim(
            STREAM, GROUP, consumer, min_idle_time=settings.LEDGER_CLAIM_IDLE_MS, count=batch_size
        )
        messages = list(claimed)
        if not messages:
            response = client.xreadgroup(GROUP, consumer, {STREAM: ">"}, count=batch_size)
            messages = response[0][1] if response else []
        if not messages:
            break
        write_batch(client, messages)
        moved += len(messages)
    return moved


@dataclass
class Queued:
    """One queued record: its bytes, its id in the stream ("" when written directly) and, once read,
    its ledger row or why it cannot be one."""

    raw: bytes
    stream_id: str = ""
    row: tuple | None = None
    refusal: Refused | None = None

    @classmethod
    def from_message(cls, message_id: bytes | str, body: dict) -> Queued:
        raw = body.get(b"r")
        if raw is None:  # no message the gateway wrote: kept whole
            refusal = Refused(LedgerDeadLetter.Kind.UNDECODABLE, "not a ledger record: the message carries none")
            return cls(repr(body).encode(), _text(message_id), refusal=refusal)
        return cls(raw, _text(message_id))


def write_batch(client: redis.Redis, messages: list) -> None:
    """Insert one batch, then acknowledge it. Never acknowledges a record that is neither in the
    ledger nor set aside as a dead letter."""
    ids = [message_id for message_id, _ in messages]
    # A message without fields was deleted from the stream after a previous insert: nothing to do.
    _land([Queued.from_message(message_id, body) for message_id, body in messages if body])
    pipe = client.pipeline(transaction=False)
    pipe.xack(STREAM, GROUP, *ids)
    pipe.xdel(STREAM, *ids)
    pipe.execute()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _land(queued: list[Queued]) -> None:
    """Insert every record that is a ledger row and set the others aside with the reason. Raises,
    leaving every record to a retry, when the database rather than a record is at fault."""
    for item in queued:
        if item.refusal is None:
            try:
                item.row = _row(item.raw)
            except Refused as refusal:
                item.refusal = refusal
    refused = [item for item in queued if item.refusal is not None]
    refused += _insert_isolating([item for item in queued if item.refusal is None])
    if refused:
        _set_aside(refused)


def _insert_isolating(queued: list[Queued]) -> list[Queued]:
    """Insert the records; when the database refuses them, insert each half on its own, down to the
    single records it refuses, which are returned (with the refusal). k bad records among n cost
    about 2k·log2(n/k) inserts rather than n, so a steady trickle of bad records cannot slow the
    drain below the traffic; every good record still goes in this time."""
    try:
        _insert([item.row for item in queued])
    except Exception as exc:
        refusal = _refusal(exc)
        if refusal is None:
            raise  # the database is unwell, not the records: leave them queued for a retry
        if len(queued) == 1:
            queued[0].refusal = refusal
            return queued
        half = len(queued) // 2
        return _insert_isolating(queued[:half]) + _insert_isolating(queued[half:])
    return []


# psycopg's classes for the connection, the server's state and resources (08, 53, 55, 57, 58),
# serialization failures and deadlocks (40) and the server's own faults (XX): a retry cures them.
_THE_DATABASES_FAULT = (psycopg.OperationalError, psycopg.InterfaceError, psycopg.InternalError)


def _refusal(exc: BaseException) -> Refused | None:
    """Why the database refused the rows, or None when the fault is the database's rather than the
    rows' (and the insert should be retried as it is). A refusal is one about the data: SQLSTATE
    class 22 (data exception: too long, out of range, invalid text, a NUL in JSON), 23 (integrity:
    foreign key, check, not null), 54 (a limit such as an index row too large), or psycopg refusing
    a value before sending it (a NUL in text, a value it cannot adapt), which has no SQLSTATE."""
    error = exc.__cause__ if isinstance(exc, django.db.Error) and isinstance(exc.__cause__, psycopg.Error) else exc
    if not isinstance(error, psycopg.Error) or isinstance(error, _THE_DATABASES_FAULT):
        return None
    sqlstate = error.sqlstate
    if sqlstate is None:
        if isinstance(error, (psycopg.DataError, psycopg.ProgrammingError)):
            return Refused(LedgerDeadLetter.Kind.VALUE, f"refused by psycopg: {error}")
        return None
    if sqlstate.startswith("23"):
        kind = LedgerDeadLetter.Kind.CONSTRAINT
    elif sqlstate.startswith(("22", "54")):
        kind = LedgerDeadLetter.Kind.VALUE
    else:
        return None
    diag = error.diag
    parts = [f"refused by PostgreSQL ({sqlstate}): {diag.message_primary}", diag.message_detail, diag.context]
    return Refused(kind, "; ".join(part.strip().replace("\n", "; ") for part in parts if part))


# C0 and C1 control characters (tab and newline stay): NUL cannot be stored in Postgres text, and
# the others garble a page or a log line.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, limit: int) -> str:
    """Text any Postgres text column takes and any page shows as it is: control characters and
    unpaired surrogates escaped, at most `limit` characters."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    text = _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def record_text(raw: bytes, *, limit: int = 20_000, indent: bool = True) -> str:
    """A dead letter's record for people: JSON where it parses (orjson writes control characters as
    \\u escapes), else its bytes with anything unprintable escaped; never more than `limit` characters."""
    try:
        text = orjson.dumps(orjson.loads(raw), option=orjson.OPT_INDENT_2 if indent else None).decode()
    except orjson.JSONDecodeError:
        text = raw.decode("utf-8", "backslashreplace")
    return printable(text, limit)


def _stream_time(stream_id: str) -> datetime | None:
    """When a record was queued: a stream id starts with the milliseconds of its XADD."""
    milliseconds = stream_id.partition("-")[0]
    return datetime.fromtimestamp(int(milliseconds) / 1000, UTC) if milliseconds.isdigit() else None


def _set_aside(refused: list[Queued]) -> None:
    """Keep refused records as dead letters (once each, however often a retry brings them back),
    with the tenant and request id they name where they can be read."""
    named = [(item, _as_object(item.raw)) for item in refused]
    tenant_ids = {data["tenant_id"] for _, data in named if _is_id(data.get("tenant_id"))}
    existing = set(Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", flat=True)) if tenant_ids else set()
    now = datetime.now(UTC)
    letters = []
    for item, data in named:
        tenant_id, request_id = data.get("tenant_id"), data.get("request_id")
        letters.append(
            LedgerDeadLetter(
                digest=hashlib.sha256(item.raw).hexdigest(),
                queued_at=_stream_time(item.stream_id) if item.stream_id else now,
                tenant_id=tenant_id if _is_id(tenant_id) and tenant_id in existing else None,
                request_id=printable(request_id, 128) if isinstance(request_id, str) else "",
                kind=item.refusal.kind,
                reason=printable(item.refusal.reason, 2000),
                record=item.raw,
                stream_id=item.stream_id,
            )
        )
    LedgerDeadLetter.objects.bulk_create(letters, ignore_conflicts=True)
    kinds = Counter(item.refusal.kind for item in refused)
    log.error(
        "ledger: %d record(s) refused and set aside as dead letters (%s)",
        len(refused),
        ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())),
    )


def _as_object(raw: bytes) -> dict:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _is_id(value: object) -> bool:
    return type(value) is int and 0 < value < 2**63


def _adopt_old_dead_letters(client: redis.Redis, count: int) -> None:
    """Move dead letters an earlier version kept in a Redis stream into LedgerDeadLetter."""
    entries = client.xrange(OLD_DEAD_LETTERS, count=count)
    if not entries:
        return
    refused = []
    for _, message_fields in entries:
        reason = message_fields.pop(b"reason", b"").decode("utf-8", "backslashreplace")
        item = Queued.from_message(message_fields.pop(b"stream_id", b""), message_fields)
        item.refusal = Refused(LedgerDeadLetter.Kind.OTHER, reason)
        refused.append(item)
    _set_aside(refused)
    client.xdel(OLD_DEAD_LETTERS, *[message_id for message_id, _ in entries])


_TABLE = LedgerEntry._meta.db_table
_COLUMN_LIST = ", ".join(COLUMNS)
_CREATED_AT = COLUMNS.index("created_at")
_TENANT = COLUMNS.index("tenant_id")
_KEY = COLUMNS.index("key_id")
_ID = COLUMNS.index("id")
_BATCH = COLUMNS.index("batch")
# pg advisory lock class of a batch item's run (billed once); two runs of one are minutes apart.
BATCH_RUN_LOCK_ID = 0x5E_B112
BATCH_RUN_WINDOW = timedelta(days=7)


def _without_runs_billed(cursor, rows: list[tuple]) -> list[tuple]:
    """`rows` less the batch items' rows whose id is already billed. A batch item's record id is
    fixed by the item and its run (gateway.call.Queued), so two workers racing through the same run
    (one of them after losing its lease) hand off one id twice, each at its own time; the table's key
    is (id, created_at) (billing/partitions.py), which would keep both. Those ids are looked up in the
    partitions around their times, under a lock per id, so concurrent drains cannot both insert one;
    the first record of an id in this batch is kept. Other records' ids are new per request, and a
    record delivered again has its own time too, which the key's conflict clause skips."""
    runs = [row for row in rows if row[_BATCH]]
    if not runs:
        return rows
    ids = sorted({row[_ID] for row in runs})
    cursor.execute(
        "SELECT pg_advisory_xact_lock(%s, hashtext(id)) FROM unnest(%s::text[]) AS id ORDER BY id",
        [BATCH_RUN_LOCK_ID, [str(id_) for id_ in ids]],
    )
    moments = [row[_CREATED_AT] for row in runs]
    cursor.execute(
        f"SELECT id FROM {_TABLE} WHERE id = ANY(%s) AND created_at >= %s AND created_at <= %s",  # noqa: S608
        [ids, min(moments) - BATCH_RUN_WINDOW, max(moments) + BATCH_RUN_WINDOW],
    )
    seen = {row[0] for row in cursor.fetchall()}
    kept = []
    for row in rows:
        if row[_BATCH]:
            if row[_ID] in seen:
                continue
            seen.add(row[_ID])
        kept.append(row)
    return kept


def _insert(rows: list[tuple]) -> None:
    """COPY the batch into a scratch table, then move it over, skipping rows already there (a
    batch taken over from a worker that died after its insert). Django's bulk_create spends more
    time preparing parameters than Postgres spends inserting; COPY hands psycopg the tuples as they
    are. The rows and the markers saying whose days need a new rollup commit together."""
    if not rows:
        return
    with transaction.atomic(), connection.cursor() as cursor:
        rows = _without_runs_billed(cursor, rows)
        if not rows:
            return
        due = {(row[_TENANT], row[_CREATED_AT].date()) for row in rows}
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS ledger_incoming (LIKE {_TABLE} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        )
        with cursor.copy(f"COPY ledger_incoming ({_COLUMN_LIST}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(
            f"INSERT INTO {_TABLE} ({_COLUMN_LIST}) SELECT {_COLUMN_LIST} FROM ledger_incoming "  # noqa: S608
            # The primary key: the id with the partition key (billing/partitions.py), both from the record.
            "ON CONFLICT (id, created_at) DO NOTHING"
        )
        RollupDue.objects.bulk_create([RollupDue(tenant_id=tenant_id, day=day) for tenant_id, day in due])
    # Keys' last-used times come from here, once per batch, never from a write per request.
    last_used: dict[int, datetime] = {}
    for row in rows:
        key_id = row[_KEY]
        if key_id is not None and (key_id not in last_used or last_used[key_id] < row[_CREATED_AT]):
            last_used[key_id] = row[_CREATED_AT]
    key_mark_used(last_used=last_used)


def backlog() -> tuple[int, float]:
    """How many records are queued (read by a worker or not) and how long ago the oldest was handed
    off, in seconds (0 with none queued): a drain that keeps failing shows as a growing age."""
    pipe = sync_redis().pipeline(transaction=False)
    pipe.xlen(STREAM)
    pipe.xrange(STREAM, count=1)
    length, oldest = pipe.execute()
    if not oldest:
        return length, 0.0
    queued_ms = int(_text(oldest[0][0]).partition("-")[0])
    return length, max(time.time() - queued_ms / 1000, 0.0)


def pending_count() -> int:
    """Records queued but not yet in Postgres (new plus claimed-not-acknowledged)."""
    client = sync_redis()
    _ensure_group(client)
    return client.xlen(STREAM)
