"""The sign-in guard against password guessing, for every way into Sentinel with a password: the
console's login form and HTTP Basic on the management API both end in django.contrib.auth's
authenticate(), whose one backend here is GuardedModelBackend.

Failed sign-ins are counted (django-ratelimit, in the shared Redis cache) twice: per account name
*and client address*, and per client address. The account name is counted as Django matches it
(AuthenticationForm's NFKC and stripped whitespace; case kept, as the User model compares names), so
'admin', ' admin', 'admin\\t' and 'ａｄｍｉｎ' share one counter. Keyed with the address, a caller
over the limit locks out only itself: the account's owner, signing in from elsewhere, is not
stopped. A caller over either limit is refused before its password is checked; the surface answers
429 with Retry-After. Successful sign-ins count against nothing.

django-axes does the same job (a backend and a lockout per username and address); see
docs/console.md for why the guard is these few lines over django-ratelimit instead.
"""

from __future__ import annotations

import ipaddress
import unicodedata

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django_ratelimit.core import get_usage
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BasicAuthentication
from rest_framework.exceptions import AuthenticationFailed, Throttled

GROUP = "sign-in"
# Set on the request when the guard refused it: the seconds until the caller may try again.
WAIT_ATTRIBUTE = "sentinel_sign_in_wait"


def account_name(raw: str | None) -> str:
    """The account a sign-in names, as Django's login form matches it (UsernameField)."""
    name = (raw or "").strip()
    max_length = get_user_model()._meta.get_field(get_user_model().USERNAME_FIELD).max_length
    if max_length is not None and len(name) > max_length:
        return name  # names no account can have: left as they are, like the form does (NFKC can be slow)
    return unicodedata.normalize("NFKC", name)


def client_address(request) -> str:
    """The caller's address: REMOTE_ADDR, which uvicorn takes from X-Forwarded-For only when a proxy
    in FORWARDED_ALLOW_IPS sent it. IPv6 counts per /64, the block one machine usually holds (as
    django-ratelimit's own `ip` key does)."""
    address = request.META.get("REMOTE_ADDR") or "unknown"
    try:
        return str(ipaddress.ip_network(f"{address}/{64 if ':' in address else 32}", strict=False).network_address)
    except ValueError:
        return address


def _counters(request, name: str) -> list[tuple]:
    address = client_address(request)
    # The address comes first and holds no space, so no name can make two pairs share a key.
    return [
        (lambda group, req: f"{address} {name}", settings.LOGIN_RATE_PER_USER),
        (lambda group, req: address, settings.LOGIN_RATE_PER_IP),
    ]


def sign_in_wait(request, name: str) -> int | None:
    """Seconds the caller must wait before another sign-in as `name`, or None when it may try."""
    for key, rate in _counters(request, name):
        usage = get_usage(request, group=GROUP, key=key, rate=rate)
        if usage is not None and usage["count"] >= usage["limit"]:  # the limit is the failures allowed
            return max(int(usage["time_left"]), 1)
    return None


def sign_in_failed(request, name: str) -> None:
    for key, rate in _counters(request, name):
        get_usage(request, group=GROUP, key=key, rate=rate, increment=True)


class GuardedModelBackend(ModelBackend):
    """Django's ModelBackend behind the guard: over a limit, authenticate() stops here (the
    PermissionDenied tells Django to try no other backend) and the request says how long to wait."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:  # not a web sign-in (a management command, a test helper): nothing to count
            return super().authenticate(request, username, password, **kwargs)
        if password is None:  # no password sign-in (single sign-on's callback): not this backend's to count
            return None
        name = account_name(username if username is not None else kwargs.get(get_user_model().USERNAME_FIELD))
        wait = sign_in_wait(request, name)
        if wait is not None:
            setattr(request, WAIT_ATTRIBUTE, wait)
            raise PermissionDenied
        user = super().authenticate(request, username, password, **kwargs)
        if user is None:
            sign_in_failed(request, name)
            return None
        if not password_sign_in_allowed(user):
            # Refused like a wrong password (the same answer, counted alike): nothing tells a caller
            # that the password was right.
            sign_in_failed(request, name)
            return None
        return user


def password_sign_in_allowed(user) -> bool:
    """SENTINEL_PASSWORD_SIGN_IN: everyone, operators (superusers) alone, or no one."""
    policy = settings.PASSWORD_SIGN_IN
    return policy == "all" or (policy == "operators" and user.is_superuser)


def refused_wait(request) -> int | None:
    """The wait the guard set on this request, if it refused a sign-in."""
    return getattr(request, WAIT_ATTRIBUTE, None)


class GuardedBasicAuthentication(BasicAuthentication):
    """HTTP Basic for the management API: a sign-in the guard refused is 429 with Retry-After."""

    def authenticate_credentials(self, userid, password, request=None):
        try:
            return super().authenticate_credentials(userid, password, request)
        except AuthenticationFailed:
            wait = refused_wait(request) if request is not None else None
            if wait is not None:
                raise Throttled(wait=wait, detail="Too many failed sign-ins. Wait and try again.") from None
            raise


class GuardedBasicScheme(OpenApiAuthenticationExtension):
    """Describes GuardedBasicAuthentication in the OpenAPI schema: plain HTTP Basic to a client."""

    target_class = GuardedBasicAuthentication
    name = "basicAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "basic"}
