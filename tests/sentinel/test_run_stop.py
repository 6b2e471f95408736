"""How `make run` stops its children: the leader of each is asked to stop and stops its own
processes in order, the way a Celery worker finishes the task its pool child is running (a warm
shutdown). Signalling the whole process group instead stopped the pool child mid-task, and the worker
logged WorkerLostError (CI, 2026-12-04)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from sentinel.run import Child, stop_all

# A leader with one child in its process group. The child "works" for a moment and records how its
# work ended; on SIGTERM the leader waits for its child to finish, then exits (a warm shutdown).
LEADER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    out = sys.argv[1]
    child = subprocess.Popen([sys.executable, "-c", '''
    import signal, sys, time
    out = sys.argv[1]
    def interrupted(*_):
        open(out, "w").write("interrupted")
        sys.exit(1)
    signal.signal(signal.SIGTERM, interrupted)
    open(out + ".ready", "w").write("")
    time.sleep(1.0)
    open(out, "w").write("finished")
    ''', out])
    def warm(*_):
        child.wait()
        sys.exit(0)
    signal.signal(signal.SIGTERM, warm)
    time.sleep(60)
    """
)


def test_stop_lets_the_leader_finish_its_childrens_work(tmp_path: Path):
    out = tmp_path / "outcome"
    leader = Child("worker", [sys.executable, "-c", LEADER, str(out)])
    leader.start(tmp_path, {"PATH": "/usr/bin:/bin"})
    from tests.conftest import wait_for

    wait_for(lambda: (tmp_path / "outcome.ready").exists(), timeout=20, what="the child to start working")
    stop_all([leader])
    assert out.read_text() == "finished"
    assert leader.process.returncode == 0
    assert not leader.group_alive()
