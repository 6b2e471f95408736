"""Single sign-on (#21) through the real redirect flow against a real OpenID provider
(oidc-provider-mock, served on 127.0.0.1 by this test's fixture): the console sends the browser to
the provider, the provider back with a code, and Sentinel exchanges it, checks the ID token against
the provider's keys, and signs the person in as the member the operators' rules make them: a
verified email domain or a group claim gives a tenant and a role. More than five people sign in
(no cap); someone no rule admits is refused and no account is made; an email never takes over an
existing account; each sign-in is in the audit log."""

from __future__ import annotations

import base64
import threading
from urllib.parse import quote

import httpx
import oidc_provider_mock
import pytest
import werkzeug.serving
from django.contrib.auth import get_user_model
from django.test import Client

from tenants.models import AuditEntry, Membership, SingleSignOnIdentity, SingleSignOnRule
from tests.conftest import unique

REPORT = "/api/v1/reports/spend?start=2026-03-01&end=2026-03-01"


@pytest.fixture(scope="module")
def provider() -> str:
    """oidc-provider-mock's app in a thread, on 127.0.0.1 (its own runner binds `localhost`)."""
    server = werkzeug.serving.make_server("127.0.0.1", 0, oidc_provider_mock.app(), threaded=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join()


@pytest.fixture
def sso(provider, settings) -> str:
    settings.OIDC_ISSUER = provider
    settings.OIDC_RP_CLIENT_ID = "sentinel-console"
    settings.OIDC_RP_CLIENT_SECRET = unique("client-secret")
    settings.OIDC_VERIFY_KID = False  # the mock publishes one key, without a key id (the token is still verified)
    return provider


def sign_on(provider: str, sub: str, claims: dict) -> tuple[Client, httpx.Response | None]:
    """The browser's trip: the console's SSO link, the provider's authorization form, the callback."""
    assert httpx.put(f"{provider}/users/{quote(sub)}", json=claims).status_code == 204
    web = Client()
    start = web.get("/oidc/authenticate/", {"next": "/admin/"})
    assert start.status_code == 302 and start["Location"].startswith(f"{provider}/oauth2/authorize?")
    authorized = httpx.post(start["Location"], data={"sub": sub})
    assert authorized.status_code == 302
    callback = authorized.headers["location"]
    assert callback.startswith("http://testserver/oidc/callback/?code=")
    return web, web.get(callback.removeprefix("http://testserver"))


def test_people_sign_on_as_the_members_their_claims_make_them(sso, tenancy):
    t = tenancy
    domain, group = f"{unique('corp')}.example", unique("gateway-admins")
    SingleSignOnRule.objects.create(tenant=t.tenant, email_domain=domain, role=Membership.Role.FINANCE)
    SingleSignOnRule.objects.create(tenant=t.other, group=group, role=Membership.Role.ADMIN)
    t.tenant.require_two_factor = True  # the provider checks who signs in: no TOTP asked on top
    t.tenant.save()
    start = AuditEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0

    alice = f"alice@{domain}"
    web, landed = sign_on(sso, unique("sub"), {"email": alice, "email_verified": True, "groups": [group]})
    assert landed.status_code == 302 and landed["Location"] == "/admin/"
    assert web.get("/admin/tenants/virtualkey/").status_code == 200
    user = get_user_model().objects.get(username=alice)
    assert not user.has_usable_password()
    assert dict(Membership.objects.filter(user=user).values_list("tenant_id", "role")) == {
        t.tenant.pk: "finance",
        t.other.pk: "admin",
    }
    signed_on = AuditEntry.objects.filter(pk__gt=start, action="login.sso", actor_id=user.pk)
    assert sorted(signed_on.values_list("tenant_id", flat=True)) == sorted([t.tenant.pk, t.other.pk])
    added = AuditEntry.objects.filter(pk__gt=start, action="member.added", target=f"member {alice}")
    assert sorted(added.values_list("tenant_id", "changes")) == sorted(
        [(t.tenant.pk, {"role": [None, "finance"]}), (t.other.pk, {"role": [None, "admin"]})]
    )

    # Five more people of the domain (six in all): no cap on how many sign in.
    for n in range(5):
        web, landed = sign_on(sso, unique("sub"), {"email": f"p{n}@{domain}", "email_verified": True})
        assert landed["Location"] == "/admin/"
    assert Membership.objects.filter(tenant=t.tenant, user__email__endswith=f"@{domain}").count() == 6

    # Unverified email and no group: refused, nothing made, the refusal logged.
    accounts = get_user_model().objects.count()
    web, refused = sign_on(sso, unique("sub"), {"email": f"mallory@{domain}", "email_verified": False})
    assert refused["Location"] == "/admin/login/?sso=failed"
    assert web.get("/admin/").status_code == 302
    assert get_user_model().objects.count() == accounts
    assert AuditEntry.objects.filter(pk__gt=start, action="login.failed", detail="single sign-on refused").count() == 1

    # An email an existing account holds signs in as a new account, never as that one.
    t.superuser.email = f"root@{domain}"
    t.superuser.save()
    sub = unique("sub")
    web, landed = sign_on(sso, sub, {"email": t.superuser.email, "email_verified": True})
    assert landed["Location"] == "/admin/"
    identity = SingleSignOnIdentity.objects.get(subject=sub, issuer=sso)
    assert identity.user_id != t.superuser.pk and not identity.user.is_superuser
    assert identity.user.username == t.superuser.email  # the superuser's username is not its email
    assert web.get("/admin/gateway/provider/").status_code == 403


@pytest.mark.parametrize("policy", ["operators", "none"])
def test_an_installation_can_turn_local_passwords_off(policy, sso, tenancy, settings):
    """SENTINEL_PASSWORD_SIGN_IN: with `operators` only superusers sign in with a password (a way in
    while the provider is down), with `none` no one does; single sign-on still signs people in. A
    refused password is answered as a wrong one, on the console's form and on the API's HTTP Basic."""
    t = tenancy
    settings.PASSWORD_SIGN_IN = policy
    domain = f"{unique('corp')}.example"
    SingleSignOnRule.objects.create(tenant=t.tenant, email_domain=domain, role=Membership.Role.ADMIN)

    page = Client().get("/admin/login/")
    assert ('id="login-form"' in page.content.decode()) is (policy == "operators")
    assert "Sign in with single sign-on" in page.content.decode()

    member = Client()
    refused = member.post("/admin/login/", {"username": t.owner.username, "password": t.password})
    assert refused.status_code == 200 and "_auth_user_id" not in member.session
    assert "Please enter the correct username and password" in refused.content.decode()
    basic = "Basic " + base64.b64encode(f"{t.finance.username}:{t.password}".encode()).decode()
    assert Client().get(REPORT, HTTP_AUTHORIZATION=basic).status_code == 401

    operator = Client()
    operator.post("/admin/login/", {"username": t.superuser.username, "password": t.password})
    assert ("_auth_user_id" in operator.session) is (policy == "operators")

    web, landed = sign_on(sso, unique("sub"), {"email": f"ann@{domain}", "email_verified": True})
    assert landed["Location"] == "/admin/" and web.get("/admin/tenants/virtualkey/").status_code == 200


def test_passwords_sign_everyone_in_by_default(tenancy, settings):
    assert settings.PASSWORD_SIGN_IN == "all"
    member = Client()
    member.post("/admin/login/", {"username": tenancy.owner.username, "password": tenancy.password})
    assert int(member.session["_auth_user_id"]) == tenancy.owner.pk
    basic = "Basic " + base64.b64encode(f"{tenancy.finance.username}:{tenancy.password}".encode()).decode()
    assert Client().get(REPORT, HTTP_AUTHORIZATION=basic).status_code == 200


def test_a_group_claim_makes_someone_a_member_of_a_team_alone(sso, tenancy):
    """A rule naming a team (#21 point 3): the group's people become that team's admins, not members
    of the whole tenant, and see the team's keys only; a stronger team rule raises the role."""
    from tenants.models import Team, TeamMembership
    from tenants.services import key_create

    tenant = tenancy.tenant
    search, support = Team.objects.create(tenant=tenant, name="search"), Team.objects.create(tenant=tenant, name="x")
    mine, _ = key_create(tenant=tenant, name="search-app", team=search)
    key_create(tenant=tenant, name="support-app", team=support)
    key_create(tenant=tenant, name="no-team-app")
    group = unique("search-leads")
    SingleSignOnRule.objects.create(tenant=tenant, group=group, role="", team=search, team_role="viewer")
    SingleSignOnRule.objects.create(tenant=tenant, group=group, role="", team=search, team_role="admin")

    sub = unique("sub")
    web, landed = sign_on(sso, sub, {"email": f"{sub}@example.org", "email_verified": False, "groups": [group]})
    assert landed["Location"] == "/admin/"
    user = SingleSignOnIdentity.objects.get(subject=sub).user
    assert list(TeamMembership.objects.filter(user=user).values_list("team_id", "role")) == [(search.pk, "admin")]
    assert not Membership.objects.filter(user=user).exists()
    keys = web.get("/admin/tenants/virtualkey/")
    assert [key.pk for key in keys.context["cl"].result_list] == [mine.pk]
    added = AuditEntry.objects.get(action="member.added", target=f"member {user.username} of team search")
    assert (added.tenant_id, added.changes) == (tenant.pk, {"team_role": [None, "admin"]})


def test_a_team_rule_is_refused_unless_it_names_a_team_of_its_tenant_and_a_team_role(tenancy):
    from django.core.exceptions import ValidationError

    from tenants.models import Team

    mine, theirs = (
        Team.objects.create(tenant=tenancy.tenant, name="a"),
        Team.objects.create(tenant=tenancy.other, name="b"),
    )
    cases = [
        ({"team": theirs, "team_role": "admin", "role": ""}, {"team": ["A team of the rule's own tenant."]}),
        (
            {"team": mine, "team_role": "", "role": ""},
            {"team_role": ["A rule naming a team gives a team role: choose one."]},
        ),
        (
            {"team": mine, "team_role": "admin", "role": "viewer"},
            {"role": ["A rule naming a team gives the team role alone: leave this empty."]},
        ),
        ({"team_role": "admin", "role": "viewer"}, {"team": ["A team role needs a team."]}),
        ({"role": ""}, {"role": ["Choose the tenant role the rule gives (or name a team)."]}),
    ]
    for fields, errors in cases:
        with pytest.raises(ValidationError) as refused:
            SingleSignOnRule(tenant=tenancy.tenant, group="g", **fields).full_clean()
        assert refused.value.message_dict == errors
    assert not SingleSignOnRule.objects.filter(tenant=tenancy.tenant).exists()
