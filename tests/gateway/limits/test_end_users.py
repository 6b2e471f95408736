"""End users and sessions (#21 point 2): a key's end-user limits hold each end user (OpenAI's `user`)
and each session (x-sentinel-session, metadata.session_id) to a token cap and a budget, refused with
a 429 / 402 naming the limit and its reset; hostile ids are refused or kept out of Redis key names;
the ledger and the spend report carry the end user. The concurrency proof, four processes and new
end users arriving at once, is tests/gateway/limits/test_admission.py's
test_new_end_users_cannot_pass_their_budget_by_arriving_at_once."""

from __future__ import annotations

import csv
import io
import time
from datetime import UTC, datetime
from decimal import Decimal

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from billing.exports import report_csv
from billing.ledger import drain
from billing.models import LedgerEntry
from billing.selectors import spend_report
from sentinel import redis_keys
from sentinel.redis_clients import sync_redis
from tenants.models import EndUserLimit, VirtualKey
from tenants.periods import period_bounds
from tenants.services import key_rotate
from tests.gateway.limits.test_admission import ask, redis_number, structured

SESSION = "x-sentinel-session"


@pytest.fixture
def capped(tenant, make_key, make_model, live_db):
    """A key whose sessions may each use 1,000 tokens a day (the tenant's cache off: a hit is free)."""
    tenant.cache_enabled = False
    tenant.save(update_fields=["cache_enabled"])
    model, (provider,) = make_model()
    key = make_key(tenant)
    row = VirtualKey.objects.get(tenant=tenant)
    limit = EndUserLimit.objects.create(key=row, scope="session", period="daily", token_cap=1000)
    return model, provider, key, limit


def test_a_sessions_token_cap_refuses_with_429_naming_it_and_its_reset(gateway, mock_provider, capped):
    model, provider, key, limit = capped
    client = OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    used = 0
    for i in range(3):  # each holds about 310 while it runs, and uses what the mock answers (~50)
        answer = client.chat.completions.create(**ask(model, i, max_tokens=300), extra_headers={SESSION: "checkout-1"})
        used += answer.usage.total_tokens
    # 900 more could be used: past the 1,000 with what is used already.
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(**ask(model, 3, max_tokens=900), extra_headers={SESSION: "checkout-1"})
    calls = mock_provider.stats(provider)["calls"]
    assert calls == 3

    start, end = period_bounds("daily", datetime.now(UTC))
    error, headers = refused.value.body, refused.value.response.headers
    assert (error["code"], headers["x-sentinel-limit"]) == ("rate_limit_exceeded", "session-daily-tokens")
    assert (
        f"each session of this key may use 1000 tokens daily (session-daily-tokens); {used} are used"
        in (error["message"])
    )
    assert headers["x-sentinel-limit-reset"] == f"{end:%Y-%m-%dT%H:%M:%SZ}"
    policy = structured(headers["ratelimit-policy"])["session-daily-tokens"]
    assert policy == {"q": "1000", "w": "86400", "qu": '"tokens"'}
    state = structured(headers["ratelimit"])["session-daily-tokens"]
    assert state["r"] == str(1000 - used)
    assert state["t"] == headers["retry-after"] and 1 <= int(state["t"]) <= 86400

    # The refusal took nothing; another session and a request naming none are not held by it.
    counter = redis_keys.audience_period(limit.pk, "checkout-1", "daily", start, "tok", tenant_id=limit.key.tenant_id)
    assert (redis_number(counter + ":spent"), redis_number(counter + ":res:sum")) == (used, 0)
    for headers in ({SESSION: "checkout-2"}, {}):
        client.chat.completions.create(**ask(model, 9, max_tokens=900), extra_headers=headers)
    assert mock_provider.stats(provider)["calls"] == calls + 2
    assert (redis_number(counter + ":spent"), redis_number(counter + ":res:sum")) == (used, 0)


HOSTILE = [
    ({"user": "u" * 257}, {}, "user", "string_above_max_length"),
    ({"user": "alice\nbob"}, {}, "user", "invalid_value"),
    ({"user": 7}, {}, "user", "invalid_type"),
    ({}, {SESSION: "s" * 257}, SESSION, "string_above_max_length"),
    ({"metadata": {"session_id": "s" * 300}}, {}, "metadata.session_id", "string_above_max_length"),
    ({"metadata": {"session_id": "a\x1bb"}}, {}, "metadata.session_id", "invalid_value"),
]


@pytest.mark.parametrize(("extra", "headers", "param", "code"), HOSTILE)
def test_a_hostile_end_user_or_session_is_a_400_naming_the_field(
    gateway, mock_provider, capped, extra, headers, param, code
):
    model, provider, key, limit = capped
    calls = mock_provider.stats(provider)["calls"]
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {key}", **headers},
        json=ask(model, 0, **extra),
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert mock_provider.stats(provider)["calls"] == calls
    assert list(sync_redis().scan_iter(f"{redis_keys.tenant_tag(limit.key.tenant_id)}:aud:{limit.pk}:*")) == []


