"""The request path's commands to a single Redis share one connection per event loop, pipelined.

redis-py sends each command on a connection of its own taken from a pool, one write and one read
each, and spends about 40 µs of Python per command doing it (the pool, its retry and event wrappers,
a task per write under a socket timeout, a pure-Python encoder). A gateway request makes four or
five commands (admission, the cache lookup, the store, the settlement), so that was a fifth of a
web worker's CPU at 32 requests in flight. Here every command of the event loop goes on one
connection: the commands issued during one pass of the loop leave in one write, and their replies
come back in order, read by one task, parsed by hiredis (the parser redis-py itself uses), and
errors are redis-py's own exception classes. About 3 µs per command at 16 in flight, 13 µs one at a
time (`bench`-free measurement in docs/decisions.md, 19).

What does not come here: commands that hold or change the connection's state (blocking reads,
transactions, SUBSCRIBE, SELECT, ...) go to the pool as before, and so do pipelines (they are
redis-py's own objects). The connection is made by redis-py's own connection class, with the
client's URL, credentials, TLS and database. A lost connection fails the commands waiting on it with
ConnectionError; the next command makes a new one, and a command that failed on a connection made
before it started is sent once more on the new one (as redis-py's one retry did). Timeouts are the
caller's: GuardedRedis bounds every command (sentinel.redis_clients.within).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

import hiredis
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError, InvalidResponse, RedisError

# Commands that block, hold a transaction or a subscription, or change the connection: never on the
# shared connection.
PRIVATE = frozenset(
    """AUTH BLMOVE BLMPOP BLPOP BRPOP BRPOPLPUSH BZMPOP BZPOPMAX BZPOPMIN CLIENT DISCARD EXEC HELLO
    MONITOR MULTI PSUBSCRIBE QUIT READONLY READWRITE RESET SELECT SHUTDOWN SSUBSCRIBE SUBSCRIBE SYNC
    PSYNC UNWATCH WAIT WAITAOF WATCH XREAD XREADGROUP""".split()
)
READ_SIZE = 65536


class _Link:
    """One open connection: commands written in order, replies matched to them in order."""

    def __init__(self, connection: aioredis.Connection) -> None:
        self.connection = connection
        self.writer = connection._writer
        self.reader = connection._reader
        self.parser = hiredis.Reader(protocolError=InvalidResponse, replyError=BaseParser.parse_error)
        self.waiting: collections.deque[asyncio.Future] = collections.deque()
        self.outgoing: list[bytes] = []
        self.flush_scheduled = False
        self.error: BaseException | None = None
        self.loop = asyncio.get_running_loop()
        self.reading = self.loop.create_task(self._read())

    def send(self, packed: bytes) -> asyncio.Future:
        if self.error is not None:
            raise ConnectionError(f"connection lost ({self.error})")
        future = self.loop.create_future()
        self.waiting.append(future)
        self.outgoing.append(packed)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.error is not None or not self.outgoing:
            return
        outgoing, self.outgoing = self.outgoing, []
        try:
            self.writer.writelines(outgoing)
        except (OSError, RuntimeError) as error:  # a transport already closed
            self._fail(error)

    async def _read(self) -> None:
        error: BaseException = ConnectionError("connection closed")
        try:
            while True:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    raise ConnectionError("Connection closed by server.")
                self.parser.feed(data)
                while (reply := self.parser.gets()) is not False:
                    future = self.waiting.popleft()
                    if future.done():  # its caller gave up (a timeout): the reply is dropped
                        continue
                    if isinstance(reply, Exception):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
        except (OSError, RedisError) as lost:  # the socket, the peer, or a reply hiredis cannot parse
            error = lost
        finally:  # whatever ended the reading (a cancellation too) fails the commands still waiting
            self._fail(error)

    def _fail(self, error: BaseException) -> None:
        if self.error is not None:
            return
        self.error = error
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(ConnectionError(f"connection lost ({type(error).__name__}: {error})"))
        with contextlib.suppress(Exception):
            self.writer.close()

    def close(self) -> None:
        self._fail(ConnectionError("connection closed"))
        self.reading.cancel()


class Multiplexed:
    """The shared connection of one client on one event loop, made when first needed."""

    def __init__(self, pool: aioredis.ConnectionPool) -> None:
        self.pool = pool
        self.link: _Link | None = None
        self.connecting: asyncio.Task | None = None

    async def call(self, args: tuple):
        if isinstance(args[0], str) and " " in args[0]:  # redis-py names some commands in two words
            args = (*args[0].split(), *args[1:])
        packed = hiredis.pack_command(args)
        link = self.link
        fresh = False
        if link is None or link.error is not None:
            link, fresh = await self._connected(), True
        try:
            return await link.send(packed)
        except ConnectionError:
            if fresh or link.error is None:
                raise
            # The connection was lost before or while this command went out (Redis restarted):
            # once more on a new one.
            return await (await self._connected()).send(packed)

    async def _connected(self) -> _Link:
        """The open link, or a new one: one connection attempt at a time, which callers that give
        up (a timeout) leave running for the others."""
        if self.link is not None and self.link.error is None:
            return self.link
        if self.connecting is None:
            self.connecting = asyncio.get_running_loop().create_task(self._connect())
            self.connecting.add_done_callback(self._connected_or_not)
        return await asyncio.shield(self.connecting)

    async def _connect(self) -> _Link:
        connection = self.pool.connection_class(**self.pool.connection_kwargs)
        await connection.connect()
        self.link = _Link(connection)
        return self.link

    def _connected_or_not(self, task: asyncio.Task) -> None:
        self.connecting = None
        if not task.cancelled():
            task.exception()  # retrieved: each caller has it raised

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None
