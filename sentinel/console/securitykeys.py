"""Security keys and passkeys (WebAuthn) as the console's second factor beside TOTP, through
django-otp-webauthn: its ceremonies, credential rows and browser scripts, narrowed to the console's
two moments.

- Registering a key: a console user whose session the console lets in (or who must enrol first);
  someone who has a second factor already must have used it in this session (the library's check).
- Signing in with a key is the second half of the password sign-in: the sign-in form, given the right
  password of someone with a key and no one-time code, keeps whose password it was in the session
  (KEY_STEP) for the ceremony's timeout. Only then are assertion options issued, naming that account's
  keys alone, and only an assertion by one of them signs the account in. No passwordless sign-in.

The relying party (ID and origin) is settings.WEBAUTHN_ORIGIN, never the request's Host header.
"""

from __future__ import annotations

import json
import time

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth import login as auth_login
from django.urls import path
from django.views.i18n import JavaScriptCatalog
from django_otp import login as otp_login
from django_otp_webauthn import exceptions
from django_otp_webauthn.models import WebAuthnCredential
from django_otp_webauthn.settings import app_settings
from django_otp_webauthn.views import (
    BeginCredentialAuthenticationView,
    BeginCredentialRegistrationView,
    CompleteCredentialAuthenticationView,
    CompleteCredentialRegistrationView,
)

from sentinel.console.factors import console_allows, must_enrol
from tenants.audit import audit_record_for_user
from tenants.models import AuditEntry

KEY_STEP = "sentinel_security_key_step"
SIGN_IN_BACKEND = "sentinel.authentication.GuardedModelBackend"  # the session says: signed in by password
WRONG_KEY = "missing or wrong security key"


def keys_of(user):
    """The user's registered security keys, oldest first."""
    return WebAuthnCredential.objects.filter(user=user, confirmed=True).order_by("created_at", "pk")


def key_step_start(request, user) -> None:
    """The password was right and the account has a key: the sign-in waits for an assertion."""
    request.session[KEY_STEP] = {"user": user.pk, "until": time.time() + app_settings.OTP_WEBAUTHN_TIMEOUT_SECONDS}


def key_step_user(request):
    """Whose password this session gave, while the step lasts (an active console user), else None."""
    step = request.session.get(KEY_STEP)
    if not step or step.get("until", 0) < time.time():
        return None
    return get_user_model().objects.filter(pk=step.get("user"), is_active=True, is_staff=True).first()


def key_remove(*, request, key: WebAuthnCredential) -> None:
    key.delete()
    audit_record_for_user(
        user=key.user, action=AuditEntry.Action.TWO_FACTOR_REMOVED, detail=f"security key {key.name}", request=request
    )


class _ConsoleRegistration:
    """Registration is for console users the console lets in, or who must enrol before it does."""

    def check_can_register(self):
        user = self.request.user
        if not (user.is_active and user.is_staff and (console_allows(self.request) or must_enrol(self.request))):
            raise exceptions.NotAuthenticated()


class RegistrationBegin(_ConsoleRegistration, BeginCredentialRegistrationView):
    pass


class RegistrationComplete(_ConsoleRegistration, CompleteCredentialRegistrationView):
    def post(self, *args, **kwargs):
        response = super().post(*args, **kwargs)  # verified and saved, or an error answered
        key = WebAuthnCredential.objects.get(pk=json.loads(response.content)["id"], user=self.request.user)
        key.name = f"Security key {keys_of(self.request.user).count()}"
        key.save(update_fields=["name"])
        audit_record_for_user(
            user=self.request.user,
            action=AuditEntry.Action.TWO_FACTOR_ENROLLED,
            detail=f"security key {key.name}",
            request=self.request,
        )
        messages.success(self.request, "Security key added: a sign-in may now use it instead of a code.")
        return response


class _KeyStep:
    """The assertion ceremony belongs to the sign-in's second step alone: the user is whoever gave
    the right password in this session, never whoever the assertion names."""

    def get_user(self):
        return key_step_user(self.request)

    def check_can_authenticate(self):
        if self.get_user() is None:
            raise exceptions.NotAuthenticated(detail="Sign in with your password first.")


class AuthenticationBegin(_KeyStep, BeginCredentialAuthenticationView):
    pass


class AuthenticationComplete(_KeyStep, CompleteCredentialAuthenticationView):
    def complete_auth(self, device) -> None:
        user = device.user
        if user != self.get_user():  # the library checks this too; it decides who is signed in
            raise exceptions.CredentialUserMismatch()
        self.request.session.pop(KEY_STEP, None)
        user.otp_device = device  # the sign-in's audit entry says how (sentinel.console.audit)
        auth_login(self.request, user, backend=SIGN_IN_BACKEND)
        otp_login(self.request, device)

    def handle_exception(self, exc):
        """A refused assertion is a failed sign-in, like a wrong one-time code: in the audit log, and the
        step is over (the password again before another try)."""
        user = self.get_user()
        if user is not None:
            self.request.session.pop(KEY_STEP, None)
            audit_record_for_user(
                user=user,
                action=AuditEntry.Action.LOGIN_FAILED,
                detail=WRONG_KEY,
                request=self.request,
                by_the_user=False,
            )
        return super().handle_exception(exc)


# Under the library's namespace, which its template tags and scripts name.
urlpatterns = [
    path("registration/begin/", RegistrationBegin.as_view(), name="credential-registration-begin"),
    path("registration/complete/", RegistrationComplete.as_view(), name="credential-registration-complete"),
    path("authentication/begin/", AuthenticationBegin.as_view(), name="credential-authentication-begin"),
    path("authentication/complete/", AuthenticationComplete.as_view(), name="credential-authentication-complete"),
    path("jsi18n/", JavaScriptCatalog.as_view(packages=["django_otp_webauthn"]), name="js-i18n-catalog"),
]
