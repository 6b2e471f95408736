"""Teams on the request path (#21 point 1): a team's allowlist is checked at authentication, its rate
limits and budgets in the same atomic admission step as its tenant's (exact across processes), a
refusal names the team's limit and when it resets, and the ledger records the team."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from decimal import Decimal

import openai
import pytest
from openai import OpenAI

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.limits.admission import to_units
from gateway.models import Deployment
from sentinel import redis_keys
from tenants.models import Budget, Team, VirtualKey
from tenants.periods import period_bounds
from tests.gateway.limits.test_admission import ask, fire, redis_number, structured
from tests.servers import PATIENT_REDIS, start_gateway


@pytest.fixture(scope="module")
def pair(test_database_name, mock_provider):
    """Two gateway processes against the one test Postgres and Valkey, waiting for Redis however slow
    it is (PATIENT_REDIS)."""
    gateways = [start_gateway(test_database_name, env=PATIENT_REDIS) for _ in range(2)]
    yield gateways
    for gateway in gateways:
        gateway.stop()


def priced(make_model) -> tuple[str, str]:
    """A model whose every request costs exactly $0.01 with max_tokens=40 (worst case = actual)."""
    model, (provider,) = make_model()
    Deployment.objects.filter(name=provider).update(input_price_override=0, output_price_override=Decimal("0.00025"))
    return model, provider


def test_a_teams_allowlist_narrows_the_tenants_for_its_keys_only(gateway, make_tenant, make_key, make_model):
    (one, _), (two, _) = make_model(), make_model()
    tenant = make_tenant(allowed_models=[one, two], cache_enabled=False)
    team = Team.objects.create(tenant=tenant, name="search", allowed_models=[one])
    in_team = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant, team=team), max_retries=0)
    no_team = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)

    in_team.chat.completions.create(**ask(one, 0, max_tokens=5))
    with pytest.raises(openai.PermissionDeniedError) as refused:
        in_team.chat.completions.create(**ask(two, 0, max_tokens=5))
    error = refused.value.body
    assert (error["code"], error["type"], error["param"]) == ("model_not_allowed", "permission_error", "model")
    assert error["message"] == f"This key's team 'search' is not allowed to use the model '{two}'."
    # A key of no team is bound by the tenant's list alone, as before teams.
    no_team.chat.completions.create(**ask(two, 0, max_tokens=5))
    time.sleep(0.5)
    drain()
    rows = LedgerEntry.objects.filter(tenant=tenant).values_list("model_requested", "status_code", "team_id")
    assert list(rows) == [(two, 200, None), (two, 403, team.pk), (one, 200, team.pk)]


def test_a_team_rate_limit_spans_its_keys_and_names_itself(gateway, make_tenant, make_key, make_model):
    model, _ = make_model()
    tenant = make_tenant(requests_per_minute=100)
    team = Team.objects.create(tenant=tenant, name="search", requests_per_minute=3)
    first, second = (
        OpenAI(base_url=gateway.base_url, api_key=make_key(tenant, team=team), max_retries=0) for _ in range(2)
    )
    for i, client in enumerate((first, second, first)):
        client.chat.completions.create(**ask(model, i, max_tokens=5))
    with pytest.raises(openai.RateLimitError) as refused:
        second.chat.completions.create(**ask(model, 3, max_tokens=5))
    error, headers = refused.value.body, refused.value.response.headers
    assert error["code"] == "rate_limit_exceeded"
    assert error["message"].startswith("Rate limit reached: team-rpm allows 3 per minute. Retry after ")
    assert structured(headers["ratelimit-policy"])["team-rpm"] == {"q": "3", "w": "60"}
    state = structured(headers["ratelimit"])["team-rpm"]
    assert state["r"] == "0" and 1 <= int(state["t"]) <= 60
    assert 1 <= int(headers["retry-after"]) <= 60

    # The refusal took nothing: the team's log still holds the three admitted requests, and the
    # tenant's the same three; a key of no team is not held by the team's limit.
    team_log = redis_keys.rate_log(f"team:{team.pk}", "rpm", tag=redis_keys.tenant_tag(tenant.pk))
    tenant_log = redis_keys.rate_log(f"tenant:{tenant.pk}", "rpm", tag=redis_keys.tenant_tag(tenant.pk))
    from sentinel.redis_clients import sync_redis

    assert (sync_redis().zcard(team_log), sync_redis().zcard(tenant_log)) == (3, 3)
    OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0).chat.completions.create(
        **ask(model, 4, max_tokens=5)
    )
    assert (sync_redis().zcard(team_log), sync_redis().zcard(tenant_log)) == (3, 4)


def test_a_team_budget_is_exact_under_concurrency_across_processes(
    pair, mock_provider, make_tenant, make_key, make_model
):
    """60 requests at once from two of the team's keys over two processes, each $0.01, against the
    team's $0.20 a day: exactly 20 are admitted; the rest are 402s naming the team's budget and its
    reset, and took nothing. The tenant's bigger budget and a key of another team are untouched."""
    model, provider = priced(make_model)
    tenant = make_tenant(cache_enabled=False)
    team = Team.objects.create(tenant=tenant, name="search")
    other = Team.objects.create(tenant=tenant, name="support")
    Budget.objects.create(tenant=tenant, period="daily", limit_usd=Decimal("5.00"))
    budget = Budget.objects.create(tenant=tenant, team=team, period="daily", limit_usd=Decimal("0.20"))
    keys = [make_key(tenant, team=team, requests_per_minute=1000) for _ in range(2)]
    bodies = [ask(model, i, max_tokens=40) for i in range(30)]
    urls = [g.url for g in pair]

    async def both():
        return [r for batch in await asyncio.gather(*(fire(urls, key, bodies) for key in keys)) for r in batch]

    results = asyncio.run(both())
    statuses = [status for status, _, _ in results]
    assert (statuses.count(200), statuses.count(402)) == (20, 40)
    start, end = period_bounds("daily", datetime.now(UTC))
    resets = f"{end:%Y-%m-%dT%H:%M:%SZ}"
    for status, headers, body in results:
        if status != 402:
            continue
        assert (body["error"]["code"], headers["x-sentinel-limit"]) == ("budget_exceeded", "team-daily-budget")
        assert headers["x-sentinel-limit-reset"] == resets
        assert body["error"]["message"].startswith(
            "This request could exceed the daily budget of $0.2000000000 set on team 'search' for the period "
            f"starting {start.isoformat()}; it resets at {resets}."
        )
    counter = redis_keys.budget_period(budget.pk, start, tenant_id=tenant.pk)
    assert (redis_number(counter + ":spent"), redis_number(counter + ":res:sum")) == (to_units(Decimal("0.20")), 0)
    assert mock_provider.stats(provider)["calls"] == 20  # a refused request reached no provider

    # Another team's key still gets in: the team's budget binds its own keys only.
    outsider = OpenAI(base_url=pair[0].base_url, api_key=make_key(tenant, team=other), max_retries=0)
    outsider.chat.completions.create(**ask(model, 99, max_tokens=40))
    time.sleep(0.5)
    drain()
    rows = LedgerEntry.objects.filter(tenant=tenant, status_code=200)
    assert rows.filter(team=team).count() == 20
    assert sum(row.cost_usd for row in rows.filter(team_id=team.pk)) == Decimal("0.20")
    assert list(rows.exclude(team_id=team.pk).values_list("team_id", flat=True)) == [other.pk]
    assert not LedgerEntry.objects.filter(tenant=tenant).exclude(status_code=200).filter(cost_usd__gt=0).exists()


