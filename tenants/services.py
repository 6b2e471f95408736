"""Writes to tenants, members and keys. Each one also tells the gateway processes what changed, and
leaves its entry in the audit log (tenants.audit)."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.utils import timezone

from sentinel.localstate import announce_change, blocked_key_marker, blocked_tenant_marker
from sentinel.redis_clients import sync_redis
from tenants.audit import audit_record, describe
from tenants.models import AuditEntry, Budget, EndUserLimit, Membership, Team, TeamMembership, Tenant, VirtualKey
from tenants.roles import ROLE_GROUPS, TEAM_ROLE_GROUPS, role_group_names

KEY_PREFIX = "sk-sen-"
VISIBLE_CHARS = 12
# Markers outlive every cache of key settings (process and Redis), so a revoked key cannot come back.
BLOCK_MARKER_SECONDS = 24 * 3600


def key_digest(secret: str) -> str:
    """Secrets carry 256 random bits, so a plain SHA-256 is as safe to store as a slow hash."""
    return hashlib.sha256(secret.encode()).hexdigest()


def key_create(
    *,
    tenant: Tenant,
    name: str,
    created_by=None,
    expires_at: datetime | None = None,
    allowed_models: list[str] | None = None,
    team: Team | None = None,
    **limits,
) -> tuple[VirtualKey, str]:
    """Issue a key, in `team` if given (one of the tenant's); the secret is returned here and nowhere
    else, ever. `limits` are VirtualKey's limit fields (tier, requests_per_minute, tokens_per_minute,
    max_concurrent)."""
    if team is not None and team.tenant_id != tenant.pk:
        raise ValueError("A key's team must be one of its tenant's teams.")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = VirtualKey.objects.create(
        tenant=tenant,
        team=team,
        name=name,
        prefix=secret[:VISIBLE_CHARS],
        digest=key_digest(secret),
        expires_at=expires_at,
        allowed_models=list(allowed_models or []),
        created_by=created_by,
        **limits,
    )
    audit_record(
        action=AuditEntry.Action.KEY_ISSUED,
        tenant=tenant,
        target=describe(key),
        changes={
            name: [None, value]
            for name, value in {
                "team": team.name if team else None,
                "allowed_models": key.allowed_models,
                "expires_at": expires_at,
                **limits,
            }.items()
            if value not in (None, [])
        },
        actor=created_by,
    )
    return key, secret


class KeyNotRotatable(ValueError):
    pass


@transaction.atomic
def key_rotate(*, key: VirtualKey, created_by=None, grace_seconds: float | None = None) -> tuple[VirtualKey, str]:
    """Replace a key by a new one with the same settings (name, allowlist, limits, expiry); its
    budgets move to the new key. The old key keeps working for `grace_seconds`
    (SENTINEL_KEY_ROTATION_GRACE_SECONDS by default) so apps can switch, then expires. Returns the
    new key and its secret, which exists here and nowhere else."""
    key = VirtualKey.objects.select_for_update().get(pk=key.pk)
    if key.status != VirtualKey.Status.ACTIVE:
        raise KeyNotRotatable("A revoked key cannot be rotated.")
    if key.successor_id is not None:
        raise KeyNotRotatable("This key was rotated already: rotate its successor instead.")
    grace = settings.KEY_ROTATION_GRACE_SECONDS if grace_seconds is None else grace_seconds
    new_key, secret = key_create(
        tenant=key.tenant,
        name=key.name,
        created_by=created_by,
        expires_at=key.expires_at,
        allowed_models=key.allowed_models,
        team=key.team,
        tier=key.tier,
        requests_per_minute=key.requests_per_minute,
        tokens_per_minute=key.tokens_per_minute,
        max_concurrent=key.max_concurrent,
    )
    # Budget and end-user limit ids name their counters in Redis, so moved ones keep their period's
    # spend; the old key stays bound by them through its successor (gateway.auth) until it expires.
    Budget.objects.filter(key=key).update(key=new_key)
    EndUserLimit.objects.filter(key=key).update(key=new_key)
    grace_end = timezone.now() + timedelta(seconds=grace)
    if key.expires_at is None or key.expires_at > grace_end:
        key.expires_at = grace_end
    key.successor = new_key
    key.save(update_fields=["expires_at", "successor"])
    audit_record(
        action=AuditEntry.Action.KEY_ROTATED,
        tenant=key.tenant_id,
        target=describe(key),
        detail=f"Replaced by key {new_key.pk} ({new_key.prefix}…); works until {key.expires_at:%Y-%m-%d %H:%M} UTC.",
        actor=created_by,
    )
    announce_change()
    return new_key, secret


def key_mark_used(*, last_used: dict[int, datetime]) -> None:
    """Move keys' last_used_at forward (ledger batches arrive out of order: never backward). Called by
    the ledger drain, off the request path; a key another transaction holds is skipped this time
    rather than waited for (its next batch catches up)."""
    if not last_used:
        return
    ids = sorted(last_used)
    table = VirtualKey._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS k SET last_used_at = v.at "  # noqa: S608
            "FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(id, at) "
            f"WHERE k.id = v.id AND (k.last_used_at IS NULL OR k.last_used_at < v.at) "
            f"AND k.id IN (SELECT id FROM {table} WHERE id = ANY(%s) FOR NO KEY UPDATE SKIP LOCKED)",
            [ids, [last_used[i] for i in ids], ids],
        )


@transaction.atomic
def key_revoke(*, key: VirtualKey) -> None:
    updated = VirtualKey.objects.filter(pk=key.pk, status=VirtualKey.Status.ACTIVE).update(
        status=VirtualKey.Status.REVOKED, revoked_at=timezone.now()
    )
    if updated:
        key.refresh_from_db()
        audit_record(
            action=AuditEntry.Action.KEY_REVOKED,
            tenant=key.tenant_id,
            target=describe(key),
            changes={"status": [VirtualKey.Status.ACTIVE, VirtualKey.Status.REVOKED]},
        )
        transaction.on_commit(
            lambda: sync_redis().set(blocked_key_marker(key.digest, key.tenant_id), 1, ex=BLOCK_MARKER_SECONDS)
        )
        announce_change()


@transaction.atomic
def tenant_set_status(*, tenant: Tenant, status: str) -> None:
    before = Tenant.objects.filter(pk=tenant.pk).values_list("status", flat=True).first()
    Tenant.objects.filter(pk=tenant.pk).update(status=status)
    if before != status:
        audit_record(
            action=AuditEntry.Action.TENANT_STATUS,
            tenant=tenant,
            target=describe(tenant),
            changes={"status": [before, status]},
        )
    tenant.status = status
    marker = blocked_tenant_marker(tenant.pk)
    if status == Tenant.Status.SUSPENDED:
        transaction.on_commit(lambda: sync_redis().set(marker, 1, ex=BLOCK_MARKER_SECONDS))
    else:
        transaction.on_commit(lambda: sync_redis().delete(marker))
    announce_change()


def tenant_tighten_semantic(*, tenant: Tenant, reason: str, figures: dict) -> bool:
    """The tenant's semantic tier switches itself off (exact hits only) because its measured false-hit
    rate is above the tenant's target (gateway/cache/shadow.py): recorded on the tenant, told to the
    webhooks (`cache.semantic_tightened`) and to every gateway process. The conditional update makes
    it happen once, whichever process judged first; False when it had already happened. The
    measurement (`shadow_since`) stays, so the console keeps showing the figures that decided; an
    admin who turns the tier on again starts a new one (tenants.admin)."""
    from tenants.webhooks import webhook_publish

    now = timezone.now()
    with transaction.atomic():
        switched = Tenant.objects.filter(pk=tenant.pk, semantic_cache_enabled=True).update(
            semantic_cache_enabled=False,
            semantic_tightened_at=now,
            semantic_tightened_reason=reason[:300],
        )
        if switched != 1:  # another process got there first, or an admin switched it off
            return False
        announce_change()  # first thing after the commit, before the webhooks are queued
        webhook_publish(
            event="cache.semantic_tightened",
            tenant_id=tenant.pk,
            payload={"tenant": tenant.slug, "action": "exact_only", "reason": reason, "at": now.isoformat(), **figures},
        )
    return True


# --- members -------------------------------------------------------------------------------------


@transaction.atomic
def membership_save(*, tenant: Tenant, user, role: str) -> Membership:
    """Make `user` a member of `tenant` with `role` (or change the role). Members use the console, so
    they become staff, with their roles' permission groups; what rows they reach is scoped by tenant."""
    before = Membership.objects.filter(tenant=tenant, user=user).values_list("role", flat=True).first()
    membership, _ = Membership.objects.update_or_create(tenant=tenant, user=user, defaults={"role": role})
    user_access_sync(user=user)
    if before != role:
        audit_record(
            action=AuditEntry.Action.MEMBER_ADDED if before is None else AuditEntry.Action.MEMBER_ROLE,
            tenant=tenant,
            target=f"member {user.get_username()}",
            changes={"role": [before, role]},
        )
    return membership


