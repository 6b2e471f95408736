"""How a web process settles once loaded (sentinel.startup.settle_web_process), in a process of its own:
numpy's BLAS on one thread, the loaded heap frozen, young objects collected less often."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import gc, json
import numpy
from threadpoolctl import threadpool_info
from sentinel.startup import settle_web_process

def blas():
    return sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})

before = {"blas": blas(), "frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}
settle_web_process()
after = {"blas": blas(), "frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}
print(json.dumps({"before": before, "after": after}))
"""


def test_a_settled_web_process_runs_blas_on_one_thread_and_freezes_what_it_loaded() -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(out.stdout)
    cores = len(os.sched_getaffinity(0))
    assert seen["before"]["blas"] == [cores]  # numpy's default: a thread per core
    assert seen["before"]["frozen"] == 0 and seen["before"]["threshold"][0] != 20_000
    assert seen["after"] == {"blas": [1], "frozen": seen["after"]["frozen"], "threshold": [20_000, 20, 40]}
    assert seen["after"]["frozen"] > 10_000  # numpy's and threadpoolctl's modules, at least
