"""Leaving a process quickly once its work is done.

A Python process that has loaded litellm (and the thousands of pydantic models of its and the
OpenAI SDK's types) spends seconds tearing its modules down at exit, after everything it had to do
is done: 3 to 6 s measured here on a loaded 2-core host (`import litellm` then exit, against the
same then os._exit). Every stop of a web server, worker or beat paid it, and a test suite starts
and stops dozens of them. `exit_now` runs what the process registered to run at exit (atexit:
embedded servers it started stop, logs flush), then leaves without the teardown.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def exit_now(code: int | str | None = 0) -> NoReturn:
    """sys.exit(code), less the interpreter's teardown of its modules."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message") prints the message and exits 1
        print(code, file=sys.stderr)
        status = 1
    try:
        atexit._run_exitfuncs()  # CPython's own: what normal exit runs first (documented in atexit's tests)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing more to write
                stream.flush()
        os._exit(status)
