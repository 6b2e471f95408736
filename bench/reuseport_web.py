"""One Sentinel web worker (uvicorn, same options as `make run`) on its own SO_REUSEPORT socket.

`uvicorn --workers N` shares one listening socket between its workers, and the worker that wakes
first accepts a whole burst of new connections: with a few keep-alive clients (a load generator, an
app's connection pool) one worker can end up serving every request while the others idle. N of these
processes on the same port let the kernel spread connections evenly instead; `--reuse-port` on the
overhead scenario runs Sentinel this way to show what that imbalance costs.

    python -m bench.reuseport_web --port 8000
"""

from __future__ import annotations

import argparse
import socket

import uvicorn


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((args.host, args.port))
    config = uvicorn.Config("sentinel.asgi:application", lifespan="off", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