def test_a_team_budget_counter_redis_lost_starts_again_from_the_teams_ledger(
    gateway, make_tenant, make_key, make_model
):
    """Redis loses the team budget's counter: the next request is held to what the ledger says the
    team spent (the team's rows, whichever of its keys made them; not the tenant's other rows)."""
    model, _ = priced(make_model)
    tenant = make_tenant(cache_enabled=False)
    team = Team.objects.create(tenant=tenant, name="search")
    budget = Budget.objects.create(tenant=tenant, team=team, period="daily", limit_usd=Decimal("0.03"))
    in_team = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant, team=team), max_retries=0)
    no_team = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
    for i in range(2):
        in_team.chat.completions.create(**ask(model, i, max_tokens=40))
        no_team.chat.completions.create(**ask(model, i, max_tokens=40))
    time.sleep(0.5)
    drain()
    start, _ = period_bounds("daily", datetime.now(UTC))
    counter = redis_keys.budget_period(budget.pk, start, tenant_id=tenant.pk)
    from sentinel.redis_clients import sync_redis

    sync_redis().delete(counter + ":spent", counter + ":res", counter + ":res:sum")
    in_team.chat.completions.create(**ask(model, 2, max_tokens=40))  # $0.02 spent: one more fits
    assert redis_number(counter + ":spent") == to_units(Decimal("0.03"))
    with pytest.raises(openai.APIStatusError) as refused:
        in_team.chat.completions.create(**ask(model, 3, max_tokens=40))
    assert (refused.value.status_code, refused.value.body["code"]) == (402, "budget_exceeded")


def test_a_rotated_key_stays_in_its_team(make_tenant, make_key, live_db):
    from tenants.services import key_rotate

    tenant = make_tenant()
    team = Team.objects.create(tenant=tenant, name="search")
    make_key(tenant, team=team)
    successor, _ = key_rotate(key=VirtualKey.objects.get(tenant=tenant))
    assert successor.team_id == team.pk


def test_a_key_copy_from_before_teams_still_reads():
    """A key's settings cached in Redis by a version without teams (a rolling deploy, or the last-known
    copy served while Postgres is away) read as a key of no team."""
    from gateway.auth import KeyInfo

    old = {
        "key_id": 1,
        "digest": "d",
        "key_name": "k",
        "tenant_id": 2,
        "tenant_slug": "t",
        "key_active": True,
        "tenant_active": True,
        "expires_at": None,
        "allowed_models": None,
        "key_limits": [],
        "tenant_limits": [["rpm", 5]],
        "budgets": [[3, None, "daily", "1.00", 80, True]],
        "end_user_limits": [],
    }
    info = KeyInfo.from_json(old)
    assert (info.team_id, info.team_limits, info.budgets) == (None, (), ((3, None, "daily", "1.00", 80, True, None),))
