"""The web process: uvicorn serving sentinel.asgi with N workers, logging JSON lines, and the folder
where those workers share their metrics, emptied first so a scrape never adds up an earlier run's.

    python -m sentinel.web --host 0.0.0.0 --port 8000 --workers 2

`make run`, docker-compose.yml and the tests all start the web process this way.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import tempfile
from pathlib import Path

from sentinel import logs
from sentinel.env import envstr


def prepare_metrics_dir() -> Path:
    """PROMETHEUS_MULTIPROC_DIR, created and emptied; a temporary folder when it is unset.

    It has to be in the environment before any worker imports prometheus_client, and no two web
    processes may share one (each empties it as it starts)."""
    configured = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
    else:
        path = Path(tempfile.mkdtemp(prefix="sentinel-metrics-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    return path


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Serve Sentinel's web process (API, console, metrics).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    prepare_metrics_dir()
    level = envstr("SENTINEL_LOG_LEVEL", "INFO", "Log level of Sentinel's own loggers.")
    import uvicorn  # after the metrics folder is set: workers inherit the environment

    uvicorn.run(
        "sentinel.asgi:application",
        host=args.host,
        port=args.port,
        workers=args.workers,
        lifespan="off",
        access_log=False,  # the gateway logs each chat completion itself, with more to say
        log_config=logs.config(level),
    )


if __name__ == "__main__":
    main()
