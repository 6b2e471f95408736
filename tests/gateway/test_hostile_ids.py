"""Every id in a /v1 path and every list parameter, as anyone holding a key controls them: NUL, line
breaks, escapes, other scripts' digits, 5,000 digits, 20,000 characters. Each is a 4xx in OpenAI's
error shape, never a 500, and the gateway logs no error."""

from __future__ import annotations

from urllib.parse import quote

import httpx
import orjson
import pytest

HOSTILE = ["a\x00b", "a\r\nb", "\x1b[2J", "\u0661", "9" * 5000, "x" * 20_000, "../../admin", "%00", "file-\u202e"]
PATHS = [
    "/v1/files/{id}",
    "/v1/files/{id}/content",
    "/v1/batches/{id}",
    "/v1/vector_stores/{id}",
    "/v1/vector_stores/{id}/files",
    "/v1/vector_stores/vs_x/files/{id}",
    "/v1/responses/{id}",
    "/v1/responses/{id}/input_items",
]
LISTS = [
    ("/v1/files", ["after", "limit", "order", "purpose"]),
    ("/v1/batches", ["after", "limit"]),
    ("/v1/vector_stores", ["after", "limit", "order"]),
    ("/v1/models", ["after", "limit"]),
]


def _refused_well(response: httpx.Response, what) -> None:
    assert 400 <= response.status_code < 500, (what, response.status_code, response.text[:200])
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["type"], what


def test_an_unexpected_error_on_the_api_is_a_500_in_openais_shape(rf):
    from sentinel.urls import server_error

    answer = server_error(rf.get("/v1/files/file-1"))
    assert (answer.status_code, orjson.loads(answer.content)["error"]["code"]) == (500, "internal_error")
    assert orjson.loads(server_error(rf.get("/api/v1/reports/spend")).content) == {
        "detail": "Server error; it has been logged."
    }
    assert server_error(rf.get("/admin/")).content.startswith(b"\n<!doctype html>")


@pytest.mark.parametrize("value", HOSTILE, ids=lambda value: repr(value[:10]))
def test_a_hostile_id_or_list_parameter_is_a_4xx_in_openais_shape(gateway, api_key, value):
    headers = {"authorization": f"Bearer {api_key}"}
    start = len(gateway.log_lines())
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as client:
        for path in PATHS:
            url = path.format(id=quote(value, safe=""))
            _refused_well(client.get(url), (path, value[:12]))
        for path, params in LISTS:
            for param in params:
                response = client.get(path, params={param: value})
                if response.status_code == 200:  # a list that ignores what it does not know, as OpenAI's
                    assert isinstance(response.json()["data"], list), (path, param)
                else:
                    _refused_well(response, (path, param, value[:12]))
    assert not [line for line in gateway.log_lines()[start:] if '"level":"ERROR"' in line]


def test_an_id_with_a_line_break_after_it_names_nothing_and_never_reaches_the_database(live_db):
    """The id patterns are matched whole: `$` alone lets a trailing line break through
    ("file-abc\\n" matched `^[A-Za-z0-9_\\-]{1,64}$`), and such an id went on to the database."""
    from types import SimpleNamespace

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gateway.batches import selectors
    from gateway.call import request_id_from
    from gateway.errors import GatewayError
    from gateway.knowledge.views import _store_for

    assert request_id_from("req-1") == "req-1"
    assert request_id_from("req-1\n").startswith("req_") and request_id_from("req-1\n") != "req-1\n"
    key = SimpleNamespace(tenant_id=1)
    with CaptureQueriesContext(connection) as queries:
        assert selectors.file_for(tenant_id=1, public_id="file-abc\n") is None
        assert selectors.batch_for(tenant_id=1, public_id="batch_abc\n") is None
        with pytest.raises(GatewayError) as refused:
            _store_for(key, "vs_" + "0" * 24 + "\n")
    assert (len(queries), refused.value.status) == (0, 404)
    with CaptureQueriesContext(connection) as queries:  # the same ids without the line break are looked up
        assert selectors.file_for(tenant_id=1, public_id="file-abc") is None
        assert selectors.batch_for(tenant_id=1, public_id="batch_abc") is None
        with pytest.raises(GatewayError):
            _store_for(key, "vs_" + "0" * 24)
    assert len(queries) == 3
