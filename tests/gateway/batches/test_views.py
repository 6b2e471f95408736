"""/v1/files and /v1/batches end to end: the official OpenAI SDK uploads a file, creates a batch, a
real Celery worker runs it through the request path, and the SDK reads the results."""

from __future__ import annotations

import time
from decimal import Decimal

import httpx
import openai
import orjson
import pytest
from openai import OpenAI

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.batches.models import Batch, BatchFile, BatchItem
from gateway.mock_provider import answer_text
from gateway.models import Deployment
from tenants.models import Budget
from tests.gateway import test_token_pricing
from tests.gateway.batches.conftest import finished, jsonl, output_lines, stored_batch, wait_for
from tests.servers import start_gateway


def sdk(gateway, key: str) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)


def drained_rows(request_ids: list[str]) -> list[LedgerEntry]:
    drain()
    return list(LedgerEntry.objects.filter(request_id__in=request_ids).order_by("request_id"))


def test_the_openai_sdk_runs_a_batch_end_to_end(gateway, batch_worker, make_tenant, make_key, make_model):
    tenant = make_tenant()
    key = make_key(tenant)
    model, (provider,) = make_model()
    client = sdk(gateway, key)
    prompts = [f"batch prompt {i}" for i in range(5)]
    content = jsonl(model, prompts)

    uploaded = client.files.create(file=("input.jsonl", content), purpose="batch")
    assert (uploaded.purpose, uploaded.bytes, uploaded.filename, uploaded.object) == (
        "batch",
        len(content),
        "input.jsonl",
        "file",
    )
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    assert client.files.content(uploaded.id).content == content

    created = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert created.status == "validating"
    assert created.input_file_id == uploaded.id
    assert created.metadata == {"job": "nightly"}
    assert created.expires_at - created.created_at == 24 * 3600

    batch = finished(client, created.id)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 5, "completed": 5, "failed": 0}
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.error_file_id is None
    rows = output_lines(client, batch.output_file_id)
    assert [row["custom_id"] for row in rows] == [f"req-{i}" for i in range(5)]
    for i, row in enumerate(rows):
        assert row["error"] is None
        assert row["id"].startswith("batch_req_")
        assert row["response"]["status_code"] == 200
        assert row["response"]["request_id"] == f"{batch.id}:{i + 1}"
        assert row["response"]["body"]["choices"][0]["message"]["content"] == answer_text(prompts[i])
    output = client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output"
    assert batch.usage.input_tokens == sum(row["response"]["body"]["usage"]["prompt_tokens"] for row in rows)
    assert batch.usage.output_tokens == 5 * 40

    # Through the same path as interactive calls: one ledger row per request, billed to the batch's key.
    ledger = drained_rows([f"{batch.id}:{i + 1}" for i in range(5)])
    assert [row.status_code for row in ledger] == [200] * 5
    assert {(row.tenant_id, row.key.digest, row.provider, row.model_requested) for row in ledger} == {
        (tenant.pk, Batch.objects.get(public_id=batch.id).key.digest, provider, model)
    }
    assert all(row.cost_usd > 0 for row in ledger)

    assert batch.id in [b.id for b in client.batches.list()]
    assert {f.id for f in client.files.list(purpose="batch")} == {uploaded.id}


def test_a_file_with_bad_lines_fails_the_batch_naming_each_line(gateway, batch_worker, tenant, api_key, model):
    alias, _ = model
    good = orjson.loads(jsonl(alias, ["fine"]).splitlines()[0])
    lines = [
        orjson.dumps(good),
        b"{not json",
        orjson.dumps({**good, "custom_id": "other", "method": "GET"}),
        orjson.dumps({**good, "custom_id": "third", "url": "/v1/embeddings"}),
        orjson.dumps(good),  # the same custom_id again
        orjson.dumps({**good, "custom_id": "fifth", "body": {"model": alias, "messages": []}}),
        orjson.dumps({**good, "custom_id": "sixth", "body": {**good["body"], "stream": True}}),
        orjson.dumps({**good, "custom_id": "seventh\u0000"}),  # PostgreSQL cannot store a NUL
        # Issue #15, 5: a line 300 deep crashed the read, and the batch stayed validating.
        orjson.dumps({**good, "custom_id": "ninth", "body": {**good["body"], "x": [[]]}}).replace(
            b"[[]]", b"[" * 300 + b"]" * 300
        ),
        orjson.dumps({**good, "custom_id": "tenth", "body": {**good["body"], "user": "a\u0000"}}),
    ]
    client = sdk(gateway, api_key)
    uploaded = client.files.create(file=("bad.jsonl", b"\n".join(lines)), purpose="batch")
    batch = finished(
        client,
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )

    assert batch.status == "failed"
    assert batch.failed_at is not None
    assert [(e.line, e.code, e.param) for e in batch.errors.data] == [
        (2, "invalid_json_line", None),
        (3, "invalid_method", "method"),
        (4, "mismatched_endpoint", "url"),
        (5, "duplicate_custom_id", "custom_id"),
        (6, "invalid_value", "body.messages"),
        (7, "invalid_value", "body.stream"),
        (8, "invalid_custom_id", "custom_id"),
        (9, "nesting_too_deep", "body.x"),
        (10, "invalid_value", "body.user"),
    ]
    assert not BatchItem.objects.filter(batch__public_id=batch.id).exists()  # nothing ran
    assert batch.request_counts.total == 0


