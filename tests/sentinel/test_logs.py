"""Structured logs: every line a gateway process writes is one JSON object; the lines of a request
carry its id; prompts and answers never reach the log, not even at DEBUG with litellm asked to talk."""

from __future__ import annotations

import logging
import time
import uuid

import httpx
import orjson
import pytest

from gateway.mock_provider import answer_text
from sentinel import logs
from tests.servers import start_gateway


def json_lines(lines: list[str]) -> list[dict]:
    records = []
    for line in lines:
        record = orjson.loads(line)  # raises on anything that is not one JSON object per line
        assert isinstance(record, dict)
        assert {"time", "level", "logger", "message", "request_id"} <= set(record), line
        records.append(record)
    return records


def test_the_request_log_line_carries_the_request_id(gateway, api_key, model):
    alias, (provider,) = model
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {api_key}"},
        json={"model": alias, "messages": [{"role": "user", "content": "log me"}]},
    )
    request_id = response.headers["x-sentinel-request-id"]
    time.sleep(0.2)
    records = json_lines(gateway.log_lines())
    mine = [r for r in records if r["request_id"] == request_id]
    assert [r["message"] for r in mine] == ["request finished"]
    line = mine[0]
    assert (line["logger"], line["level"]) == ("gateway.requests", "INFO")
    assert (line["model"], line["provider"], line["status"], line["code"]) == (alias, provider, 200, "")
    assert line["completion_tokens"] == 40
    assert line["cost_usd"] == response.headers["x-sentinel-cost-usd"]


@pytest.fixture(scope="module")
def chatty_gateway(test_database_name, mock_provider):
    """A gateway asked to log everything it can: Sentinel at DEBUG, litellm at DEBUG."""
    server = start_gateway(test_database_name, env={"SENTINEL_LOG_LEVEL": "DEBUG", "LITELLM_LOG": "DEBUG"})
    yield server
    server.stop()


@pytest.mark.parametrize("transport", ["auto", "litellm"])
def test_prompts_and_answers_are_never_logged(chatty_gateway, make_key, tenant, make_model, transport):
    alias, _ = make_model(transport=transport)
    key = make_key(tenant)
    prompt = f"secret prompt {uuid.uuid4().hex}"
    ids = []
    for stream in (False, True):
        response = httpx.post(
            f"{chatty_gateway.base_url}/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={"model": alias, "messages": [{"role": "user", "content": prompt}], "stream": stream},
            timeout=30,
        )
        assert response.status_code == 200
        if stream:
            assert response.text.endswith("data: [DONE]\n\n")
        else:
            assert response.json()["choices"][0]["message"]["content"] == answer_text(prompt)
        ids.append(response.headers["x-sentinel-request-id"])
    time.sleep(0.3)
    text = "\n".join(chatty_gateway.log_lines())
    assert prompt not in text
    assert answer_text(prompt) not in text
    assert prompt.split()[-1] not in text  # not even the unique part, escaped or cut
    records = json_lines(chatty_gateway.log_lines())
    assert {r["request_id"] for r in records if r["message"] == "request finished"} >= set(ids)


def test_screened_text_is_never_logged(chatty_gateway, make_key, make_tenant, make_model, mock_provider):
    """Blocked and redacted text, and text sent to a moderation provider through litellm, stay out of
    the log even with Sentinel and litellm at DEBUG."""
    from gateway.models import Provider
    from gateway.screening.models import ScreeningPolicy

    moderation = Provider(name=f"mod-{uuid.uuid4().hex[:8]}", kind="openai")
    moderation.api_base = mock_provider.api_base(moderation.name)
    moderation.save()
    tenant = make_tenant()
    ScreeningPolicy.objects.create(tenant=tenant, email="redact", moderation_provider=moderation)
    alias, _ = make_model()
    key = make_key(tenant)
    marker = uuid.uuid4().hex[:12]
    redacted, blocked = f"mail me at x{marker}@example.com", f"card 4111 1111 1111 1111 {marker}"
    statuses = []
    for prompt in (redacted, blocked):
        response = httpx.post(
            f"{chatty_gateway.base_url}/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={"model": alias, "messages": [{"role": "user", "content": prompt}]},
            timeout=30,
        )
        statuses.append(response.status_code)
    assert statuses == [200, 400]
    time.sleep(0.3)
    text = "\n".join(chatty_gateway.log_lines())
    assert marker not in text and "4111 1111" not in text


