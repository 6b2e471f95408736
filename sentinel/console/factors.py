"""Who must give a second factor at sign-in, and whether this session's sign-in was strong enough
for the console: read by the sign-in form and the two-factor page (sentinel.console.twofactor), the
security keys' views (sentinel.console.securitykeys) and the admin site (sentinel.console.sites)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY
from django_otp import user_has_device

from sentinel.console.audit import SSO_BACKEND
from tenants.models import Tenant


def has_second_factor(user) -> bool:
    """An authenticator app or a security key, confirmed."""
    return user_has_device(user, confirmed=True)


def required_for(user) -> bool:
    """Whether the installation or one of the user's tenants requires a second factor of them."""
    return (
        settings.REQUIRE_TWO_FACTOR or Tenant.objects.filter(memberships__user=user, require_two_factor=True).exists()
    )


def signed_in_by_sso(request) -> bool:
    return request.session.get(BACKEND_SESSION_KEY) == SSO_BACKEND


def console_allows(request) -> bool:
    """Whether this session's sign-in is strong enough for console pages (read once per request)."""
    allowed = getattr(request, "_two_factor_allows", None)
    if allowed is None:
        user = request.user
        allowed = (
            not user.is_authenticated
            or signed_in_by_sso(request)
            or user.is_verified()
            or (not has_second_factor(user) and not required_for(user))
        )
        request._two_factor_allows = allowed
    return allowed


def must_enrol(request) -> bool:
    user = request.user
    return (
        user.is_authenticated
        and user.is_active
        and user.is_staff
        and not signed_in_by_sso(request)
        and not has_second_factor(user)
        and required_for(user)
    )
