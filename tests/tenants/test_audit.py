"""The audit log (#21): each kind of change made in the console lands in the tenant's trail with who,
from where and the values before and after, never a secret; sign-ins (good and failed) and exports
too; a tenant's admins read and export only their tenant's entries, and nobody, in the console or
the database, changes or deletes one. Isolation by list, search, filter and object URL is in
tests/console/test_scoping.py (the audit log is one of its models)."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from gateway.models import ModelAlias
from tenants.audit import audit_record
from tenants.models import AuditEntry, Budget, Membership, Tenant, VirtualKey, WebhookEndpoint
from tests.conftest import unique
from tests.console.conftest import as_user
from tests.tenants.test_admin import filled

KEYS = "/admin/tenants/virtualkey/"


def trail(tenant, since: int) -> list[tuple[str, str, dict, str]]:
    """(action, target, changes, detail) of the tenant's entries after id `since`, oldest first."""
    rows = AuditEntry.objects.filter(tenant=tenant, pk__gt=since).order_by("pk")
    return [(row.action, row.target, row.changes, row.detail) for row in rows]


def last_id() -> int:
    return AuditEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def change_page(web, url: str, **changes) -> dict:
    page = web.get(url)
    data = filled(page.context["adminform"].form)
    for inline in page.context["inline_admin_formsets"]:  # as shown: rows kept, none added
        data.update(filled(inline.formset.management_form))
        for form in inline.formset.forms:
            data.update(filled(form))
    data.update(changes)
    return data


def test_each_change_in_the_console_lands_in_the_tenants_trail_with_before_and_after(tenancy):
    t = tenancy
    owner = as_user(t.owner)
    fast, smart = ModelAlias.objects.create(name=unique("fast")), ModelAlias.objects.create(name=unique("smart"))
    start = last_id()

    # A key issued, its allowlist and limit changed, rotated, its successor revoked.
    name = unique("audited-key")
    made = owner.post(
        f"{KEYS}add/",
        {"tenant": t.tenant.pk, "name": name, "allowed_models": [fast.name], "requests_per_minute": "60"},
    )
    assert made.status_code == 303
    secret = owner.get(made["Location"]).context["secret"]
    key = VirtualKey.objects.get(name=name)
    url = reverse("admin:tenants_virtualkey_change", args=[key.pk])
    data = change_page(owner, url, allowed_models=[fast.name, smart.name], requests_per_minute="120")
    assert owner.post(url, data).status_code == 302
    assert owner.post(reverse("admin:tenants_virtualkey_rotate", args=[key.pk])).status_code == 303
    successor = VirtualKey.objects.get(successor=None, name=name, tenant=t.tenant)
    assert owner.post(reverse("admin:tenants_virtualkey_revoke", args=[successor.pk])).status_code == 302

    # A budget added, raised, deleted.
    added = owner.post(
        "/admin/tenants/budget/add/",
        {"tenant": t.tenant.pk, "period": "monthly", "limit_usd": "10", "alert_at_percent": "80", "hard": "on"},
    )
    assert added.status_code == 302
    budget = Budget.objects.get(tenant=t.tenant, key=None)
    budget_url = reverse("admin:tenants_budget_change", args=[budget.pk])
    assert owner.post(budget_url, change_page(owner, budget_url, limit_usd="25")).status_code == 302
    delete_url = reverse("admin:tenants_budget_delete", args=[budget.pk])
    assert owner.post(delete_url, {"post": "yes"}).status_code == 302

    # A member added (by an operator: the outsider is in no tenant of the owner's), their role
    # changed, removed; a webhook's signing secret replaced; the tenant's allowlist and two-factor
    # rule changed (last: from then on the owner's session lacks its second factor).
    operator = as_user(t.superuser)
    add = {"tenant": t.tenant.pk, "username": t.outsider.username, "role": "viewer"}
    assert operator.post("/admin/tenants/membership/add/", add).status_code == 302
    membership = Membership.objects.get(user=t.outsider, tenant=t.tenant)
    member_url = reverse("admin:tenants_membership_change", args=[membership.pk])
    assert owner.post(member_url, {"role": "finance"}).status_code == 302
    member_delete = reverse("admin:tenants_membership_delete", args=[membership.pk])
    assert owner.post(member_delete, {"post": "yes"}).status_code == 302
    endpoint = WebhookEndpoint.objects.create(tenant=t.tenant, url="http://127.0.0.1:9/hook")
    hook_url = reverse("admin:tenants_webhookendpoint_change", args=[endpoint.pk])
    webhook_secret = unique("whsec")
    assert owner.post(hook_url, change_page(owner, hook_url, secret=webhook_secret)).status_code == 302
    tenant_url = reverse("admin:tenants_tenant_change", args=[t.tenant.pk])
    data = change_page(owner, tenant_url, allowed_models=[fast.name], require_two_factor="on")
    assert owner.post(tenant_url, data).status_code == 302

    key_target, successor_target = f"virtual key {key.pk}", f"virtual key {successor.pk}"
    budget_target = f"budget {budget.pk}"
    entries = trail(t.tenant, start)
    assert entries[0][1] == f"virtual key {key.pk} ({key})"
    # Targets name the row's kind and id, then what it was at the time (its name, a budget's amount).
    assert [(action, target.split(" (")[0]) for action, target, _, _ in entries] == [
        ("key.issued", key_target),
        ("object.changed", key_target),
        ("key.issued", successor_target),
        ("key.rotated", key_target),
        ("key.revoked", successor_target),
        ("object.added", budget_target),
        ("object.changed", budget_target),
        ("object.deleted", budget_target),
        ("member.added", f"member {t.outsider.username}"),
        ("member.role", f"member {t.outsider.username}"),
        ("member.removed", f"member {t.outsider.username}"),
        ("object.changed", f"webhook endpoint {endpoint.pk}"),
        ("object.changed", f"tenant {t.tenant.pk}"),
    ]
    changes = [change for _, _, change, _ in entries]
    assert changes[0] == {"allowed_models": [None, [fast.name]], "requests_per_minute": [None, 60]}
    assert changes[1] == {"allowed_models": [[fast.name], [fast.name, smart.name]], "requests_per_minute": [60, 120]}
    assert changes[4] == {"status": ["active", "revoked"]}
    assert changes[5] == {
        "alert_at_percent": [None, 80],
        "hard": [None, True],
        "limit_usd": [None, "10"],
        "period": [None, "monthly"],
        "tenant": [None, t.tenant.pk],
    }
    assert changes[6] == {"limit_usd": ["10.0000", "25"]}
    assert changes[7]["limit_usd"] == ["25.0000", None] and changes[7]["tenant_id"] == [t.tenant.pk, None]
    assert changes[8] == {"role": [None, "viewer"]}
    assert changes[9] == {"role": ["viewer", "finance"]} and changes[10] == {"role": ["finance", None]}
    assert changes[11] == {} and entries[11][3] == "Changed (value not logged): secret."
    assert changes[12] == {"allowed_models": [[], [fast.name]], "require_two_factor": [False, True]}

    rows = AuditEntry.objects.filter(tenant=t.tenant, pk__gt=start).exclude(action__startswith="login.")
    assert {(row.actor_name, row.address) for row in rows} == {
        (t.owner.username, "127.0.0.1"),
        (t.superuser.username, "127.0.0.1"),
    }
    assert [row.actor_id for row in rows if row.action == "member.added"] == [t.superuser.pk]
    everything = json.dumps([[row.target, row.changes, row.detail] for row in rows])
    assert secret not in everything and webhook_secret not in everything and key.digest not in everything
    assert not AuditEntry.objects.filter(tenant=t.other, pk__gt=start).exists()


