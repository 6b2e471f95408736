"""A round-robin TCP load balancer for tests: each new connection goes to the next backend. Small on
purpose (a dozen lines of asyncio) so a test can see exactly where each connection went."""

from __future__ import annotations

import asyncio
import threading


class RoundRobinProxy:
    def __init__(self, backends: list[str]) -> None:
        """backends: base URLs (http://127.0.0.1:PORT)."""
        self.backends = [tuple(url.removeprefix("http://").rsplit(":", 1)) for url in backends]
        self.connections = [0] * len(backends)
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.url = ""

    def start(self) -> RoundRobinProxy:
        self._thread.start()
        start = asyncio.start_server(self._handle, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, client_reader, client_writer) -> None:
        index = self._next
        self._next = (self._next + 1) % len(self.backends)
        self.connections[index] += 1
        host, port = self.backends[index]
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(_pipe(client_reader, upstream_writer), _pipe(upstream_reader, client_writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
