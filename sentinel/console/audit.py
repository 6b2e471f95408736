"""Where the console feeds the audit log (tenants.audit): who is acting (a middleware hands the
request to the log's writer) and sign-ins, good and failed, by password or single sign-on, which
all end in django.contrib.auth's login() or its failure signal."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_login_failed

from sentinel.authentication import account_name
from tenants.audit import acting_request, audit_record, audit_record_for_user
from tenants.models import AuditEntry

SSO_BACKEND = "sentinel.console.sso.SignOnBackend"


class AuditContextMiddleware:
    """Makes the request being served the audit log's source of who and where."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with acting_request(request):
            return self.get_response(request)


def signed_in(sender, request, user, **kwargs) -> None:
    sso = getattr(user, "backend", "") == SSO_BACKEND
    audit_record_for_user(
        user=user,
        action=AuditEntry.Action.LOGIN_SSO if sso else AuditEntry.Action.LOGIN,
        detail=second_factor(getattr(user, "otp_device", None)),
        request=request,
    )


def second_factor(device) -> str:
    """How a sign-in's second factor is named in its audit entry (blank: none)."""
    from django_otp_webauthn.models import WebAuthnCredential

    if device is None:
        return ""
    return "with a security key" if isinstance(device, WebAuthnCredential) else "with a one-time code"


def sign_in_failed(sender, credentials, request=None, **kwargs) -> None:
    """A refused password (or a sign-in the brute-force guard stopped): in the account's tenants'
    logs when such an account exists, else the operators' alone. The password is never logged."""
    if "nonce" in credentials:  # single sign-on's callback: the provider or the rules refused
        audit_record(action=AuditEntry.Action.LOGIN_FAILED, detail="single sign-on refused", request=request)
        return
    name = account_name(credentials.get("username") or credentials.get(get_user_model().USERNAME_FIELD))
    user = get_user_model().objects.filter(username=name).first() if name else None
    if user is not None:
        audit_record_for_user(
            user=user, action=AuditEntry.Action.LOGIN_FAILED, detail="refused", request=request, by_the_user=False
        )
        return
    audit_record(
        action=AuditEntry.Action.LOGIN_FAILED,
        target=f"user {name[:100]}",
        detail="no such account",
        actor_name="",
        request=request,
    )


def connect() -> None:
    user_logged_in.connect(signed_in, dispatch_uid="sentinel-audit-signed-in")
    user_login_failed.connect(sign_in_failed, dispatch_uid="sentinel-audit-sign-in-failed")
