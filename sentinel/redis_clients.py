"""One Redis connection pool per process (sync) and per event loop (async), and how the request path
lives with a Redis that stops answering.

The async client serves the request path. A command that hears nothing for SENTINEL_REDIS_TIMEOUT_MS
(100 ms) marks Redis unreachable for the whole process (its client on the event loop; a Redis that
answers other commands meanwhile is busy, not gone, and is waited for, up to the socket timeout).
From then on commands fail at once (callers fall back: admission to each tenant's fail-open /
fail-closed choice, the ledger to Postgres, the cache to a miss) instead of each waiting out a
timeout, and one command at a time checks whether Redis answers again. Admission checks on every
request (`checking_allowed`), one request at a time, whatever else is checking, so the first request
after Redis comes back is admitted through it; anything else probes at most every
PROBE_INTERVAL_SECONDS, when nothing is checking (the readiness probe, so a replica without traffic
recovers too, or a background write). A stall therefore costs one request at a time at most the
timeout, and the others nothing. The sync client (admin, workers) keeps its longer timeouts.

REDIS_URL names a Valkey/Redis Cluster with the scheme `redis+cluster://` (or `rediss+cluster://`):
host:port of any node, as a seed; the clients are then redis-py's cluster clients, which find the
other nodes and follow slots as they move (failover included). The async cluster client is guarded
the same way (GuardedRedisCluster): one view of whether Redis answers per process and event loop, for
the whole cluster, since one node that stops answering stalls every request whose tenant lives there.
Pipelines (either client) are not guarded, as before: only the request path's commands and scripts.
docs/cluster.md has the key design.

On a single Redis the async client's commands share one pipelined connection per event loop
(sentinel/redis_multiplex.py, docs/decisions.md 17); its pool serves pipelines and the commands that
hold a connection (blocking reads, transactions).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import time
import weakref
from collections.abc import Iterator

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from sentinel.redis_multiplex import PRIVATE, Multiplexed
from sentinel.redis_urls import is_cluster_url, plain_url

log = logging.getLogger(__name__)

_sync_client: redis.Redis | None = None
_async_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# Bounded so a Redis that stops answering costs a request milliseconds, not the default minutes.
SOCKET_TIMEOUT = 2.0  # the sync client's, and the async client's backstop under its own timeout
CONNECT_TIMEOUT = 1.0
PROBE_INTERVAL_SECONDS = 1.0
# On a cluster also: a failover under way, a slot no live node serves (raised by pipelines, which
# GuardedRedisCluster does not see).
UNREACHABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OSError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.SlotNotCoveredError,
)


def is_cluster(url: str | None = None) -> bool:
    """Whether the URL (REDIS_URL by default) names a cluster: `redis+cluster://host:port`."""
    return is_cluster_url(settings.REDIS_URL if url is None else url)


def sync_redis() -> redis.Redis:
    global _sync_client
    if _sync_client is None:
        options = {
            "socket_timeout": SOCKET_TIMEOUT,
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "health_check_interval": 30,
        }
        if is_cluster():
            _sync_client = redis.RedisCluster.from_url(plain_url(settings.REDIS_URL), **options)
        else:
            _sync_client = redis.Redis.from_url(settings.REDIS_URL, **options)
    return _sync_client


def reset_clients() -> None:
    """Forget every client (the next use makes new ones from settings.REDIS_URL): for tests that
    point the process at another Redis."""
    global _sync_client
    if _sync_client is not None:
        _sync_client.close()
    _sync_client = None
    _async_clients.clear()


def async_redis() -> aioredis.Redis:
    """The client for the running event loop (a pool is bound to the loop that created it)."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        timeout = settings.REDIS_TIMEOUT_MS / 1000
        # The client's own timeouts are backstops (for the pool's connections; `within` bounds the
        # shared connection's commands): a command gives up when Redis has been silent for the
        # request path's timeout (within), which a burst of new connections being accepted is not.
        options = {
            "socket_timeout": max(SOCKET_TIMEOUT, timeout),
            "socket_connect_timeout": max(CONNECT_TIMEOUT, timeout),
            "max_connections": 512,
        }
        if is_cluster():
            # The cluster client retries a command on a connection error after refreshing its map of
            # the slots (a failed-over primary's replica took its slots); GuardedRedisCluster bounds
            # the whole of it by the request path's timeout all the same.
            # A connection released while marked for reconnect is closed in a background task and
            # still counts meanwhile: room for those beside the commands in flight.
            options["max_connections"] = 2 * GuardedRedisCluster.IN_FLIGHT
            client = GuardedRedisCluster.from_url(
                plain_url(settings.REDIS_URL),
                **options,
                # A MOVED reply moves its slot in the client's map; redis-py's default also drops
                # every connection on every fifth one (GuardedRedisCluster says why not).
                reinitialize_steps=0,
            )
        else:
            client = GuardedRedis.from_url(
                settings.REDIS_URL,
                **options,
                # One more try on a fresh connection when a pooled one turns out dead (Redis
                # restarted); never after a timeout, which would double the wait.
                retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
            )
        client.outage = Outage()
        _async_clients[loop] = client
    return client