def test_an_id_made_to_look_like_a_key_name_only_ever_reaches_redis_as_a_digest(gateway, capped):
    model, _, key, limit = capped
    hostile = "x}:{sentinel}:aud:*:? \\ 'quoted' [a-z]"
    client = OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    client.chat.completions.create(**ask(model, 0, max_tokens=5), extra_headers={SESSION: hostile})
    start, _ = period_bounds("daily", datetime.now(UTC))
    counter = redis_keys.audience_period(limit.pk, hostile, "daily", start, "tok", tenant_id=limit.key.tenant_id)
    names = {
        name.decode()
        for name in sync_redis().scan_iter(f"{redis_keys.tenant_tag(limit.key.tenant_id)}:aud:{limit.pk}:*")
    }
    assert names == {counter + ":spent", counter + ":res:sum"}  # the emptied reservations log is gone
    assert all(name.count("{") == 1 and "quoted" not in name for name in names)


def test_the_ledger_and_the_spend_report_carry_the_end_user(gateway, capped):
    model, _, key, limit = capped
    client = OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    for user, session in (("alice", "a-1"), ("alice", ""), ("bob", "b-1")):
        client.chat.completions.create(
            **ask(model, 0, max_tokens=5), user=user, extra_headers={SESSION: session} if session else {}
        )
    client.chat.completions.create(**ask(model, 1, max_tokens=5), metadata={"session_id": "m-1"})
    # Anthropic's Messages API names its end user in metadata.user_id.
    anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0).messages.create(
        model=model,
        max_tokens=5,
        messages=[{"role": "user", "content": "request 2"}],
        metadata={"user_id": "carol"},
        extra_headers={SESSION: "c-1"},
    )
    time.sleep(0.5)
    drain()
    rows = list(LedgerEntry.objects.filter(key_id=limit.key_id).order_by("created_at"))
    assert [(r.end_user, r.session_id) for r in rows] == [
        ("alice", "a-1"),
        ("alice", ""),
        ("bob", "b-1"),
        ("", "m-1"),
        ("carol", "c-1"),
    ]

    today = datetime.now(UTC).date()
    report = spend_report(tenants=[rows[0].tenant], start=today, end=today, group_by=["end_user"])
    by_user = {r.end_user: (r.metrics["requests"], r.metrics["cost_usd"]) for r in report.rows}
    users = ("", "alice", "bob", "carol")
    cost = {user: sum((r.cost_usd for r in rows if r.end_user == user), Decimal(0)) for user in users}
    assert all(cost[user] > 0 for user in users)
    assert by_user == {
        "": (1, cost[""]),
        "alice": (2, cost["alice"]),
        "bob": (1, cost["bob"]),
        "carol": (1, cost["carol"]),
    }
    exported = list(csv.DictReader(io.StringIO(report_csv(report).decode())))
    assert [(line["end_user"], line["requests"]) for line in exported] == [
        ("", "1"),
        ("alice", "2"),
        ("bob", "1"),
        ("carol", "1"),
        ("TOTAL", "5"),
    ]


def test_a_counter_redis_lost_starts_again_from_the_ledger_across_a_rotation(gateway, capped):
    """The key is rotated (its limits move to the successor, with their counters) and Redis loses
    the session's counter: the next request is held to what the ledger says the session used under
    the old key."""
    model, _, key, limit = capped
    old = OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    used = sum(
        old.chat.completions.create(**ask(model, i, max_tokens=300), extra_headers={SESSION: "s"}).usage.total_tokens
        for i in range(2)
    )
    time.sleep(0.5)
    drain()
    successor, secret = key_rotate(key=VirtualKey.objects.get(pk=limit.key_id))
    assert EndUserLimit.objects.get(pk=limit.pk).key_id == successor.pk
    start, _ = period_bounds("daily", datetime.now(UTC))
    counter = redis_keys.audience_period(limit.pk, "s", "daily", start, "tok", tenant_id=limit.key.tenant_id)
    sync_redis().delete(counter + ":spent", counter + ":res", counter + ":res:sum")

    new = OpenAI(base_url=gateway.base_url, api_key=secret, max_retries=0)
    with pytest.raises(openai.RateLimitError) as refused:
        new.chat.completions.create(**ask(model, 3, max_tokens=1000 - used), extra_headers={SESSION: "s"})
    state = structured(refused.value.response.headers["ratelimit"])["session-daily-tokens"]
    assert state["r"] == str(1000 - used)
    assert redis_number(counter + ":spent") == used
