"""The test session's settings: Sentinel's own, with the embedded servers in their own folder so a
`make run` in another terminal is never touched (and its data never wiped)."""

import os

os.environ.setdefault("SENTINEL_DATA_DIR", ".data/test")

from sentinel.settings import *  # noqa: E402,F403
