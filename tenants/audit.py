"""The audit log's one writer: every service, console page and sign-in that must leave a trace calls
`audit_record`. Who acted and from where come from the request being served (set by the console's
AuditContextMiddleware), so services record without taking a request.

Written by hand rather than with django-auditlog: that library records model saves through signals
(this codebase calls follow-up work explicitly), has no tenant to scope rows by, and records no
sign-ins or exports, which are most of what a security team asks of this log.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db import models

from tenants.models import AuditEntry, Membership, Tenant

# Fields never written to the log, before or after: secrets and what derives from them.
SECRET_FIELDS = frozenset({"digest", "secret", "secret_encrypted", "api_key", "api_key_encrypted", "password"})

# The request being served, for who and where (None: Sentinel itself, a task, a command).
_request: contextvars.ContextVar = contextvars.ContextVar("audit_request", default=None)


@contextmanager
def acting_request(request) -> Iterator[None]:
    token = _request.set(request)
    try:
        yield
    finally:
        _request.reset(token)


def _plain_request(request):
    """Django's request under a DRF one: DRF's `.user` would authenticate again, and a failed
    sign-in is logged from inside authentication."""
    return getattr(request, "_request", request)


def _actor_of(request):
    request = _plain_request(request)
    user = getattr(request, "user", None) if request is not None else None
    return user if user is not None and user.is_authenticated else None


def _address_of(request) -> str | None:
    request = _plain_request(request)
    address = request.META.get("REMOTE_ADDR") if request is not None else None
    return address or None


def plain(value):
    """A field's value as JSON holds it: money as a string (never a float), times in ISO form,
    related rows by their id."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, models.Model):
        return value.pk
    if isinstance(value, list | tuple | set):
        return [plain(item) for item in value]
    if isinstance(value, bytes | memoryview):
        return None
    if value is None or isinstance(value, str | int | float | bool | dict):
        return value
    return str(value)


def snapshot(obj: models.Model) -> dict:
    """The row's concrete field values, secrets left out."""
    return {
        field.attname: plain(getattr(obj, field.attname))
        for field in obj._meta.concrete_fields
        if field.name not in SECRET_FIELDS and field.attname not in SECRET_FIELDS
    }


def changes_between(before: dict, after: dict) -> dict:
    """{field: [before, after]} for every field whose value differs."""
    return {
        name: [before.get(name), after.get(name)]
        for name in sorted(set(before) | set(after))
        if name not in SECRET_FIELDS and before.get(name) != after.get(name)
    }


def describe(obj: models.Model) -> str:
    return f"{obj._meta.verbose_name} {obj.pk} ({obj})"[:300]


def audit_record(
    *,
    action: str,
    tenant: Tenant | int | None = None,
    target: str = "",
    changes: dict | None = None,
    detail: str = "",
    actor=None,
    actor_name: str | None = None,
    request=None,
) -> AuditEntry:
    """Append one entry. The actor and address default to the request being served."""
    entry = _entry(
        action=action,
        tenant=tenant,
        target=target,
        changes=changes,
        detail=detail,
        actor=actor,
        actor_name=actor_name,
        request=request,
    )
    entry.save(force_insert=True)
    return entry


def _entry(
    *,
    action: str,
    tenant: Tenant | int | None,
    target: str,
    changes: dict | None,
    detail: str,
    actor,
    actor_name: str | None,
    request,
) -> AuditEntry:
    request = request if request is not None else _request.get()
    actor = actor if actor is not None else _actor_of(request)
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    return AuditEntry(
        tenant_id=tenant_id,
        actor_id=actor.pk if actor is not None else None,
        actor_name=(actor_name if actor_name is not None else actor.get_username() if actor is not None else "")[:150],
        address=_address_of(request),
        action=action,
        target=target[:300],
        changes={name: plain(pair) for name, pair in (changes or {}).items() if name not in SECRET_FIELDS},
        detail=detail[:500],
    )


def audit_record_for_user(*, user, action: str, detail: str = "", request=None, by_the_user: bool = True) -> None:
    """An entry about an account (a sign-in, its second factor) in the log of every tenant it is a
    member of, so each tenant's admins see it; an account of no tenant: the operators' log alone.
    `by_the_user`: the account itself acted (not so for a failed sign-in in its name)."""
    tenant_ids = set(Membership.objects.filter(user=user).values_list("tenant_id", flat=True))
    for tenant_id in sorted(tenant_ids) or [None]:
        audit_record(
            action=action,
            tenant=tenant_id,
            target=f"user {user.get_username()}",
            detail=detail,
            actor=user if by_the_user else None,
            request=request,
        )


def audit_export(*, tenant_ids: Iterable[int | None], what: str, request=None) -> None:
    """An export downloaded: one entry in the log of each tenant whose data it holds (one INSERT for
    them all: an operator's export of every tenant's spend names a thousand)."""
    AuditEntry.objects.bulk_create(
        [
            _entry(
                action=AuditEntry.Action.EXPORT,
                tenant=tenant_id,
                target=what,
                changes=None,
                detail="",
                actor=None,
                actor_name=None,
                request=request,
            )
            for tenant_id in sorted(set(tenant_ids), key=lambda i: (i is None, i)) or [None]
        ],  # no batch_size: on PostgreSQL Django inserts every row in one UNNEST statement
    )


# The trigger's own floor (migration 0016): no entry younger than this is ever deleted.
AUDIT_RETENTION_FLOOR_DAYS = 30


def audit_prune(*, days: int, now: datetime | None = None) -> int:
    """Delete the entries older than `days` (at least AUDIT_RETENTION_FLOOR_DAYS); returns how many.
    The one DELETE the append-only trigger lets through: it names its cutoff for this transaction."""
    from django.db import connection, transaction
    from django.utils import timezone

    if days < AUDIT_RETENTION_FLOOR_DAYS:
        raise ValueError(f"the audit log is kept at least {AUDIT_RETENTION_FLOOR_DAYS} days, not {days}")
    cutoff = (now or timezone.now()) - timedelta(days=days)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('sentinel.audit_prune_before', %s, true)", [cutoff.isoformat()])
        deleted, _ = AuditEntry.objects.filter(created_at__lt=cutoff).delete()
    return deleted
