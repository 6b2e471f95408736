"""One request as the stages see it: what they learn as it goes (Call), what it answers (Reply), a
batch item's terms (Queued), and the follow-up work that runs after the response (spawn)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TypeVar

from billing.money import format_usd
from gateway import metrics
from gateway.audience import Audience
from gateway.auth import KeyInfo
from gateway.cache import engine as cache
from gateway.cache.keys import CacheKey
from gateway.limits.admission import Ticket
from gateway.schemas import ChatRequest
from gateway.screening import engine as screening
from gateway.upstream import autoroute
from gateway.upstream.breakers import Attempt
from gateway.upstream.failures import UpstreamError
from gateway.upstream.routing import ModelRoute, Target

QUEUED_RECORDS = uuid.UUID("6f1c2a57-5b0e-4f51-9d3a-1b7c2e8f4a90")  # namespace of batch items' record ids
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")  # whole: fullmatch
_background: set[asyncio.Task] = set()


@dataclass(frozen=True)
class Queued:
    """A batch item on the request path: its key known by digest (a batch never holds the secret),
    its request id the item's, and capacity waited for instead of refused. Its ledger record id is
    fixed by the item and the run, so a run repeated after its worker lost the lease (and raced the
    next one to the end) is billed once. `start` is asked right before the request goes upstream
    (False: the batch was cancelled meanwhile, and nothing is sent)."""

    key_digest: str
    request_id: str
    run: int = 0
    start: Callable[[], Awaitable[bool]] | None = field(default=None, compare=False)

    @property
    def record_id(self) -> str:
        return str(uuid.uuid5(QUEUED_RECORDS, f"{self.request_id}/{self.run}"))


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None


@dataclass(frozen=True)
class Retrieval:
    """A search of the tenant's vector stores (gateway.knowledge): the query's tokens as the embedder
    counts them, and its price, which is added to the request's cost."""

    tokens: int
    cost: Decimal


@dataclass
class Call:
    """What the pipeline learns about one request as it goes."""

    request_id: str
    started: float = field(default_factory=time.perf_counter)
    received_at: float = field(default_factory=time.time)  # unix time, for what must order across processes
    queued: Queued | None = None
    key: KeyInfo | None = None
    request: ChatRequest | None = None
    body: dict = field(default_factory=dict)
    model: str = ""  # the alias routed: the one asked for, or what "auto" chose
    route: autoroute.Choice | None = None  # "auto"'s choice and reason
    escalation: ModelRoute | None = None  # the smart model a refusal would be asked again (reserved for)
    policy_alternative: ModelRoute | None = None  # asked after providers' content-policy refusals (reserved for)
    ticket: Ticket | None = None
    attempts: list[Attempt] = field(default_factory=list)  # every provider call, for the breakers
    target: Target | None = None
    fallbacks: int = 0
    ttft_ms: int | None = None
    cache_controls: cache.Controls = field(default_factory=cache.Controls)
    cache_key: CacheKey | None = None
    cache_tier: str = "bypass"
    # What the cache's lookup computed (its vectors of the prompt), reused when the answer is stored.
    cache_lookup: cache.Lookup = field(default_factory=lambda: cache.Lookup(None))
    upstream_seconds: float = 0.0  # waiting on providers (calls, backoff); the rest is the gateway's
    paid: dict[int, Decimal] = field(default_factory=dict)  # provider id → cost, for its daily spend cap
    escalated_from: Target | None = None  # the deployment whose refusal went to the smart model
    screening: screening.Screening | None = None  # what the tenant's safety screening did
    file_search: list[tuple[str, float]] | None = None  # the passages a grounded chat was given (file id, score)
    retrieval: Retrieval | None = None  # what searching the vector stores used and cost
    answer_text: str | None = None  # what the client was answered (for a tenant that logs prompts)
    fallback_reasons: list[str] = field(default_factory=list)  # "<deployment>=<why it was passed over>"
    queued_ms: int = 0  # waiting for saturated deployments to recover
    audience: Audience = field(default_factory=Audience)  # the end user and session the app named

    def passed_over(self, target: Target, why: str) -> None:
        self.fallback_reasons.append(f"{target.deployment}={why}")

    def elapsed_ms(self) -> int:
        return int((time.perf_counter() - self.started) * 1000)

    @contextmanager
    def waiting_on(self, target: Target) -> Iterator[None]:
        """Around each provider call: times it and counts its outcome by provider."""
        started = time.perf_counter()
        code = ""
        try:
            yield
        except UpstreamError as error:
            code = error.code
            raise
        except BaseException:
            code = "interrupted"
            raise
        finally:
            self.upstream_seconds += time.perf_counter() - started
            metrics.upstream_attempt(target.provider, code)


def request_id_from(header: str | None) -> str:
    """The client's id when it is a sane token, else a fresh one."""
    if header and REQUEST_ID_PATTERN.fullmatch(header):
        return header
    return "req_" + uuid.uuid4().hex


T = TypeVar("T")
U = TypeVar("U")


def spawn(coro) -> None:
    """Run follow-up work after the response without letting the task be garbage-collected."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def both(first: Awaitable[T], second: Awaitable[U]) -> tuple[T, U]:
    """Two awaitables at once (two round trips, to Redis and PostgreSQL, overlapping); both are done
    when this returns or raises, whichever of them failed."""
    beside = asyncio.ensure_future(second)
    try:
        result = await first
    finally:
        other = await beside
    return result, other


async def follow_ups_done() -> None:
    """Wait for the follow-up work spawned so far (cache stores): for callers about to close their
    event loop, such as batch workers."""
    while _background:
        await asyncio.gather(*_background, return_exceptions=True)


def response_headers(call: Call, cost: Decimal | None) -> dict[str, str]:
    headers = {
        "x-sentinel-request-id": call.request_id,
        "x-sentinel-cache": call.cache_tier,
        "x-sentinel-fallbacks": str(call.fallbacks),
        **(call.ticket.headers() if call.ticket else {}),
    }
    if call.fallback_reasons:
        headers["x-sentinel-fallback-reasons"] = ", ".join(call.fallback_reasons)
    if call.queued_ms:
        headers["x-sentinel-queued-ms"] = str(call.queued_ms)
    if call.target is not None:
        headers["x-sentinel-provider"] = call.target.provider
        headers["x-sentinel-deployment"] = call.target.deployment
    if cost is not None:
        headers["x-sentinel-cost-usd"] = format_usd(cost + (call.retrieval.cost if call.retrieval else 0))
    if call.route is not None:
        headers["x-sentinel-route"] = f"{call.route.route}; reason={call.route.reason}"
    if call.escalated_from is not None:
        headers["x-sentinel-escalated"] = f"{call.escalated_from.deployment}->{call.target.deployment}"
    if call.file_search is not None:  # gateway.knowledge.grounding: the passages given, in order
        headers["x-sentinel-file-search"] = ",".join(f"{file_id}:{score:.3f}" for file_id, score in call.file_search)
    return headers