def test_sign_ins_and_finance_exports_are_in_the_trail(tenancy):
    t = tenancy
    start = last_id()
    web = as_user(t.finance)
    export = web.get(reverse("admin:billing_ledgerentry_export"), {"format": "csv", "tenant": t.tenant.pk})
    assert export.status_code == 200
    b"".join(export.streaming_content)
    fresh = type(web)()
    assert fresh.post("/admin/login/", {"username": t.viewer.username, "password": "wrong"}).status_code == 200
    signed_in = fresh.post("/admin/login/", {"username": t.viewer.username, "password": t.password})
    assert signed_in.status_code == 302

    rows = list(AuditEntry.objects.filter(tenant=t.tenant, pk__gt=start).order_by("pk"))
    assert [(row.action, row.actor_name, row.target, row.detail) for row in rows] == [
        ("login.succeeded", t.finance.username, f"user {t.finance.username}", ""),  # as_user's sign-in
        ("export.downloaded", t.finance.username, f"request log (csv) ?tenant={t.tenant.pk}", ""),
        ("login.failed", "", f"user {t.viewer.username}", "refused"),
        ("login.succeeded", t.viewer.username, f"user {t.viewer.username}", ""),
    ]
    assert rows[2].actor_id is None and rows[3].address == "127.0.0.1"


def test_an_operators_export_of_every_tenant_is_in_each_tenants_trail_in_one_insert(tenancy):
    """Every tenant whose spend an export holds gets its entry; written in one INSERT, as an
    operator's export names every tenant of the installation (a thousand in bench/console.py)."""
    t = tenancy
    start = last_id()
    web = as_user(t.superuser)
    tenants = Tenant.objects.count()
    with CaptureQueriesContext(connection) as queries:
        export = web.get("/admin/billing/spendreport/", {"start": "2026-01-01", "end": "2026-01-31", "format": "csv"})
    assert export.status_code == 200
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('INSERT INTO "tenants_auditentry"')]
    assert len(inserts) == 1
    rows = AuditEntry.objects.filter(pk__gt=start, action="export.downloaded")
    assert rows.count() == tenants
    assert set(rows.values_list("tenant_id", flat=True)) == set(Tenant.objects.values_list("pk", flat=True))
    mine = rows.get(tenant=t.tenant)
    assert (mine.actor_name, mine.target, mine.address) == (
        t.superuser.username,
        "spend report 2026-01-01..2026-01-31 (csv)",
        "127.0.0.1",
    )
    assert rows.get(tenant=t.other).target == mine.target


