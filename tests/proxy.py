"""A TCP proxy on 127.0.0.1 that can stop forwarding: a server that stalls without going away (a
frozen Valkey, a hung network path), without freezing the server itself for anyone else using it.
Used by the Redis-stall tests and the `redis_stall` benchmark."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class StallingProxy:
    """Forwards 127.0.0.1:<port> to the target. `stall()` stops forwarding in both directions:
    connections stay open and new ones are accepted, but nothing gets through (what was sent is held,
    as a frozen server's socket buffers hold it); `resume()` delivers what was held and forwards again,
    and returns once the server has answered everything sent to it (so its effects can be checked).
    Its threads end with `close()`; use it as a context manager."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.flowing = threading.Event()
        self.flowing.set()
        self.closed = False
        self.sockets: list[socket.socket] = []
        self.unanswered: set[socket.socket] = set()  # client sockets whose last request has no answer yet
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stall(self) -> None:
        self.flowing.clear()

    def resume(self, wait_seconds: float = 10.0) -> bool:
        """Forward again; True once every connection's last request has been answered (or closed)."""
        self.flowing.set()
        deadline = time.monotonic() + wait_seconds
        while self.unanswered and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self.unanswered

    def close(self) -> None:
        self.closed = True
        self.flowing.set()  # wake the pumps so they notice
        with self.lock:
            for sock in [self.listener, *self.sockets]:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> StallingProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                continue
            with self.lock:
                self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, client: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if data:
                # A request awaits its answer until the server sends something back (received
                # counts, even while stalled: the server has run it).
                (self.unanswered.add if source is client else self.unanswered.discard)(client)
                self.flowing.wait()  # stalled: hold what came in until resumed (or closed)
            if not data or self.closed:
                break
            try:
                sink.sendall(data)
            except OSError:
                break
        if source is client:
            # The client is done: pass that on, and let the server's answer to what it sent before
            # leaving still come back (the server runs it either way).
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
            return
        self.unanswered.discard(client)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
