"""`make run` (python -m sentinel.run) as a user meets it: from an empty data folder it serves the
printed curl command and SDK snippet, the admin login works, Ctrl-C leaves no process behind, and a
second start reuses the data."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest

from gateway.mock_provider import answer_text
from sentinel.startup import free_ports
from tests.servers import BASE_DIR, database_url_for, scrape_metrics

pytestmark = pytest.mark.servers  # runs `python -m sentinel.run` in a subprocess

READY_LINE = "Press Ctrl-C to stop everything"


class RunSession:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sentinel.run"],
            cwd=BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.output = self._read_until(READY_LINE, timeout=180)
        self.descendants = psutil.Process(self.process.pid).children(recursive=True)

    def _read_until(self, marker: str, timeout: float) -> str:
        lines = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line and self.process.poll() is not None:
                break
            lines.append(line)
            if marker in line:
                return "".join(lines)
        raise AssertionError("make run did not become ready:\n" + "".join(lines))

    def line(self, pattern: str) -> str:
        return re.search(pattern, self.output, re.MULTILINE).group(1)

    def ctrl_c(self) -> str:
        os.killpg(self.process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        rest, _ = self.process.communicate(timeout=60)
        return rest


def run_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "SENTINEL_DATA_DIR")
    }
    web_port, mock_port = free_ports(2)
    env.update(
        SENTINEL_DATA_DIR=str(data_dir),
        SENTINEL_PORT=str(web_port),
        SENTINEL_MOCK_PORT=str(mock_port),
        SENTINEL_WEB_WORKERS="1",
        **extra,
    )
    return env


def shell(command: str, env: dict[str, str]) -> str:
    result = subprocess.run(["bash", "-c", command], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def admin_login(gateway: str, username: str, password: str) -> httpx.Response:
    with httpx.Client(base_url=gateway, follow_redirects=True, timeout=30) as browser:
        page = browser.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        return browser.post(
            "/admin/login/?next=/admin/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": token},
            headers={"referer": gateway + "/admin/login/"},
        )


def processes_using(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        text = " ".join(proc.info["cmdline"] or []) + " " + (proc.info["cwd"] or "")
        if str(data_dir) in text:
            found.append(proc)
    return found


def logged_errors(log: str) -> list[str]:
    """The lines of a process's log that report an error: a JSON line at level ERROR or CRITICAL,
    or any other line (a library's own output, a traceback) naming an error."""
    found = []
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and "level" in record:
            if record["level"] in ("ERROR", "CRITICAL") or record.get("exc_info"):
                found.append(line)
        elif "Error" in line or "Traceback" in line:
            found.append(line)
    return found


def test_make_run_from_empty_data_then_again(tmp_path):
    data_dir = tmp_path / "d"
    first = RunSession(run_env(data_dir))
    try:
        gateway = first.line(r"export OPENAI_BASE_URL=(\S+)/v1$")
        key = first.line(r"export OPENAI_API_KEY=(\S+)$")
        username, password = re.search(r"login: (\S+) / (\S+)", first.output).groups()
        curl = first.line(r"^(curl .+)$")
        snippet = first.line(r"^(\.venv/bin/python -c .+)$")

        assert shell(curl, first.env).count(answer_text("Hello")) == 1
        assert shell(snippet, first.env).strip() == answer_text("Hello")
        exported = shell(
            f"export OPENAI_BASE_URL={gateway}/v1; export OPENAI_API_KEY={key}; "
            '.venv/bin/python -c "from openai import OpenAI; '
            "print(OpenAI().chat.completions.create(model='smart', "
            "messages=[{'role': 'user', 'content': 'Hi'}]).choices[0].message.content)\"",
            first.env,
        )
        assert exported.strip() == answer_text("Hi")
        # The console is shown at localhost, where security keys work (127.0.0.1 cannot hold them).
        shown = first.line(r"Console \(admin\)\s+(\S+)/admin/")
        assert shown == gateway.replace("127.0.0.1", "localhost")
        console = admin_login(shown, username, password)
        assert console.url.path == "/admin/"
        assert "Sentinel console" in console.text and "Log out" in console.text
        assert (data_dir / "pg" / "PG_VERSION").exists() and (data_dir / "valkey").is_dir()
        # The web workers share their metrics through the data folder; one scrape counts them all.
        assert (data_dir / "metrics").is_dir()
        served = scrape_metrics(gateway).samples.items()
        assert sum(v for (name, labels), v in served if name == "sentinel_requests_total") == 3  # curl, SDK, smart
        web_log = (data_dir / "logs" / "web.log").read_text().splitlines()
        assert web_log and all(line.startswith("{") for line in web_log)
    finally:
        first.ctrl_c()
    assert first.process.returncode == 0
    # Ctrl-C signals the whole terminal group: Valkey too once stopped at once, before the worker
    # using it (which logged "Error on restarting Gossip" and never shut down warm). Storage stops
    # last now: the worker and beat shut down warm and log no error. (A warning is no error: on a
    # loaded host the start-up readiness probe may log that Redis was slow, naming a TimeoutError.)
    for name in ("worker", "beat", "web"):
        log = (data_dir / "logs" / f"{name}.log").read_text()
        errors = logged_errors(log)
        assert not errors, (name, errors, log[-2000:])
    assert "Warm shutdown" in (data_dir / "logs" / "worker.log").read_text()
    time.sleep(0.5)
    assert [p for p in first.descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert processes_using(data_dir) == []

    second = RunSession(run_env(data_dir))
    try:
        assert re.search(r"login: (\S+) / (\S+)", second.output).groups() == (username, password)
        new_key = second.line(r"export OPENAI_API_KEY=(\S+)$")
        assert new_key != key
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "again"}]}
        url = second.line(r"export OPENAI_BASE_URL=(\S+)$") + "/chat/completions"
        assert httpx.post(url, json=body, headers={"authorization": f"Bearer {new_key}"}).status_code == 200
        old = httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"})
        assert (old.status_code, old.json()["error"]["code"]) == (401, "invalid_api_key")
    finally:
        second.ctrl_c()
    assert second.process.returncode == 0
    assert processes_using(data_dir) == []


@pytest.fixture
def external_database(live_db):
    """A fresh database on the test session's server, standing in for an operator's PostgreSQL."""
    name = "sentinel_ext_" + uuid.uuid4().hex[:8]
    admin_url = database_url_for("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    yield database_url_for(name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'drop database "{name}" with (force)')


@pytest.fixture
def external_redis():
    """Another database of the test session's Valkey, standing in for an operator's Redis: the
    session's own would get ledger records naming rows of the external database."""
    import redis

    url = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/1"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


def test_make_run_with_external_servers_starts_neither_embedded_one(tmp_path, external_database, external_redis):
    data_dir = tmp_path / "d"
    session = RunSession(run_env(data_dir, DATABASE_URL=external_database, REDIS_URL=external_redis))
    try:
        assert "Storage               DATABASE_URL / REDIS_URL" in session.output
        key = session.line(r"export OPENAI_API_KEY=(\S+)$")
        url = session.line(r"export OPENAI_BASE_URL=(\S+)$") + "/chat/completions"
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "external"}]}
        assert httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"}).status_code == 200
        assert not (data_dir / "pg").exists()
        assert not (data_dir / "valkey").exists()
        names = {" ".join(p.cmdline()) for p in session.descendants if p.is_running()}
        assert not any("valkey-server" in n or "postgres -D" in n for n in names)
    finally:
        session.ctrl_c()
    assert session.process.returncode == 0