@pytest.mark.parametrize(
    ("content", "code"), [(b"\xff\xfe binary", "invalid_file"), (b"", "empty_file"), (b"\n\n", "empty_file")]
)
def test_a_file_that_is_not_jsonl_fails_the_batch(content, code, gateway, batch_worker, api_key):
    client = sdk(gateway, api_key)
    uploaded = client.files.create(file=("odd.bin", content), purpose="batch")  # stored as sent
    assert uploaded.bytes == len(content)
    batch = finished(
        client,
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )
    assert batch.status == "failed"
    assert [(e.code, e.line) for e in batch.errors.data] == [(code, None)]


def test_requests_that_fail_go_to_the_error_file(gateway, batch_worker, make_tenant, make_key, make_model):
    tenant = make_tenant()
    client = sdk(gateway, make_key(tenant))
    alias, _ = make_model()
    content = jsonl(alias, ["works"]) + jsonl("no-such-model", ["fails"]).replace(b"req-0", b"req-1")
    uploaded = client.files.create(file=("mixed.jsonl", content), purpose="batch")
    batch = finished(
        client,
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )

    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 2, "completed": 1, "failed": 1}
    assert [row["custom_id"] for row in output_lines(client, batch.output_file_id)] == ["req-0"]
    (error,) = output_lines(client, batch.error_file_id)
    assert error["custom_id"] == "req-1"
    assert error["response"]["status_code"] == 404
    assert error["response"]["body"]["error"]["code"] == "model_not_found"


def test_items_wait_out_rate_limits_instead_of_failing(gateway, batch_worker, make_tenant, make_key, make_model):
    """Batch items count against the key's limits like any request, but wait for capacity: with 2
    requests per (2-second) window, 6 items take at least two more windows and none fails."""
    tenant = make_tenant()
    client = sdk(gateway, make_key(tenant, requests_per_minute=2))
    alias, _ = make_model()
    uploaded = client.files.create(file=("six.jsonl", jsonl(alias, [f"paced {i}" for i in range(6)])), purpose="batch")
    batch = finished(
        client,
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )

    assert batch.request_counts.model_dump() == {"total": 6, "completed": 6, "failed": 0}
    ledger = drained_rows([f"{batch.id}:{i}" for i in range(1, 7)])
    assert [row.status_code for row in ledger] == [200] * 6  # no 429 was recorded: waits are not requests
    # Waits happen inside the request (its latency), so look at when each one was answered.
    answered = sorted(row.created_at for row in ledger)
    assert (answered[-1] - answered[0]).total_seconds() >= 3.5


def test_batch_pace_spaces_a_tenants_requests(gateway, batch_worker, make_tenant, make_key, make_model):
    tenant = make_tenant(requests_per_minute=1000, batch_requests_per_minute=150)  # one every 0.4 s
    client = sdk(gateway, make_key(tenant))
    alias, _ = make_model()
    uploaded = client.files.create(file=("paced.jsonl", jsonl(alias, [f"pace {i}" for i in range(6)])), purpose="batch")
    batch = finished(
        client,
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )

    assert batch.request_counts.completed == 6
    ledger = drained_rows([f"{batch.id}:{i}" for i in range(1, 7)])
    answered = sorted(row.created_at.timestamp() for row in ledger)
    gaps = [later - earlier for earlier, later in zip(answered, answered[1:], strict=False)]
    assert min(gaps) >= 0.3  # 0.4 s apart, less the clock's resolution, though 4 could run at once