def test_a_tenant_that_logs_prompts_gets_them_screened_in_its_request_lines(
    chatty_gateway, make_key, make_tenant, make_model
):
    """log_prompts on: the request line of each answered request carries the messages (as screening
    left them: the e-mail masked) and the answer, streamed or not; a blocked request's text is still
    never logged, and another tenant's lines carry neither."""
    from gateway.screening.models import ScreeningPolicy

    logging_tenant, quiet_tenant = make_tenant(log_prompts=True), make_tenant()
    ScreeningPolicy.objects.create(tenant=logging_tenant, email="redact")
    alias, _ = make_model()
    marker = uuid.uuid4().hex[:12]
    sent = f"summarize {marker} for x{marker}@example.com"
    seen_by_provider = f"summarize {marker} for [EMAIL]"

    def ask(key: str, prompt: str, stream: bool = False) -> httpx.Response:
        return httpx.post(
            f"{chatty_gateway.base_url}/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={"model": alias, "messages": [{"role": "user", "content": prompt}], "stream": stream},
            timeout=30,
        )

    key = make_key(logging_tenant)
    # The streamed prompt asks something else (2 sentences): "... again" was served the first
    # answer from the semantic cache once the verifier read it as the same request.
    plain, streamed = ask(key, sent), ask(key, sent + " in 2 sentences", stream=True)
    blocked = ask(key, f"card 4111 1111 1111 1111 {marker}")
    quiet = ask(make_key(quiet_tenant), f"quiet {marker}")
    assert [r.status_code for r in (plain, streamed, blocked, quiet)] == [200, 200, 400, 200]
    time.sleep(0.3)
    lines = {r["request_id"]: r for r in json_lines(chatty_gateway.log_lines()) if r["message"] == "request finished"}

    line = lines[plain.headers["x-sentinel-request-id"]]
    assert line["messages"] == [{"role": "user", "content": seen_by_provider}]
    assert line["answer"] == plain.json()["choices"][0]["message"]["content"] == answer_text(seen_by_provider)
    line = lines[streamed.headers["x-sentinel-request-id"]]
    assert line["messages"] == [{"role": "user", "content": seen_by_provider + " in 2 sentences"}]
    assert line["answer"] == answer_text(seen_by_provider + " in 2 sentences")
    for response in (blocked, quiet):
        line = lines[response.headers["x-sentinel-request-id"]]
        assert "messages" not in line and "answer" not in line
    text = "\n".join(chatty_gateway.log_lines())
    assert f"x{marker}@example.com" not in text and "4111 1111" not in text and f"quiet {marker}" not in text


def test_litellm_loggers_go_through_sentinels_handlers():
    library = logging.getLogger("sentinel-test-library")
    library.addHandler(logging.StreamHandler())
    library.propagate = False
    library.setLevel(logging.DEBUG)
    logs.adopt_loggers(("sentinel-test-library",))
    assert library.handlers == []
    assert library.propagate is True
    assert library.level == logging.WARNING


def test_records_carry_the_current_request_id():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    token = logs.request_id.set("req-in-context")
    try:
        logs.RequestIdFilter().filter(record)
    finally:
        logs.request_id.reset(token)
    assert record.request_id == "req-in-context"
    outside = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    logs.RequestIdFilter().filter(outside)
    assert outside.request_id is None


def test_a_hostile_admin_query_string_is_a_400_logged_as_a_warning(gateway, tenancy):
    """Filtering the admin across a relation it does not offer (here: password hashes by prefix,
    through the key's tenant's members) raises DisallowedModelAdminLookup, which Django logs at
    ERROR with a traceback. It is the client's fault: a 400, and one warning line, no traceback."""
    from tests.console.conftest import as_user

    start = len(gateway.log_lines())
    cookies = {"sessionid": as_user(tenancy.owner).cookies["sessionid"].value}
    for query in ("tenant__memberships__user__password__startswith=pbkdf2", "tenant__slug=x"):
        refused = httpx.get(f"{gateway.url}/admin/tenants/virtualkey/?{query}", cookies=cookies, timeout=30)
        assert refused.status_code == 400
        assert refused.headers["x-content-type-options"] == "nosniff"
    records = json_lines(gateway.log_lines()[start:])
    assert [r for r in records if r["level"] in ("ERROR", "CRITICAL")] == []
    warnings = [r for r in records if r["logger"] == "django.security.DisallowedModelAdminLookup"]
    assert [r["level"] for r in warnings] == ["WARNING", "WARNING"]
    assert warnings[0]["message"] == "Filtering by tenant__memberships__user__password__startswith not allowed"
    assert not any("exc_info" in r for r in warnings)


def test_a_quiet_worker_logs_nothing_per_task(test_database_name):
    """Beat's periodic jobs ran one INFO line each through the worker (received, succeeded): ~1 MB
    of log a quarter-hour with nothing happening. Now a task that runs and succeeds writes nothing,
    and the worker still says when it is ready."""
    from sentinel.celery import app
    from tests.servers import start_celery_worker

    worker = start_celery_worker(test_database_name, name="quiet")
    try:
        app.send_task("gateway.tasks.prune_cache")
        deadline = time.monotonic() + 60
        done = 0
        while not done and time.monotonic() < deadline:
            stats = app.control.inspect(timeout=1.0).stats() or {}
            done = sum(s.get("total", {}).get("gateway.tasks.prune_cache", 0) for s in stats.values())
        assert done >= 1
    finally:
        worker.stop()
    text = worker.log_path.read_text()
    assert "ready." in text
    assert "gateway.tasks.prune_cache[" not in text  # neither "Task ...[id] received" nor "... succeeded in"
