"""`python -m sentinel.celery_cli -A sentinel worker|beat ...`: Celery's own command line, leaving
without the interpreter's module teardown once Celery has shut down (sentinel.shutdown: seconds
per stop). Celery's warm shutdown is unchanged: tasks in progress finish first."""

from __future__ import annotations

from sentinel.shutdown import exit_now


def main() -> None:
    from celery.__main__ import main as celery

    try:
        celery()
    except SystemExit as finished:
        exit_now(finished.code)
    exit_now(0)


if __name__ == "__main__":
    main()
