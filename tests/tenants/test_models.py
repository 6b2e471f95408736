"""Tenant settings that must hold together: batch work paced below the interactive limit."""

import pytest
from django.core.exceptions import ValidationError

from tenants.models import RateLimitTier, Tenant


def test_batch_pace_must_stay_below_the_interactive_limit(live_db):
    tier = RateLimitTier.objects.create(name="tier-batch-test", requests_per_minute=100)
    with pytest.raises(ValidationError) as refused:
        Tenant(name="t", slug="t-batch-pace", tier=tier, batch_requests_per_minute=100).full_clean()
    assert "below the interactive limit (100" in str(refused.value)
    Tenant(name="t", slug="t-batch-pace", tier=tier, batch_requests_per_minute=99).full_clean()


def test_batch_pace_defaults_to_half_the_interactive_limit():
    assert Tenant(requests_per_minute=100).batch_pace() == 50
    assert Tenant(requests_per_minute=1).batch_pace() == 1
    assert Tenant(requests_per_minute=100, batch_requests_per_minute=10).batch_pace() == 10
    assert Tenant().batch_pace() is None  # no limit of its own: no pace of its own