@transaction.atomic
def membership_delete(*, membership: Membership) -> None:
    user = membership.user
    membership.delete()
    user_access_sync(user=user)
    audit_record(
        action=AuditEntry.Action.MEMBER_REMOVED,
        tenant=membership.tenant_id,
        target=f"member {user.get_username()}",
        changes={"role": [membership.role, None]},
    )


@transaction.atomic
def team_membership_save(*, team: Team, user, role: str) -> TeamMembership:
    """Make `user` a member of `team` with `role` (team admin or viewer), or change the role: staff,
    with the team role's permission group; the rows they reach are their team's (console.scoping)."""
    before = TeamMembership.objects.filter(team=team, user=user).values_list("role", flat=True).first()
    membership, _ = TeamMembership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    user_access_sync(user=user)
    if before != role:
        audit_record(
            action=AuditEntry.Action.MEMBER_ADDED if before is None else AuditEntry.Action.MEMBER_ROLE,
            tenant=team.tenant_id,
            target=f"member {user.get_username()} of team {team.name}",
            changes={"team_role": [before, role]},
        )
    return membership


@transaction.atomic
def team_membership_delete(*, membership: TeamMembership) -> None:
    user, team = membership.user, membership.team
    membership.delete()
    user_access_sync(user=user)
    audit_record(
        action=AuditEntry.Action.MEMBER_REMOVED,
        tenant=team.tenant_id,
        target=f"member {user.get_username()} of team {team.name}",
        changes={"team_role": [membership.role, None]},
    )


def user_access_sync(*, user) -> None:
    """The user's role groups follow the roles they hold in any tenant. Staff status is given with a
    first membership and left alone afterwards: without groups it opens nothing."""
    wanted = role_group_names(
        set(Membership.objects.filter(user=user).values_list("role", flat=True)),
        set(TeamMembership.objects.filter(user=user).values_list("role", flat=True)),
    )
    groups = Group.objects.filter(name__in=[*ROLE_GROUPS.values(), *TEAM_ROLE_GROUPS.values()])
    user.groups.remove(*[group for group in groups if group.name not in wanted])
    user.groups.add(*[group for group in groups if group.name in wanted])
    if wanted and not user.is_staff:
        type(user).objects.filter(pk=user.pk).update(is_staff=True)
        user.is_staff = True