def test_the_trail_is_read_only_and_each_tenant_admin_exports_only_their_own(tenancy):
    t = tenancy
    marker = unique("trail")
    mine = audit_record(action="object.changed", tenant=t.tenant, target=f"{marker} a")
    theirs = audit_record(action="object.changed", tenant=t.other, target=f"{marker} b")
    installation = audit_record(action="login.failed", target=f"{marker} nobody")
    owner, operator = as_user(t.owner), as_user(t.superuser)

    export = owner.get(reverse("admin:tenants_auditentry_export"), {"q": marker})
    assert export.status_code == 200
    rows = list(csv.reader(io.StringIO(b"".join(export.streaming_content).decode())))
    assert rows[0] == ["created_at", "tenant_id", "actor_name", "address", "action", "target", "changes", "detail"]
    assert [row[5] for row in rows[1:]] == [f"{marker} a"]
    by_operator = operator.get(reverse("admin:tenants_auditentry_export"), {"q": marker, "action": "login.failed"})
    assert [row[5] for row in csv.reader(io.StringIO(b"".join(by_operator.streaming_content).decode()))][1:] == [
        f"{marker} nobody"
    ]
    assert as_user(t.finance).get(reverse("admin:tenants_auditentry_export")).status_code == 403

    # The console offers no way to add, change or delete an entry, to anyone.
    for web in (owner, operator):
        assert web.get(reverse("admin:tenants_auditentry_add")).status_code == 403
        assert web.post(reverse("admin:tenants_auditentry_change", args=[mine.pk]), {"target": "x"}).status_code == 403
        assert web.post(reverse("admin:tenants_auditentry_delete", args=[mine.pk]), {"post": "yes"}).status_code == 403
        changelist = reverse("admin:tenants_auditentry_changelist")
        bulk = web.post(changelist, {"action": "delete_selected", "_selected_action": [mine.pk], "post": "yes"})
        assert bulk.status_code == 200  # no such action: the list again
    assert operator.get(reverse("admin:tenants_auditentry_change", args=[installation.pk])).status_code == 200
    assert owner.get(reverse("admin:tenants_auditentry_change", args=[installation.pk])).status_code == 404

    # Nor does the database: the trigger refuses UPDATE and DELETE.
    for attempt in (
        lambda: AuditEntry.objects.filter(pk=mine.pk).update(target="rewritten"),
        lambda: AuditEntry.objects.filter(pk=theirs.pk).delete(),
    ):
        with pytest.raises(DatabaseError, match="the audit log is append-only"), transaction.atomic():
            attempt()
    assert AuditEntry.objects.get(pk=mine.pk).target == f"{marker} a"
    assert AuditEntry.objects.filter(pk__in=[mine.pk, theirs.pk, installation.pk]).count() == 3


def test_retention_prunes_old_entries_and_the_database_keeps_the_recent_ones(tenancy, settings):
    """SENTINEL_AUDIT_RETENTION_DAYS: beat's daily task deletes the entries older than it; the trigger
    lets through only that DELETE, of rows older than the cutoff the session names and than 30 days
    (its own floor), so no session deletes a recent entry whatever cutoff it sets; UPDATE stays refused."""
    from django.db import connection
    from django.utils import timezone

    from tenants.audit import audit_prune
    from tenants.tasks import prune_audit_log

    marker = unique("retention")
    now = timezone.now()
    ages = {"400 days": 400, "100 days": 100, "40 days": 40, "20 days": 20, "now": 0}
    entries = {
        label: AuditEntry.objects.create(
            tenant=tenancy.tenant,
            action="object.changed",
            target=f"{marker} {label}",
            created_at=now - timedelta(days=d),
        )
        for label, d in ages.items()
    }

    def left() -> list[str]:
        targets = AuditEntry.objects.filter(target__startswith=marker).values_list("target", flat=True)
        return sorted(t.removeprefix(f"{marker} ") for t in targets)

    settings.AUDIT_RETENTION_DAYS = 0
    assert prune_audit_log() == 0 and len(left()) == 5  # kept forever by default
    with pytest.raises(ValueError, match="at least 30 days"):
        audit_prune(days=10)

    settings.AUDIT_RETENTION_DAYS = 90
    assert prune_audit_log() == 2
    assert left() == ["20 days", "40 days", "now"]

    # A session naming a cutoff in the future still deletes nothing younger than 30 days, nor updates.
    for attempt in (
        lambda: AuditEntry.objects.filter(pk=entries["20 days"].pk).delete(),
        lambda: AuditEntry.objects.filter(pk=entries["40 days"].pk).update(target="rewritten"),
    ):
        with pytest.raises(DatabaseError, match="the audit log is append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('sentinel.audit_prune_before', %s, true)",
                    [(now + timedelta(days=1)).isoformat()],
                )
            attempt()
    assert left() == ["20 days", "40 days", "now"]
    # The 40-day entry is past the floor: a 30-day retention may take it.
    assert audit_prune(days=30) == 1
    assert left() == ["20 days", "now"]