# --- a Redis that does not answer --------------------------------------------------------------


class NotWaiting(redis.exceptions.ConnectionError):
    """Redis is unreachable and this command did not wait for it: nothing was sent."""


class Outage:
    """Whether Redis answers, as one client (the process's, on its event loop) last saw it."""

    def __init__(self) -> None:
        self.down = False
        self.checks: set[str] = set()  # the commands finding out whether it answers again: "admission", "probe"
        self.last_check = 0.0
        self.last_answer = 0.0  # when any command last got an answer (monotonic)

    def heard_within(self, seconds: float) -> bool:
        return time.monotonic() - self.last_answer < seconds

    def may_check(self) -> str | None:
        """Which check a command may make now, or None (it does not wait). Admission checks one
        request at a time whatever else is checking, so a background command's probe in flight never
        turns away the first request after Redis answers again; any other command probes only when
        nothing is checking, at most every PROBE_INTERVAL_SECONDS."""
        if _checking_allowed.get():
            return None if "admission" in self.checks else "admission"
        if self.checks or time.monotonic() - self.last_check < PROBE_INTERVAL_SECONDS:
            return None
        return "probe"

    def answered(self) -> None:
        self.last_answer = time.monotonic()
        if self.down:
            log.warning("Redis answers again")
            self.down = False

    def silent(self, error: BaseException) -> None:
        if not self.down:
            log.warning("Redis does not answer (%s: %s); requests stop waiting on it", type(error).__name__, error)
            self.last_check = time.monotonic()  # the command that found out was a check
        self.down = True


_checking_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar("redis_checking_allowed", default=False)


@contextlib.contextmanager
def checking_allowed() -> Iterator[None]:
    """Commands in this block find out whether an unreachable Redis answers again (one at a time),
    rather than failing at once: for the step whose answer matters most (admission)."""
    token = _checking_allowed.set(True)
    try:
        yield
    finally:
        _checking_allowed.reset(token)


class _Guarded:
    """The async client with the request path's timeout and its view of whether Redis answers."""

    outage: Outage

    async def execute_command(self, *args, **options):
        outage = self.outage
        if not outage.down:
            return await self._timed(args, options)
        check = outage.may_check()
        if check is None:
            raise NotWaiting("Redis is unreachable (not waiting for it)")
        outage.checks.add(check)
        outage.last_check = time.monotonic()
        try:
            return await self._timed(args, options)
        finally:
            outage.checks.discard(check)

    async def _timed(self, args, options):
        timeout = settings.REDIS_TIMEOUT_MS / 1000
        try:
            result = await within(timeout, self._command(args, options), self.outage)
        except UNREACHABLE as error:
            self.outage.silent(error)
            raise
        self.outage.answered()
        return result

    def _command(self, args, options):
        """The command as the client itself sends it (unguarded)."""
        return super().execute_command(*args, **options)


class GuardedRedis(_Guarded, aioredis.Redis):
    """A single Redis or Valkey, guarded; its commands share one connection, pipelined
    (sentinel.redis_multiplex), except those that hold the connection and pipelines."""

    def _command(self, args, options):
        if str(args[0]).split(" ", 1)[0].upper() in PRIVATE:
            return super()._command(args, options)
        return self._multiplexed_command(args, options)

    async def _multiplexed_command(self, args, options):
        shared = self.__dict__.get("_shared")
        if shared is None:
            shared = self.__dict__["_shared"] = Multiplexed(self.connection_pool)
        try:
            response = await shared.call(args)
        except redis.exceptions.ResponseError:
            if EMPTY_RESPONSE in options:
                return options[EMPTY_RESPONSE]
            raise
        # What redis-py's parse_response does with a reply (no decoding: the client returns bytes).
        options.pop(EMPTY_RESPONSE, None)
        options.pop(NEVER_DECODE, None)
        options.pop("keys", None)
        if args[0] not in self.response_callbacks:
            return response
        result = self.response_callbacks[args[0]](response, **options)
        return await result if inspect.isawaitable(result) else result

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        shared = self.__dict__.pop("_shared", None)
        if shared is not None:
            shared.close()
        await super().aclose(close_connection_pool)


