"""Writes operators make to the traffic: kill switches (forced breakers: gateway.upstream.breakers.breaker_force)."""

from __future__ import annotations

from django.db import transaction

from gateway.models import ControlAction, KillSwitch, ModelAlias
from sentinel.localstate import announce_change


@transaction.atomic
def kill_switch_set(*, tenant, fallback: ModelAlias, active: bool, actor, reason: str) -> KillSwitch:
    """Turn the kill switch of a tenant (or the global one, tenant=None) on or off. Audited."""
    switch, _ = KillSwitch.objects.update_or_create(
        tenant=tenant, defaults={"fallback": fallback, "active": active, "reason": reason, "updated_by": actor}
    )
    ControlAction.objects.create(
        action="kill_switch_on" if active else "kill_switch_off",
        subject=f"tenant {tenant.slug}" if tenant else "all tenants",
        reason=reason,
        actor=actor,
    )
    announce_change()
    return switch
