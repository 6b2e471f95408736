"""Teams inside a tenant (#21 point 1): a team narrows its tenant, never widens it. Its allowlist,
limits and budgets are refused with a clear error past the tenant's; a key or budget names a team of
its own tenant only."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from tenants.models import Budget, RateLimitTier, Team, VirtualKey
from tenants.services import key_create


def errors_of(obj) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as refused:
        obj.full_clean()
    return refused.value.message_dict


def test_a_teams_allowlist_is_within_the_tenants(make_tenant):
    tenant = make_tenant(allowed_models=["fast", "smart"])
    errors = errors_of(Team(tenant=tenant, name="search", allowed_models=["fast", "gpt-5", "o9"]))
    assert errors == {"allowed_models": ["Not on the tenant's allowlist: gpt-5, o9. The tenant allows fast, smart."]}
    Team(tenant=tenant, name="search", allowed_models=["fast"]).full_clean()
    Team(tenant=tenant, name="search", allowed_models=[]).full_clean()  # empty: the tenant's list
    # A tenant with no list: a team may name any model.
    Team(tenant=make_tenant(), name="search", allowed_models=["gpt-5"]).full_clean()


def test_a_teams_limits_are_at_most_the_tenants(make_tenant):
    tier = RateLimitTier.objects.create(name="tier-team-test", max_concurrent=8)
    tenant = make_tenant(requests_per_minute=100, tokens_per_minute=10_000, tier=tier)
    errors = errors_of(Team(tenant=tenant, name="a", requests_per_minute=101, tokens_per_minute=10_001))
    assert errors == {
        "requests_per_minute": ["At most the tenant's requests per minute (100)."],
        "tokens_per_minute": ["At most the tenant's tokens per minute (10000)."],
    }
    # A tier that gives more than the tenant's own is named on the tier field.
    big = RateLimitTier.objects.create(name="tier-team-big", max_concurrent=9)
    assert errors_of(Team(tenant=tenant, name="a", tier=big)) == {
        "tier": ["At most the tenant's concurrent requests (8)."]
    }
    Team(tenant=tenant, name="a", requests_per_minute=100, tokens_per_minute=10_000, max_concurrent=8).full_clean()
    # Where the tenant has no limit, the team may set any.
    Team(tenant=make_tenant(), name="a", requests_per_minute=10**6).full_clean()


def test_team_names_are_unique_within_a_tenant_only(make_tenant):
    a, b = make_tenant(), make_tenant()
    Team.objects.create(tenant=a, name="search")
    Team.objects.create(tenant=b, name="search")
    assert "__all__" in errors_of(Team(tenant=a, name="search"))
    assert Team.objects.filter(name="search", tenant__in=[a, b]).count() == 2


def test_a_team_budget_is_at_most_the_tenants_of_its_period(make_tenant):
    tenant = make_tenant()
    team = Team.objects.create(tenant=tenant, name="search")
    Budget.objects.create(tenant=tenant, period="monthly", limit_usd=Decimal("100"))
    over = Budget(tenant=tenant, team=team, period="monthly", limit_usd=Decimal("100.0001"))
    assert errors_of(over) == {"limit_usd": ["At most the tenant's monthly budget ($100.0000)."]}
    Budget(tenant=tenant, team=team, period="monthly", limit_usd=Decimal("100")).full_clean()
    # No daily budget on the tenant: a team's daily budget has no ceiling.
    Budget(tenant=tenant, team=team, period="daily", limit_usd=Decimal("1000")).full_clean()


def test_a_budget_or_key_names_a_team_of_its_own_tenant(make_tenant):
    tenant, other = make_tenant(), make_tenant()
    foreign = Team.objects.create(tenant=other, name="theirs")
    assert errors_of(Budget(tenant=tenant, team=foreign, period="daily", limit_usd=Decimal("1"))) == {
        "team": ["A team of the budget's own tenant."]
    }
    with pytest.raises(ValueError, match="one of its tenant's teams"):
        key_create(tenant=tenant, name="k", team=foreign)
    assert not VirtualKey.objects.filter(tenant=tenant).exists()  # nothing was issued
    key, _ = key_create(tenant=other, name="k", team=foreign)
    key.tenant = tenant
    assert errors_of(key)["team"] == ["A team of the key's own tenant."]


def test_a_budget_is_a_keys_or_a_teams_not_both(make_tenant):
    tenant = make_tenant()
    team = Team.objects.create(tenant=tenant, name="search")
    key, _ = key_create(tenant=tenant, name="k", team=team)
    both = Budget(tenant=tenant, team=team, key=key, period="daily", limit_usd=Decimal("1"))
    assert errors_of(both) == {"team": ["A budget is a key's or a team's, not both."]}
    with pytest.raises(IntegrityError), transaction.atomic():
        both.save()
    assert not Budget.objects.filter(tenant=tenant).exists()


def test_a_team_with_keys_cannot_be_deleted(make_tenant):
    from django.db.models import ProtectedError

    tenant = make_tenant()
    team = Team.objects.create(tenant=tenant, name="search")
    key, _ = key_create(tenant=tenant, name="k", team=team)
    with pytest.raises(ProtectedError):
        team.delete()
    assert VirtualKey.objects.get(pk=key.pk).team_id == team.pk


def test_a_keys_limits_and_allowlist_are_within_its_teams(make_tenant):
    tenant = make_tenant()
    team = Team.objects.create(tenant=tenant, name="search", requests_per_minute=100, allowed_models=["a"])
    key, _ = key_create(tenant=tenant, name="k", team=team)
    key.requests_per_minute, key.allowed_models = 101, ["a", "b"]
    assert errors_of(key) == {
        "requests_per_minute": ["At most team search's requests per minute (100)."],
        "allowed_models": ["Not on team search's list of models: b. A key narrows it only."],
    }
    key.requests_per_minute, key.allowed_models = 100, ["a"]
    key.full_clean()
    # A key of no team: its tenant's alone bind it (this tenant has none).
    key.team, key.requests_per_minute, key.allowed_models = None, 10**6, ["b"]
    key.full_clean()
