"""Two-factor sign-in to the console with django-otp's TOTP devices (an authenticator app).

Who needs it: anyone who enrolled, every password account when the operator requires it
(SENTINEL_REQUIRE_TWO_FACTOR), and the members of a tenant that requires it. The sign-in form asks
for the password and the one-time code together; a session signed in without the code (or from
before the code was required) opens no console page until it has one: someone required to and not
yet enrolled is sent to enrol first. Single sign-on sessions are exempt (their provider checks).
"""

from __future__ import annotations

from io import BytesIO

import qrcode
import qrcode.image.svg
from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import BACKEND_SESSION_KEY
from django.http import HttpResponseRedirect
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.safestring import mark_safe
from django_otp import login as otp_login
from django_otp.plugins.otp_totp.models import TOTPDevice
from unfold.forms import AuthenticationForm
from unfold.widgets import BASE_INPUT_CLASSES

from sentinel.console.audit import SSO_BACKEND
from tenants.audit import audit_record_for_user
from tenants.models import AuditEntry, Tenant

WRONG_CODE = "That one-time code is wrong or used already. Enter the current code from your authenticator app."


def device_of(user) -> TOTPDevice | None:
    """The user's enrolled authenticator (confirmed), if any."""
    return TOTPDevice.objects.filter(user=user, confirmed=True).first()


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
            or (device_of(user) is None and not required_for(user))
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
        and device_of(user) is None
        and required_for(user)
    )


class ConsoleAuthenticationForm(AuthenticationForm):
    """Unfold's sign-in form with a one-time code, checked after the password for anyone enrolled."""

    otp_token = forms.CharField(
        label="One-time code",
        required=False,
        max_length=8,
        help_text="From your authenticator app, if you enrolled one.",
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "inputmode": "numeric", "class": " ".join(BASE_INPUT_CLASSES)}
        ),
    )

    def clean(self):
        data = super().clean()  # the password (and the brute-force guard) first
        user = self.get_user()
        device = device_of(user) if user is not None else None
        if device is None:
            return data
        allowed, _ = device.verify_is_allowed()  # django-otp backs off after failed codes
        token = (data.get("otp_token") or "").strip()
        if not (allowed and token and device.verify_token(token)):
            audit_record_for_user(
                user=user,
                action=AuditEntry.Action.LOGIN_FAILED,
                detail="missing or wrong one-time code",
                request=self.request,
                by_the_user=False,
            )
            raise forms.ValidationError(WRONG_CODE, code="invalid_token")
        user.otp_device = device  # django_otp keeps it in the session at login(): is_verified()
        return data


class CodeForm(forms.Form):
    token = forms.CharField(
        label="One-time code",
        max_length=8,
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "inputmode": "numeric", "class": " ".join(BASE_INPUT_CLASSES)}
        ),
    )


def qr_svg(url: str) -> str:
    image = qrcode.make(url, image_factory=qrcode.image.svg.SvgPathImage, box_size=8)
    buffer = BytesIO()
    image.save(buffer)
    return buffer.getvalue().decode()


def two_factor_view(request, site):
    """Enrol an authenticator (scan, then confirm with a first code) or remove it (with a current
    code; not while one is required). Open to every signed-in console user, also before their
    session passes console_allows: those required to enrol land here."""
    user = request.user
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return redirect(f"{reverse('admin:login')}?next={request.path}")
    device = device_of(user)
    form = CodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        token = form.cleaned_data["token"].strip()
        if device is None:
            pending = TOTPDevice.objects.filter(user=user, confirmed=False).first()
            if pending is not None and pending.verify_token(token):
                TOTPDevice.objects.filter(pk=pending.pk).update(confirmed=True)
                pending.confirmed = True
                otp_login(request, pending)
                audit_record_for_user(user=user, action=AuditEntry.Action.TWO_FACTOR_ENROLLED, request=request)
                messages.success(request, "Two-factor sign-in is on: each sign-in now asks for a code.")
                return HttpResponseRedirect(reverse("admin:two_factor"))
            form.add_error("token", WRONG_CODE)
        elif required_for(user):
            form.add_error(None, "Your tenant (or this installation) requires two-factor sign-in: it stays on.")
        elif device.verify_is_allowed()[0] and device.verify_token(token):
            TOTPDevice.objects.filter(user=user).delete()
            audit_record_for_user(user=user, action=AuditEntry.Action.TWO_FACTOR_REMOVED, request=request)
            messages.success(request, "Two-factor sign-in is off.")
            return HttpResponseRedirect(reverse("admin:two_factor"))
        else:
            form.add_error("token", WRONG_CODE)
    pending = None
    if device is None:
        pending = TOTPDevice.objects.filter(user=user, confirmed=False).first() or TOTPDevice.objects.create(
            user=user, name="authenticator", confirmed=False
        )
    context = {
        **site.each_context(request),
        "title": "Two-factor sign-in",
        "device": device,
        "required": required_for(user),
        "form": form,
        "qr": mark_safe(qr_svg(pending.config_url)) if pending else "",  # noqa: S308 - qrcode's own SVG
        "secret": pending and _base32(pending.bin_key),
    }
    return TemplateResponse(request, "admin/console/two_factor.html", context)


def _base32(key: bytes) -> str:
    from base64 import b32encode

    return b32encode(key).decode().rstrip("=")
