"""The test session's settings: Sentinel's own, with the embedded servers in their own folder so a
`make run` in another terminal is never touched (and its data never wiped)."""

import os
import sys

from sentinel.embedded import environment


def xdist_controller() -> bool:
    """True in the process that hands tests to pytest-xdist's workers (`pytest -n 2`): it runs no
    test, so it starts no server, and leaves its environment as it found it for the workers."""
    # Not pytest at all: a Celery worker or gateway a test started reads these settings too, and its
    # own `-n name@host` is no worker count (a serial run's workers got the controller's dummy URLs).
    if os.environ.get("PYTEST_XDIST_WORKER") or "pytest" not in sys.modules:
        return False
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        if arg in ("-n", "--numprocesses"):
            return i + 1 < len(args) and _workers(args[i + 1])
        if arg.startswith("--numprocesses="):
            return _workers(arg.partition("=")[2])
        if arg.startswith("-n") and arg[2:].isdigit():
            return _workers(arg[2:])
    return False


def _workers(count: str) -> bool:
    return count in ("auto", "logical") or (count.isdigit() and count != "0")


# Each pytest-xdist worker (gw0, gw1, ...) gets its own embedded servers and data folder, so a
# worker's tests have a database, a Redis and processes of their own, as in a serial run. (The
# controller sets nothing here: its workers inherit its environment; the processes a worker starts
# inherit the worker's.)
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if not xdist_controller():
    os.environ.setdefault("SENTINEL_DATA_DIR", f".data/test-{WORKER}" if WORKER else ".data/test")
# Tests deliver webhooks and guardrail calls to listeners on 127.0.0.1, which the egress guard refuses
# unless an operator allows it. Set in the environment, so the gateways and workers tests start allow it
# too; tests of the guard itself start theirs with SENTINEL_EGRESS_ALLOW="" (tests/sentinel/test_egress.py).
os.environ.setdefault("SENTINEL_EGRESS_ALLOW", "127.0.0.1")

# The test session's entry point: pytest-django reads these settings before any conftest, so the
# embedded servers (when DATABASE_URL / REDIS_URL are unset) start here; the gateways and workers the
# tests start inherit the URLs.
if xdist_controller():
    # Addresses that lead nowhere, set only while the settings are read (the workers it starts
    # inherit this process's environment and start their own servers).
    with environment(DATABASE_URL="postgres://xdist-controller@127.0.0.1:9/none", REDIS_URL="redis://127.0.0.1:9/0"):
        from sentinel.settings import *  # noqa: F403
else:
    from sentinel.embedded import ensure_environment

    ensure_environment()

    from sentinel.settings import *  # noqa: F403

# Users are created by the dozen (the tenancy fixture makes five per test): a fast hasher keeps that
# from costing seconds per test. The gateway processes tests start load these settings too.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
