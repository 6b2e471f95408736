"""Team isolation in the console (#21 point 1): a team admin sees and manages its own team's keys
and reads its team's request log, never another team's (a 404, as another tenant's object is) nor
a key of no team; a team viewer only looks; tenant admins make teams and their members; every
change lands in the audit log."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from billing.models import LedgerEntry
from tenants.models import AuditEntry, Team, TeamMembership, VirtualKey
from tenants.services import key_create, team_membership_save
from tests.conftest import unique
from tests.console.conftest import as_user
from tests.tenants.test_admin import filled


@dataclass
class Teams:
    tenancy: object
    search: Team
    support: Team
    keys: dict  # search | support | none → VirtualKey
    rows: dict  # search | support | none → LedgerEntry
    lead: object  # admin of team search, no tenant role
    watcher: object  # viewer of team search
    rival: object  # admin of team support


@pytest.fixture
def teams(tenancy) -> Teams:
    tenant = tenancy.tenant
    search = Team.objects.create(tenant=tenant, name="search")
    support = Team.objects.create(tenant=tenant, name="support")
    keys, rows = {}, {}
    for name, team in (("search", search), ("support", support), ("none", None)):
        keys[name], _ = key_create(tenant=tenant, name=f"{name}-app", team=team)
        rows[name] = LedgerEntry.objects.create(
            request_id=unique("req"),
            created_at=timezone.now(),
            tenant=tenant,
            key=keys[name],
            team=team,
            model_requested="gpt-4o-mini",
            status_code=200,
        )

    def person(team: Team, role: str):
        user = get_user_model().objects.create_user(unique(f"team-{role}"), password=tenancy.password)
        team_membership_save(team=team, user=user, role=role)
        return user

    return Teams(
        tenancy=tenancy,
        search=search,
        support=support,
        keys=keys,
        rows=rows,
        lead=person(search, "admin"),
        watcher=person(search, "viewer"),
        rival=person(support, "admin"),
    )


def key_url(action: str, *args) -> str:
    return reverse(f"admin:tenants_virtualkey_{action}", args=args)


def listed(response) -> set:
    assert response.status_code == 200, response.status_code
    return {obj.pk for obj in response.context["cl"].result_list}


def test_team_members_list_only_their_teams_keys_and_requests(teams):
    for person, team in ((teams.lead, "search"), (teams.watcher, "search"), (teams.rival, "support")):
        web = as_user(person)
        assert listed(web.get(key_url("changelist"))) == {teams.keys[team].pk}
        requests = web.get(reverse("admin:billing_ledgerentry_changelist"))
        assert listed(requests) == {teams.rows[team].pk}
        # Another tenant's configuration is not theirs either.
        assert web.get(reverse("admin:tenants_tenant_changelist")).status_code == 403
    # The tenant's admin sees every team's and the team-less key.
    assert listed(as_user(teams.tenancy.owner).get(key_url("changelist"))) >= set(key.pk for key in teams.keys.values())


@pytest.mark.parametrize("other", ["support", "none"])
def test_a_team_admin_cannot_see_or_change_another_teams_key_or_request(teams, other):
    web = as_user(teams.lead)
    key, row = teams.keys[other], teams.rows[other]
    before = VirtualKey.objects.filter(pk=key.pk).values().get()
    for action in ("change", "history", "rotate", "revoke"):
        assert web.get(key_url(action, key.pk)).status_code == 404, action
    assert web.post(key_url("change", key.pk), {"name": "taken"}).status_code == 404
    assert web.post(key_url("revoke", key.pk)).status_code == 404
    assert web.post(key_url("changelist"), {"action": "revoke", "_selected_action": [key.pk]}).status_code == 302
    log_url = reverse("admin:billing_ledgerentry_change", args=[row.pk])
    assert web.get(log_url).status_code == 404
    assert VirtualKey.objects.filter(pk=key.pk).values().get() == before
    assert not AuditEntry.objects.filter(actor=teams.lead).exclude(action=AuditEntry.Action.LOGIN).exists()


def test_a_team_admin_manages_its_teams_keys_and_every_change_is_audited(teams):
    web = as_user(teams.lead)
    key = teams.keys["search"]
    page = web.get(key_url("change", key.pk))
    assert page.status_code == 200 and page.context["has_change_permission"] is True
    data = filled(page.context["adminform"].form)
    (inline,) = page.context["inline_admin_formsets"]
    data.update({f"{inline.formset.prefix}-TOTAL_FORMS": "0", f"{inline.formset.prefix}-INITIAL_FORMS": "0"})
    assert web.post(key_url("change", key.pk), {**data, "name": "search-renamed"}).status_code == 302
    assert VirtualKey.objects.get(pk=key.pk).name == "search-renamed"
    changed = AuditEntry.objects.get(actor=teams.lead, action=AuditEntry.Action.CHANGED)
    assert (changed.tenant_id, changed.changes["name"]) == (teams.tenancy.tenant.pk, ["search-app", "search-renamed"])

    # A new key: in the team (filled in for its only team), never in another team or in none.
    add = web.get(key_url("add"))
    assert add.context["adminform"].form.initial["team"] == teams.search.pk
    count = VirtualKey.objects.count()
    fields = {"tenant": teams.tenancy.tenant.pk, "name": "new-app"}
    for team, error in (
        (teams.support.pk, "Select a valid choice"),
        ("", "Choose one of the teams you administer"),
    ):
        refused = web.post(key_url("add"), {**fields, "team": team})
        assert refused.status_code == 200 and error in str(refused.context["adminform"].form.errors["team"])
    assert VirtualKey.objects.count() == count
    assert web.post(key_url("add"), {**fields, "team": teams.search.pk}).status_code == 303  # to the reveal
    issued = VirtualKey.objects.get(name="new-app")
    assert (issued.tenant_id, issued.team_id) == (teams.tenancy.tenant.pk, teams.search.pk)
    entry = AuditEntry.objects.get(actor=teams.lead, action=AuditEntry.Action.KEY_ISSUED)
    assert entry.changes["team"] == [None, "search"]

    # Revoking its own team's key: allowed, and audited.
    assert web.post(key_url("revoke", key.pk)).status_code == 302
    assert VirtualKey.objects.get(pk=key.pk).status == VirtualKey.Status.REVOKED
    assert AuditEntry.objects.filter(actor=teams.lead, action=AuditEntry.Action.KEY_REVOKED).count() == 1


def test_a_team_viewer_only_looks(teams):
    web = as_user(teams.watcher)
    key = teams.keys["search"]
    before = VirtualKey.objects.filter(pk=key.pk).values().get()
    page = web.get(key_url("change", key.pk))
    assert page.status_code == 200 and page.context["has_change_permission"] is False
    assert web.post(key_url("change", key.pk), {"name": "x"}).status_code == 403
    assert web.get(key_url("add")).status_code == 403
    assert web.post(key_url("revoke", key.pk)).status_code == 403
    assert VirtualKey.objects.filter(pk=key.pk).values().get() == before
    # Its team's page: seen, not edited (a team's settings are its tenant admins').
    team_page = web.get(reverse("admin:tenants_team_change", args=[teams.search.pk]))
    assert team_page.status_code == 200 and team_page.context["has_change_permission"] is False
    assert web.get(reverse("admin:tenants_team_change", args=[teams.support.pk])).status_code == 404


def test_a_tenant_admin_makes_a_team_and_its_members_audited(teams):
    tenancy = teams.tenancy
    web = as_user(tenancy.owner)
    url = reverse("admin:tenants_team_add")
    page = web.get(url)
    (inline,) = page.context["inline_admin_formsets"]
    prefix = inline.formset.prefix
    data = {
        "tenant": tenancy.tenant.pk,
        "name": "billing",
        "requests_per_minute": "50",
        f"{prefix}-TOTAL_FORMS": "1",
        f"{prefix}-INITIAL_FORMS": "0",
        f"{prefix}-0-username": tenancy.viewer.username,
        f"{prefix}-0-role": "admin",
    }
    # Past the tenant's limit: refused, nothing made.
    tenancy.tenant.requests_per_minute = 40
    tenancy.tenant.save(update_fields=["requests_per_minute"])
    refused = web.post(url, data)
    assert refused.status_code == 200
    assert refused.context["adminform"].form.errors["requests_per_minute"] == [
        "At most the tenant's requests per minute (40)."
    ]
    assert not Team.objects.filter(tenant=tenancy.tenant, name="billing").exists()
    assert web.post(url, {**data, "requests_per_minute": "40"}).status_code == 302
    team = Team.objects.get(tenant=tenancy.tenant, name="billing")
    # Its members are named on its page once it exists.
    change = reverse("admin:tenants_team_change", args=[team.pk])
    page = web.get(change)
    assert page.context["inline_admin_formsets"][0].formset.prefix == prefix
    form = {name: value for name, value in data.items() if name != "tenant"}
    assert web.post(change, {**form, "requests_per_minute": "40"}).status_code == 302
    assert TeamMembership.objects.get(team=team).user == tenancy.viewer
    trail = AuditEntry.objects.filter(tenant=tenancy.tenant, actor=tenancy.owner).exclude(action="login.succeeded")
    trail = trail.order_by("pk")
    assert [(e.action, e.target) for e in trail] == [
        ("object.added", f"team {team.pk} (billing)"),
        ("member.added", f"member {tenancy.viewer.username} of team billing"),
    ]
    # Another tenant's admin reaches none of it; a team admin does not make teams.
    assert as_user(tenancy.outsider).get(reverse("admin:tenants_team_change", args=[team.pk])).status_code == 404
    assert as_user(teams.lead).get(url).status_code == 403


def test_a_team_admins_request_log_export_holds_its_teams_requests_alone(teams):
    import csv
    import io

    web = as_user(teams.lead)
    exported = web.get(reverse("admin:billing_ledgerentry_export"), {"format": "csv"})
    assert exported.status_code == 200
    lines = list(csv.DictReader(io.StringIO(b"".join(exported.streaming_content).decode())))
    assert [(line["request_id"], line["team_id"], line["team"]) for line in lines] == [
        (teams.rows["search"].request_id, str(teams.search.pk), "search")
    ]
    entry = AuditEntry.objects.get(actor=teams.lead, action=AuditEntry.Action.EXPORT)
    assert entry.tenant_id == teams.tenancy.tenant.pk


def test_a_key_narrows_its_team_as_a_team_narrows_its_tenant(teams):
    """A key set past its team's limits or outside its team's allowlist is refused on the form,
    naming the team's figure, whoever edits it; within them it is issued. Nothing is saved on an
    error (the stricter limit would apply anyway: the form says so instead of promising more)."""
    from gateway.models import ModelAlias
    from tenants.models import RateLimitTier

    allowed, other = ModelAlias.objects.create(name=unique("team-model")), ModelAlias.objects.create(name=unique("x"))
    team = teams.search
    team.requests_per_minute, team.allowed_models = 100, [allowed.name]
    team.save(update_fields=["requests_per_minute", "allowed_models"])
    big = RateLimitTier.objects.create(name=unique("tier"), requests_per_minute=500)
    count = VirtualKey.objects.count()
    fields = {"tenant": teams.tenancy.tenant.pk, "name": "narrow-app", "team": team.pk}
    for web in (as_user(teams.lead), as_user(teams.tenancy.owner)):
        for extra, field, error in (
            ({"requests_per_minute": "101"}, "requests_per_minute", "At most team search's requests per minute (100)."),
            ({"tier": big.pk}, "tier", "At most team search's requests per minute (100)."),
            ({"allowed_models": [other.name]}, "allowed_models", f"Not on team search's list of models: {other.name}."),
        ):
            refused = web.post(key_url("add"), {**fields, **extra})
            assert refused.status_code == 200
            assert error in " ".join(refused.context["adminform"].form.errors[field])
        assert VirtualKey.objects.count() == count
    made = as_user(teams.lead).post(
        key_url("add"), {**fields, "requests_per_minute": "100", "allowed_models": [allowed.name]}
    )
    assert made.status_code == 303
    key = VirtualKey.objects.get(name="narrow-app")
    assert (key.team_id, key.requests_per_minute, key.allowed_models) == (team.pk, 100, [allowed.name])
    # A key of no team is bound by its tenant's alone (the tenant has no limit here).
    owner = as_user(teams.tenancy.owner)
    free = owner.post(key_url("add"), {**fields, "name": "free-app", "team": "", "requests_per_minute": "1000"})
    assert free.status_code == 303