class GuardedRedisCluster(_Guarded, aioredis.RedisCluster):
    """A cluster, guarded: every command (routed to its slot's node, redirections and retries
    included) is bounded by the request path's timeout.

    Two things redis-py's async cluster client does are fenced off here. Its nodes open a connection
    per command in flight with no waiting for a free one: past max_connections a command fails with
    a connection error, on which the client closes every connection to every node (to re-learn the
    slots), failing the other commands in flight, some with AttributeError from a connection closed
    under them. So commands in flight are bounded by a semaphore (each holds one connection at most),
    and an AttributeError from a connection closed under a command is what it means: the connection
    was lost (ConnectionError), which callers already handle.

    And a burst must not make the client drop its connections. redis-py picks a command's node before
    it learns the slots: a command issued while it has no map (a process's first burst, or just after
    the map was dropped) goes to a random node and is MOVED; by default every fifth MOVED drops the
    map and closes every connection, those in use included ("Connection closed by server"), so the
    commands issued meanwhile go to random nodes again. 2,000 admissions at once on four processes
    kept this up past the client's three retries (a 503). So the map is learnt before a command is
    routed, a MOVED only moves its slot (reinitialize_steps=0; a failover is a connection error,
    which re-learns the map), and an idle connection is closed by the command that next takes it
    (_disconnect_free_connections)."""

    IN_FLIGHT = 512

    async def execute_command(self, *args, **options):
        semaphore = self.__dict__.get("_in_flight")
        if semaphore is None:
            semaphore = self.__dict__["_in_flight"] = asyncio.Semaphore(self.IN_FLIGHT)
        async with semaphore:
            try:
                return await super().execute_command(*args, **options)
            except (redis.exceptions.RedisClusterException, redis.exceptions.ClusterDownError) as error:
                # No node reachable, a slot no live node serves, a failover under way: for the
                # request path as for a single Redis that does not answer.
                self.outage.silent(error)
                raise redis.exceptions.ConnectionError(f"{type(error).__name__}: {error}") from error

    async def _command(self, args, options):
        if self._initialize:  # the map first (see above), within the request path's timeout
            await self.initialize()
        return await super()._command(args, options)

    async def _execute_command(self, target_node, *args, **kwargs):
        try:
            return await super()._execute_command(target_node, *args, **kwargs)
        except AttributeError as error:
            raise redis.exceptions.ConnectionError(f"connection closed under the command ({error})") from error


async def _disconnect_free_connections(self: aioredis.cluster.ClusterNode) -> None:
    """redis-py's ClusterNode.disconnect_free_connections without its race. After a connection error
    on a node, redis-py disconnects the node's idle connections: it starts one task per connection
    and awaits them, leaving the connections in the free list meanwhile, so a command that takes one
    before its task runs has it closed under it ("'NoneType' object has no attribute 'writelines'",
    "Connection lost"). Each such failure disconnects the free connections again: under a burst (2,000
    admissions at once on four processes) the cascade outlasts the client's three retries and a
    request fails with 503. Marked for reconnect instead, an idle connection is closed by the command
    that next takes it, before it sends (as redis-py already does for the connections in use)."""
    for connection in self._free:
        connection.mark_for_reconnect()


aioredis.cluster.ClusterNode.disconnect_free_connections = _disconnect_free_connections


async def within(seconds: float, awaitable, outage: Outage):
    """Await a command until Redis has been silent for `seconds`, raising redis' TimeoutError then.
    Silent means no command of this client got an answer meanwhile: a Redis working through a burst
    answers others and is waited for, up to SOCKET_TIMEOUT (or `seconds` if longer), a stalled one
    answers nobody. The verdict waits one more pass of the event loop: if
    the loop was busy elsewhere (a long request, a starved CPU), replies that arrived meanwhile, this
    command's or others', are read first, so only Redis's silence times out, not this process's own
    load."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    cancelling = task.cancelling()  # cancellations already asked of this task (as asyncio.timeout counts them)
    state = {"expired": False, "done": False}
    started = loop.time()
    give_up_at = started + max(SOCKET_TIMEOUT, seconds)

    def verdict() -> None:
        nonlocal handle
        if state["done"]:
            return
        if outage.heard_within(seconds) and loop.time() < give_up_at:
            handle = loop.call_later(seconds, loop.call_soon, verdict)
            return
        state["expired"] = True
        task.cancel()

    handle = loop.call_later(seconds, loop.call_soon, verdict)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if state["expired"] and task.uncancel() <= cancelling:
            if outage.heard_within(seconds):
                waited = give_up_at - started
                raise redis.exceptions.TimeoutError(f"no answer to this command in {waited:.1f} s") from None
            raise redis.exceptions.TimeoutError(f"Redis did not answer for {seconds * 1000:.0f} ms") from None
        raise
    finally:
        state["done"] = True
        handle.cancel()
