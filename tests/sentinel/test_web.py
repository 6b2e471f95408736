"""The web process (python -m sentinel.web): workers on SO_REUSEPORT sockets, a killed worker
replaced while the others keep serving, nothing left behind when it stops, and a bounded request
head."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import orjson
import psutil
import pytest

from tests.servers import BASE_DIR, database_url_for, free_port, start_gateway


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
        first, _second = listening
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
        body = ready.json()
        assert body.pop("semantic_cache") in {"ready", "loading"}
        assert (ready.status_code, body) == (503, {"status": "unavailable", "failing": ["database"]})
        assert httpx.get(f"{gateway.url}/health/live", timeout=5).status_code == 200
    finally:
        gateway.stop()


def test_readiness_is_ok_when_database_and_redis_answer(gateway):
    """And says whether the embedding model has loaded (the session's gateway waits for it)."""
    ready = httpx.get(f"{gateway.url}/health/ready", timeout=5)
    assert (ready.status_code, ready.json()) == (200, {"status": "ok", "semantic_cache": "ready"})


def test_an_oversized_request_head_is_refused_and_the_server_stays_up(gateway, api_key, model):
    """uvicorn's httptools protocol reads headers of any size: a 40 MB Authorization header was read
    and hashed. Here the head is bounded (SENTINEL_MAX_HEADER_BYTES, 32 KiB): 431 in OpenAI's error
    shape, whichever endpoint and header, and the next request is served as usual."""
    chat = {"model": model[0], "messages": [{"role": "user", "content": "hi"}]}
    for path, headers in [
        ("/v1/chat/completions", {"authorization": "Bearer sk-sen-" + "x" * (40 * 1024 * 1024)}),
        ("/v1/chat/completions", {"x-api-key": "y" * (64 * 1024)}),
        ("/v1/models", {"x-padding": "z" * (33 * 1024)}),
        ("/admin/login/", {"cookie": "sessionid=" + "c" * (40 * 1024)}),
    ]:
        refused = httpx.post(gateway.url + path, headers=headers, json=chat, timeout=60)
        assert refused.status_code == 431, (path, refused.status_code)
        assert refused.json() == {
            "error": {
                "message": "Request headers are larger than 32768 bytes.",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_headers_too_large",
            }
        }
        assert refused.headers["x-content-type-options"] == "nosniff"
        assert refused.headers["connection"] == "close"

    # Behind a small request in the same read (pipelined), a large head is measured all the same: the
    # small one is answered, then the connection closes.
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        small = b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        raw.sendall(small + b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 40_000 + b"\r\n\r\n")
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    assert answer.count(b"HTTP/1.1 ") == 1 and answer.startswith(b"HTTP/1.1 200 OK")

    served = httpx.post(
        f"{gateway.base_url}/chat/completions", headers={"authorization": f"Bearer {api_key}"}, json=chat, timeout=30
    )
    assert served.status_code == 200
    assert gateway.process.poll() is None
    assert not [line for line in gateway.log_lines() if '"level":"ERROR"' in line]


def test_a_head_just_under_the_bound_is_served(gateway, api_key, model):
    chat = {"model": model[0], "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {api_key}", "x-padding": "p" * (30 * 1024)}
    assert httpx.post(f"{gateway.base_url}/chat/completions", headers=headers, json=chat, timeout=30).status_code == 200


def test_a_malformed_request_is_answered_in_openais_error_shape(gateway):
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 400 Bad Request"
    assert b"x-content-type-options: nosniff" in head.split(b"\r\n")
    assert orjson.loads(body)["error"]["code"] == "invalid_http_request"
    assert httpx.get(f"{gateway.url}/health/live", timeout=5).status_code == 200


def test_a_worker_that_cannot_start_says_why_and_the_process_gives_up(test_database_name):
    """A worker that fails as it starts (here: an address this host does not have) prints its
    traceback and exits 1; the parent reports each exit status and stops once they keep dying.
    A worker's os._exit(0) used to swallow the traceback: the log said only 'exited (status 0)'."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url_for(test_database_name)}
    done = subprocess.run(
        [sys.executable, "-m", "sentinel.web", "--host", "192.0.2.1", "--port", str(port), "--workers", "2"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "OSError: [Errno 99] Cannot assign requested address" in done.stderr
    assert "exited (status 1); starting another" in done.stderr
    assert "exited (status 0)" not in done.stderr
    assert "web workers keep dying" in done.stderr


@pytest.mark.parametrize("length", [b"9" * 20, b"9" * 5000, b"\xb2", b"-1", b"1 2", b"0x10"])
def test_a_content_length_past_any_number_or_not_a_number_is_a_400(gateway, length):
    """The parser (llhttp) refuses a length past 64 bits, a non-digit (a Latin-1 superscript two, which
    Python's isdigit() takes and int() refuses), a sign or a second number before the gateway reads a
    byte: a 400 in OpenAI's error shape, and the server goes on."""
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n{}")
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 400 Bad Request", length
    assert orjson.loads(body)["error"]["code"] == "invalid_http_request"
    assert httpx.get(f"{gateway.url}/health/live", timeout=5).status_code == 200
    assert gateway.process.poll() is None
