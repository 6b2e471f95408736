"""The web process (python -m sentinel.web): workers on SO_REUSEPORT sockets, a killed worker
replaced while the others keep serving, and nothing left behind when it stops."""

import os
import signal
import time

import httpx
import psutil

from tests.servers import start_gateway


def workers_of(gateway) -> list[psutil.Process]:
    return psutil.Process(gateway.process.pid).children()


def listeners(gateway) -> list[psutil.Process]:
    port = int(gateway.base_url.split(":")[2].split("/")[0])
    found = []
    for worker in workers_of(gateway):
        try:
            sockets = worker.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in sockets):
            found.append(worker)
    return found


def test_a_killed_worker_is_replaced_while_the_other_serves(test_database_name, api_key, model):
    gateway = start_gateway(test_database_name, workers=2)
    try:
        # Both workers started and each listening on its own SO_REUSEPORT socket (a worker that is
        # still importing has no socket yet, and killing the only listener would refuse the next call).
        deadline = time.monotonic() + 30
        while len(listening := listeners(gateway)) != 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        first, second = listening
        os.kill(first.pid, signal.SIGKILL)
        # Connections the kernel had already queued on the dead worker's socket are reset (clients
        # retry those); once it is gone, the other worker's socket takes every new connection.
        first.wait(10)
        body = {"model": model[0], "messages": [{"role": "user", "content": "still there?"}]}
        headers = {"authorization": f"Bearer {api_key}"}
        assert (
            httpx.post(f"{gateway.base_url}/chat/completions", json=body, headers=headers, timeout=30).status_code
            == 200
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            alive = [p for p in workers_of(gateway) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            if len(alive) == 2 and first.pid not in {p.pid for p in alive}:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the killed worker was not replaced")
        assert gateway.process.poll() is None
    finally:
        everyone = [psutil.Process(gateway.process.pid), *workers_of(gateway)]
        gateway.stop()
    time.sleep(0.5)
    assert not [p for p in everyone if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_readiness_names_an_unreachable_database_while_liveness_holds(test_database_name):
    """A web process whose database is gone stays alive (nothing to restart) and says it is not
    ready, naming the part that fails, so a load balancer stops sending it traffic."""
    gateway = start_gateway(
        test_database_name,
        env={"DATABASE_URL": "postgresql://sentinel@127.0.0.1:1/gone"},
        wait_path="/health/live",
    )
    try:
        ready = httpx.get(f"{gateway.url}/health/ready", timeout=15)
        assert (ready.status_code, ready.json()) == (503, {"status": "unavailable", "failing": ["database"]})
        assert httpx.get(f"{gateway.url}/health/live", timeout=5).status_code == 200
    finally:
        gateway.stop()


def test_readiness_is_ok_when_database_and_redis_answer(gateway):
    ready = httpx.get(f"{gateway.url}/health/ready", timeout=5)
    assert (ready.status_code, ready.json()) == (200, {"status": "ok"})