def test_a_budget_refuses_batch_items_as_it_refuses_requests(gateway, batch_worker, make_tenant, make_key, make_model):
    tenant = make_tenant()
    Budget.objects.create(tenant=tenant, period="daily", limit_usd=Decimal("0.0000001"), hard=True)
    client = sdk(gateway, make_key(tenant))
    alias, _ = make_model()
    uploaded = client.files.create(file=("broke.jsonl", jsonl(alias, ["too dear"])), purpose="batch")
    batch = finished(
        client,
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )

    assert batch.request_counts.model_dump() == {"total": 1, "completed": 0, "failed": 1}
    (error,) = output_lines(client, batch.error_file_id)
    assert (error["response"]["status_code"], error["response"]["body"]["error"]["code"]) == (402, "budget_exceeded")


def test_cancel_stops_new_work_and_closes_with_what_was_done(
    gateway, batch_worker, make_tenant, make_key, make_model, mock_provider
):
    tenant = make_tenant(requests_per_minute=1000, batch_requests_per_minute=120)  # one every 0.5 s
    client = sdk(gateway, make_key(tenant))
    alias, (provider,) = make_model()
    uploaded = client.files.create(file=("long.jsonl", jsonl(alias, [f"long {i}" for i in range(40)])), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(lambda: mock_provider.stats(provider)["completed"] >= 2, 30, "the batch to get going")

    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled")
    assert cancelling.cancelling_at is not None
    batch = finished(client, created.id)
    assert batch.status == "cancelled"
    assert client.batches.cancel(created.id).status == "cancelled"  # again: nothing changes

    done = output_lines(client, batch.output_file_id)
    cancelled = output_lines(client, batch.error_file_id)
    assert 2 <= len(done) < 40
    assert len(done) + len(cancelled) == 40
    assert {row["error"]["code"] for row in cancelled} == {"batch_cancelled"}
    assert batch.request_counts.model_dump() == {"total": 40, "completed": len(done), "failed": 0}
    calls = mock_provider.stats(provider)["calls"]
    time.sleep(1.0)
    assert mock_provider.stats(provider)["calls"] == calls  # nothing runs after it closed


def test_cancel_releases_claimed_items_and_nothing_starts_upstream_after_it(
    gateway, batch_worker, make_tenant, make_key, make_model, mock_provider
):
    """Issue 25, scaled down (30 lines at 30 a minute instead of 12): a worker claims several items
    and waits for each one's turn; before the fix those claimed items still ran after the cancel."""
    tenant = make_tenant(requests_per_minute=1000, batch_requests_per_minute=30, cache_enabled=False)  # one every 2 s
    client = sdk(gateway, make_key(tenant))
    alias, (provider,) = make_model()
    prompts = [f"paced cancel {i}" for i in range(30)]
    uploaded = client.files.create(file=("paced.jsonl", jsonl(alias, prompts)), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    items = BatchItem.objects.filter(batch__public_id=created.id)
    wait_for(lambda: items.filter(status="succeeded").count() >= 3, 60, "three requests to complete")

    client.batches.cancel(created.id)
    # At once: no item is left queued, claimed or not; running are only those already let go upstream.
    assert items.filter(status="queued").count() == 0
    running = items.filter(status="running").count()
    calls = mock_provider.stats(provider)["calls"]
    batch = finished(client, created.id)

    assert batch.status == "cancelled"
    succeeded = items.filter(status="succeeded").count()
    final_calls = mock_provider.stats(provider)["calls"]
    assert final_calls == succeeded  # every upstream call was an item that ran, no other
    assert final_calls <= calls + running  # after the cancel, only requests already started reached it
    assert items.filter(status="cancelled").count() == 30 - succeeded
    assert {row["error"]["code"] for row in output_lines(client, batch.error_file_id)} == {"batch_cancelled"}
    # Each request that reached the provider had started before the cancel (its ledger row's start:
    # the record's time less its latency; 50 ms for the clocks' rounding).
    drain()
    cancelled_at = Batch.objects.get(public_id=created.id).cancelling_at.timestamp() + 0.05
    rows = LedgerEntry.objects.filter(request_id__startswith=f"{created.id}:", status_code=200)
    assert rows.count() == succeeded
    for row in rows:
        assert row.created_at.timestamp() - row.latency_ms / 1000 < cancelled_at, row.request_id


def test_another_tenants_files_and_batches_are_not_found(gateway, batch_worker, tenancy, make_key, make_model):
    alias, _ = make_model()
    mine, theirs = sdk(gateway, make_key(tenancy.tenant)), sdk(gateway, make_key(tenancy.other))
    uploaded = mine.files.create(file=("mine.jsonl", jsonl(alias, ["private"])), purpose="batch")
    batch = mine.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")

    for attempt in (
        lambda: theirs.files.retrieve(uploaded.id),
        lambda: theirs.files.content(uploaded.id),
        lambda: theirs.files.delete(uploaded.id),
        lambda: theirs.batches.retrieve(batch.id),
        lambda: theirs.batches.cancel(batch.id),
        lambda: theirs.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert uploaded.id not in [f.id for f in theirs.files.list()]
    assert batch.id not in [b.id for b in theirs.batches.list()]
    # ...and nothing of theirs changed mine.
    assert BatchFile.objects.get(public_id=uploaded.id).deleted_at is None
    assert Batch.objects.filter(public_id=batch.id).count() == 1
    assert finished(mine, batch.id).status == "completed"


def test_bad_requests_get_precise_errors_and_change_nothing(gateway, batch_worker, tenant, api_key, model):
    alias, _ = model
    client = sdk(gateway, api_key)
    headers = {"authorization": f"Bearer {api_key}"}
    files_before, batches_before = BatchFile.objects.count(), Batch.objects.count()

    def error(response: httpx.Response) -> tuple[int, str, str | None]:
        body = response.json()["error"]
        return response.status_code, body["code"], body["param"]

    url = gateway.base_url
    assert error(
        httpx.post(f"{url}/files", headers=headers, files={"file": ("a.jsonl", b"{}")}, data={"purpose": "fine-tune"})
    ) == (400, "invalid_value", "purpose")
    assert error(httpx.post(f"{url}/files", headers=headers, files={"purpose": (None, "batch")})) == (
        400,
        "missing_required_parameter",
        "file",
    )
    assert error(httpx.post(f"{url}/files", headers=headers, json={"purpose": "batch"})) == (400, "invalid_value", None)
    assert error(
        httpx.post(
            f"{url}/batches",
            headers=headers,
            json={"input_file_id": "file-x", "endpoint": "/v1/embeddings", "completion_window": "24h"},
        )
    ) == (400, "invalid_value", "endpoint")
    assert error(
        httpx.post(
            f"{url}/batches",
            headers=headers,
            json={"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        )
    ) == (404, "file_not_found", "input_file_id")
    assert error(httpx.get(f"{url}/batches", headers=headers, params={"limit": 0})) == (400, "invalid_value", "limit")
    assert error(httpx.get(f"{url}/batches/batch_nope", headers=headers)) == (404, "batch_not_found", None)
    # NUL characters, which PostgreSQL cannot take, are refused with the URL, never a 500.
    for path, params in (("batches", {"after": "\x00x"}), ("files", {"purpose": "\x00"})):
        assert error(httpx.get(f"{url}/{path}", headers=headers, params=params)) == (400, "invalid_url", None)
    assert error(httpx.get(f"{url}/files", headers=headers, params={"limit": "²"})) == (400, "invalid_value", "limit")
    nul_metadata = {
        "input_file_id": "file-x",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"k": "\x00"},
    }
    assert error(httpx.post(f"{url}/batches", headers=headers, json=nul_metadata)) == (
        400,
        "invalid_value",
        "metadata.k",
    )
    assert error(httpx.get(f"{url}/files", headers={"authorization": "Bearer sk-sen-wrong"})) == (
        401,
        "invalid_api_key",
        None,
    )
    assert httpx.put(f"{url}/batches", headers=headers).status_code == 405
    assert (BatchFile.objects.count(), Batch.objects.count()) == (files_before, batches_before)

    uploaded = client.files.create(file=("ok.jsonl", jsonl(alias, ["done soon"])), purpose="batch")
    batch = finished(
        client,
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )
    with pytest.raises(openai.ConflictError) as refused:
        client.batches.cancel(batch.id)
    assert refused.value.code == "batch_not_cancellable"
    assert client.batches.retrieve(batch.id).status == "completed"

    assert client.files.delete(uploaded.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    assert client.batches.retrieve(batch.id).input_file_id == uploaded.id  # the batch still names it


def test_batch_items_wait_for_a_saturated_deployment_instead_of_being_shed(
    gateway, batch_worker, make_tenant, make_key, make_model, mock_provider
):
    tenant = make_tenant()
    client = sdk(gateway, make_key(tenant))
    alias, (provider,) = make_model()
    Deployment.objects.filter(name=provider).update(max_concurrent=1)
    mock_provider.control(provider, slow_ms=300)
    uploaded = client.files.create(
        file=("queue.jsonl", jsonl(alias, [f"queued {i}" for i in range(5)])), purpose="batch"
    )
    batch = finished(
        client,
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )

    assert batch.request_counts.model_dump() == {"total": 5, "completed": 5, "failed": 0}
    stats = mock_provider.stats(provider)
    assert (stats["calls"], stats["max_in_flight"]) == (5, 1)  # one at a time, as the limit says
    ledger = drained_rows([f"{batch.id}:{i}" for i in range(1, 6)])
    assert [row.status_code for row in ledger] == [200] * 5  # waiting was not a shed request


def test_upload_size_has_its_own_bound(gateway, api_key, test_database_name):
    """Files are bounded by SENTINEL_BATCH_MAX_FILE_BYTES, not by the API's request body limit."""
    big = b'{"custom_id": "x"}\n' * (5 * 1024 * 1024 // 19)  # over the 4 MiB body limit of other requests
    assert sdk(gateway, api_key).files.create(file=("big.jsonl", big), purpose="batch").bytes == len(big)

    small = start_gateway(test_database_name, env={"SENTINEL_BATCH_MAX_FILE_BYTES": "1000"})
    try:
        client = sdk(small, api_key)
        files_before = BatchFile.objects.count()
        with pytest.raises(openai.APIStatusError) as over:
            client.files.create(file=("over.jsonl", b"x" * 1010), purpose="batch")
        assert (over.value.status_code, over.value.code) == (413, "file_too_large")
        with pytest.raises(openai.APIStatusError) as far_over:
            client.files.create(file=("far.jsonl", b"x" * 200_000), purpose="batch")
        assert (far_over.value.status_code, far_over.value.code) == (413, "request_too_large")  # not even read
        assert BatchFile.objects.count() == files_before
        assert client.files.create(file=("fits.jsonl", b"x" * 1000), purpose="batch").bytes == 1000
    finally:
        small.stop()


def test_a_line_with_a_parameter_outside_the_allowlist_fails_the_batch_naming_it(
    gateway, batch_worker, tenant, api_key, model
):
    alias, _ = model
    good = orjson.loads(jsonl(alias, ["fine"]).splitlines()[0])
    redirected = {**good, "custom_id": "second", "body": {**good["body"], "api_base": "http://127.0.0.1:9/x"}}
    client = sdk(gateway, api_key)
    content = orjson.dumps(good) + b"\n" + orjson.dumps(redirected)
    uploaded = client.files.create(file=("params.jsonl", content), purpose="batch")
    create = {"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    with pytest.raises(openai.BadRequestError) as refused:  # the batch endpoint has its allowlist too
        client.batches.create(**create, extra_body={"api_base": "http://127.0.0.1:9/x"})
    assert (refused.value.code, refused.value.param) == ("unknown_parameter", "api_base")
    batch = finished(client, client.batches.create(**create).id)

    assert batch.status == "failed"
    assert [(e.line, e.code, e.param, e.message) for e in batch.errors.data] == [
        (2, "unknown_parameter", "body.api_base", "Unrecognized request argument supplied: api_base")
    ]
    assert not BatchItem.objects.filter(batch__public_id=batch.id).exists()  # nothing ran


def test_an_item_stored_with_such_a_parameter_is_refused_when_it_runs(
    gateway, batch_worker, make_tenant, make_key, make_model
):
    """An item accepted before the allowlist (stored by an older version) goes through the request
    path, which refuses it: a per-item 400, the rest of the batch runs, and the batch closes."""
    from gateway.batches.tasks import run_batch
    from tenants.models import VirtualKey
    from tests.gateway.upstream.test_providers import Listener, translated_model

    tenant = make_tenant()
    client = sdk(gateway, make_key(tenant))
    key = VirtualKey.objects.get(tenant=tenant)
    alias, _ = make_model()
    translated, _ = translated_model("ollama/llama3", "ollama")
    redirect = Listener()
    try:
        batch = stored_batch(tenant, key, filename="old.jsonl")
        ask = [{"role": "user", "content": "stored"}]
        BatchItem.objects.bulk_create(
            [
                BatchItem(batch=batch, line=1, custom_id="fine", body={"model": alias, "messages": ask}),
                BatchItem(
                    batch=batch,
                    line=2,
                    custom_id="redirected",
                    body={"model": translated, "messages": ask, "api_base": f"{redirect.url}/x"},
                ),
            ]
        )
        run_batch.delay(batch.pk)
        result = finished(client, batch.public_id)
    finally:
        redirect.close()

    assert result.status == "completed"
    assert result.request_counts.model_dump() == {"total": 2, "completed": 1, "failed": 1}
    assert [row["custom_id"] for row in output_lines(client, result.output_file_id)] == ["fine"]
    (error,) = output_lines(client, result.error_file_id)
    assert (error["custom_id"], error["response"]["status_code"]) == ("redirected", 400)
    assert error["response"]["body"]["error"]["code"] == "unknown_parameter"
    assert redirect.requests == []


def test_file_content_is_served_as_a_download_the_browser_may_not_sniff(gateway, api_key):
    """A tenant's bytes that look like a page (uploads are not checked until a batch reads them) come
    back as an attachment, typed octet-stream, with nosniff: a browser saves them, never renders them."""
    page = b"<html><script>alert(document.cookie)</script></html>\n"
    uploaded = sdk(gateway, api_key).files.create(file=("report <1>.html", page), purpose="batch")

    response = httpx.get(
        f"{gateway.base_url}/files/{uploaded.id}/content", headers={"authorization": f"Bearer {api_key}"}, timeout=30
    )
    assert response.status_code == 200
    assert response.content == page
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-disposition"] == 'attachment; filename="report <1>.html"'
    assert response.headers.get_list("x-content-type-options") == ["nosniff"]
    assert sdk(gateway, api_key).files.content(uploaded.id).content == page  # the SDK reads it as before


priced_model = test_token_pricing.priced_model


def test_batch_items_are_billed_at_the_batch_rates(gateway, batch_worker, make_tenant, make_key, priced_model):
    """The Batch API's half price where litellm's map has one, for each kind of token: o4-mini's
    batch input and output rates (its cached tokens at the cached rate: the map has no batch one;
    reasoning at the batch output rate), Claude Haiku 4.5's batch rates for cache reads and writes."""
    cases = test_token_pricing.CASES
    client = sdk(gateway, make_key(make_tenant()))
    prompt_text = test_token_pricing.MESSAGES[0]["content"]
    lines = [
        {**orjson.loads(jsonl(priced_model(cases[name]), [prompt_text])), "custom_id": name}
        for name in ("openai-cached-and-reasoning", "anthropic-cache-read-and-write")
    ]
    content = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    uploaded = client.files.create(file=("input.jsonl", content), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = finished(client, created.id)
    assert batch.request_counts.model_dump() == {"total": 2, "completed": 2, "failed": 0}

    o4, haiku = drained_rows([f"{batch.id}:1", f"{batch.id}:2"])
    prompt, answer = test_token_pricing.PROMPT, test_token_pricing.ANSWER
    assert (o4.batch, o4.cache_read_tokens, o4.reasoning_tokens) == (True, 6, 12)
    assert o4.cost_usd == (
        (prompt - 6) * Decimal("0.00000055") + 6 * Decimal("0.000000275") + (answer + 12) * Decimal("0.0000022")
    )
    assert o4.reasoning_cost_usd == 12 * Decimal("0.0000022")
    assert (haiku.batch, haiku.cache_read_tokens, haiku.cache_write_tokens) == (True, 5, 7)
    assert haiku.cost_usd == (
        (prompt - 12) * Decimal("0.0000005")
        + 5 * Decimal("0.00000005")
        + 7 * Decimal("0.000000625")
        + answer * Decimal("0.0000025")
    )
    assert (haiku.cache_read_cost_usd, haiku.cache_write_cost_usd) == (
        5 * Decimal("0.00000005"),
        7 * Decimal("0.000000625"),
    )
