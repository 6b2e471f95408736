"""The test session's settings: Sentinel's own, with the embedded servers in their own folder so a
`make run` in another terminal is never touched (and its data never wiped)."""

import os

os.environ.setdefault("SENTINEL_DATA_DIR", ".data/test")
# Tests deliver webhooks and guardrail calls to listeners on 127.0.0.1, which the egress guard refuses
# unless an operator allows it. Set in the environment, so the gateways and workers tests start allow it
# too; tests of the guard itself start theirs with SENTINEL_EGRESS_ALLOW="" (tests/sentinel/test_egress.py).
os.environ.setdefault("SENTINEL_EGRESS_ALLOW", "127.0.0.1")

# The test session's entry point: pytest-django reads these settings before any conftest, so the
# embedded servers (when DATABASE_URL / REDIS_URL are unset) start here; the gateways and workers the
# tests start inherit the URLs.
from sentinel.embedded import ensure_environment

ensure_environment()

from sentinel.settings import *  # noqa: E402,F403

# Users are created by the dozen (the tenancy fixture makes five per test): a fast hasher keeps that
# from costing seconds per test. The gateway processes tests start load these settings too.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
