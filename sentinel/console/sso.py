"""Single sign-on to the console over OpenID Connect, with mozilla-django-oidc (authorization code
flow with PKCE, ID tokens checked against the provider's keys).

One provider per installation, set by the operator (SENTINEL_OIDC_ISSUER, client id and secret);
its endpoints come from its discovery document. Who may sign in, and as what, is decided by the
operators' single sign-on rules (tenants.SingleSignOnRule): a verified email at a domain, or a value
of the groups claim, makes the account a member of a tenant with a role. An account no rule admits
is refused and never created; there is no cap on how many sign in. Accounts are matched by the
provider's subject (tenants.SingleSignOnIdentity), never by email.
"""

from __future__ import annotations

import functools
import hashlib
import logging

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from tenants.models import Membership, SingleSignOnIdentity, SingleSignOnRule, Team, TeamMembership, Tenant
from tenants.services import membership_save, team_membership_save

logger = logging.getLogger(__name__)

# mozilla-django-oidc's endpoint settings, and the discovery document's names for them.
DISCOVERED = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
# A member matched by several rules of one tenant gets the strongest role.
ROLE_STRENGTH = {Membership.Role.VIEWER: 0, Membership.Role.FINANCE: 1, Membership.Role.ADMIN: 2}


@functools.cache
def discovery(issuer: str) -> dict:
    """The provider's discovery document (read once per process and issuer)."""
    response = httpx.get(f"{issuer.rstrip('/')}/.well-known/openid-configuration", timeout=settings.OIDC_TIMEOUT)
    response.raise_for_status()
    document = response.json()
    if document.get("issuer", "").rstrip("/") != issuer.rstrip("/"):
        raise ValueError(f"The discovery document at {issuer} names another issuer: {document.get('issuer')!r}.")
    return document


def oidc_setting(attr: str, *default):
    """mozilla-django-oidc's settings, the endpoints read from the provider. A provider that cannot
    be reached leaves them empty: single sign-on fails (to the sign-in page) and passwords still work."""
    if attr in DISCOVERED and settings.OIDC_ISSUER:
        try:
            return discovery(settings.OIDC_ISSUER)[DISCOVERED[attr]]
        except (httpx.HTTPError, ValueError, KeyError) as error:
            logger.warning("single sign-on: no discovery document from %s: %s", settings.OIDC_ISSUER, error)
            return ""
    return getattr(settings, attr, *default)


def _claimed(claims: dict) -> tuple[str, set[str]]:
    """The verified email's domain ("" without one) and the groups the claims name."""
    email = claims.get("email") or ""
    domain = email.rpartition("@")[2].lower() if claims.get("email_verified") is True and "@" in email else ""
    groups = claims.get("groups") or []
    return domain, {groups} if isinstance(groups, str) else {str(group) for group in groups}


def _granted(claims: dict, *, team: bool) -> dict:
    """{tenant or team: role} the operators' rules of that kind grant an account with these claims,
    the strongest where several match."""
    domain, groups = _claimed(claims)
    owner, role, strength = ("team", "team_role", TEAM_ROLE_STRENGTH) if team else ("tenant", "role", ROLE_STRENGTH)
    granted: dict = {}
    rules = SingleSignOnRule.objects.select_related(owner).filter(
        team__isnull=not team, tenant__status=Tenant.Status.ACTIVE
    )
    for rule in rules:
        if (rule.email_domain and rule.email_domain == domain) or (rule.group and rule.group in groups):
            held = granted.get(getattr(rule, owner))
            if held is None or strength[getattr(rule, role)] > strength[held]:
                granted[getattr(rule, owner)] = getattr(rule, role)
    return granted


def roles_from_claims(claims: dict) -> dict[Tenant, str]:
    """{tenant: role} the operators' rules grant an account with these claims (a team rule's are its
    team's: team_roles_from_claims)."""
    return _granted(claims, team=False)


TEAM_ROLE_STRENGTH = {TeamMembership.Role.VIEWER: 0, TeamMembership.Role.ADMIN: 1}


def team_roles_from_claims(claims: dict) -> dict[Team, str]:
    """{team: team role} the operators' team rules grant an account with these claims."""
    return _granted(claims, team=True)


class SignOnBackend(OIDCAuthenticationBackend):
    """Answers only the provider's callback (mozilla-django-oidc's view passes a nonce); a password
    sign-in never reaches the provider."""

    get_settings = staticmethod(oidc_setting)

    def authenticate(self, request, **kwargs):
        if not settings.OIDC_ISSUER or "nonce" not in kwargs:
            return None
        return super().authenticate(request, **kwargs)

    def verify_claims(self, claims) -> bool:
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims):
        return self.UserModel.objects.filter(
            sso_identity__issuer=settings.OIDC_ISSUER, sso_identity__subject=claims["sub"]
        )

    @transaction.atomic
    def create_user(self, claims):
        granted, teams = roles_from_claims(claims), team_roles_from_claims(claims)
        if not granted and not teams:
            return None  # no rule admits this account: nothing is created
        User = get_user_model()
        email = (claims.get("email") or "")[:150]
        username = email or claims["sub"][:150]
        if not username or User.objects.filter(username=username).exists():
            username = "sso-" + hashlib.sha256(f"{settings.OIDC_ISSUER} {claims['sub']}".encode()).hexdigest()[:16]
        user = User.objects.create_user(username, email=email, is_staff=True)  # no usable password
        SingleSignOnIdentity.objects.create(user=user, issuer=settings.OIDC_ISSUER, subject=claims["sub"])
        self._grant(user, granted, teams)
        return user

    def update_user(self, user, claims):
        granted, teams = roles_from_claims(claims), team_roles_from_claims(claims)
        held = Membership.objects.filter(user=user).exists() or TeamMembership.objects.filter(user=user).exists()
        if not granted and not teams and not held and not user.is_superuser:
            return None
        self._grant(user, granted, teams)
        return user

    @staticmethod
    def _grant(user, granted: dict[Tenant, str], teams: dict[Team, str]) -> None:
        """Memberships (of tenants and of teams) the rules grant, raised where a rule grants more;
        never lowered (an admin may have given more by hand)."""
        held = dict(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
        for tenant, role in granted.items():
            if tenant.pk not in held or ROLE_STRENGTH[role] > ROLE_STRENGTH[held[tenant.pk]]:
                membership_save(tenant=tenant, user=user, role=role)
        in_teams = dict(TeamMembership.objects.filter(user=user).values_list("team_id", "role"))
        for team, role in teams.items():
            if team.pk not in in_teams or TEAM_ROLE_STRENGTH[role] > TEAM_ROLE_STRENGTH[in_teams[team.pk]]:
                team_membership_save(team=team, user=user, role=role)


class SignOnRequestView(OIDCAuthenticationRequestView):
    get_settings = staticmethod(oidc_setting)


class SignOnCallbackView(OIDCAuthenticationCallbackView):
    get_settings = staticmethod(oidc_setting)
