"""Two-factor sign-in to the console with django-otp: TOTP devices (an authenticator app) and
security keys or passkeys (WebAuthn, sentinel.console.securitykeys); either one satisfies a
requirement, and someone with both may use either.

Who needs it: anyone who enrolled, every password account when the operator requires it
(SENTINEL_REQUIRE_TWO_FACTOR), and the members of a tenant that requires it. The sign-in form asks
for the password and the one-time code together, or, for someone with a key who gives no code, takes
the password and then asks for the key on the same page; a session signed in without a second factor
(or from before one was required) opens no console page until it has one: someone required to and
not yet enrolled is sent to enrol first. Single sign-on sessions are exempt (their provider checks).
"""

from __future__ import annotations

from io import BytesIO

import qrcode
import qrcode.image.svg
from django import forms
from django.contrib import messages
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.safestring import mark_safe
from django_otp import login as otp_login
from django_otp.plugins.otp_totp.models import TOTPDevice
from unfold.forms import AuthenticationForm
from unfold.widgets import BASE_INPUT_CLASSES

from sentinel.console.factors import has_second_factor, required_for
from sentinel.console.securitykeys import key_remove, key_step_start, keys_of
from tenants.audit import audit_record_for_user
from tenants.models import AuditEntry

WRONG_CODE = "That one-time code is wrong or used already. Enter the current code from your authenticator app."
STAYS_ON = "Your tenant (or this installation) requires two-factor sign-in: it stays on."
SIGN_IN_AGAIN = "Sign in again with your code or security key first: this session did not use one."


def device_of(user) -> TOTPDevice | None:
    """The user's enrolled authenticator (confirmed), if any."""
    return TOTPDevice.objects.filter(user=user, confirmed=True).first()


class ConsoleAuthenticationForm(AuthenticationForm):
    """Unfold's sign-in form with a one-time code, checked after the password for anyone enrolled. For
    someone with a security key who gave no code, a right password starts the key step instead
    (sentinel.console.securitykeys): the form is shown again, asking for the key, and nobody is
    signed in until the key answers."""

    key_step = False

    otp_token = forms.CharField(
        label="One-time code",
        required=False,
        max_length=8,
        help_text="From your authenticator app, if you enrolled one; left empty, your security key is asked for.",
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "inputmode": "numeric", "class": " ".join(BASE_INPUT_CLASSES)}
        ),
    )

    def clean(self):
        data = super().clean()  # the password (and the brute-force guard) first
        user = self.get_user()
        if user is None or not has_second_factor(user):
            return data
        device = device_of(user)
        token = (data.get("otp_token") or "").strip()
        if not token and keys_of(user).exists():
            key_step_start(self.request, user)
            self.key_step = True
            raise forms.ValidationError("Now confirm with your security key.", code="security_key")
        allowed, _ = device.verify_is_allowed() if device is not None else (False, None)  # backs off after failures
        if not (allowed and token and device is not None and device.verify_token(token)):
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
    code); register security keys (sentinel.console.securitykeys) or remove one. Nothing is removed
    that would leave no second factor while one is required, and a session that did not use the
    second factor its account has changes none. Open to every signed-in console user, also before
    their session passes console_allows: those required to enrol land here."""
    user = request.user
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return redirect(f"{reverse('admin:login')}?next={request.path}")
    device = device_of(user)
    keys = list(keys_of(user))
    proven = user.is_verified() or not has_second_factor(user)
    if request.method == "POST" and "remove_key" in request.POST:
        return _remove_key(request, device, keys, proven)
    form = CodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        token = form.cleaned_data["token"].strip()
        if not proven:
            form.add_error(None, SIGN_IN_AGAIN)
        elif device is None:
            pending = TOTPDevice.objects.filter(user=user, confirmed=False).first()
            if pending is not None and pending.verify_token(token):
                TOTPDevice.objects.filter(pk=pending.pk).update(confirmed=True)
                pending.confirmed = True
                if not user.is_verified():
                    otp_login(request, pending)
                audit_record_for_user(user=user, action=AuditEntry.Action.TWO_FACTOR_ENROLLED, request=request)
                messages.success(request, "Two-factor sign-in is on: each sign-in now asks for a code.")
                return HttpResponseRedirect(reverse("admin:two_factor"))
            form.add_error("token", WRONG_CODE)
        elif required_for(user) and not keys:
            form.add_error(None, STAYS_ON)
        elif device.verify_is_allowed()[0] and device.verify_token(token):
            TOTPDevice.objects.filter(user=user).delete()
            audit_record_for_user(user=user, action=AuditEntry.Action.TWO_FACTOR_REMOVED, request=request)
            messages.success(request, "The authenticator app is removed." if keys else "Two-factor sign-in is off.")
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
        "keys": keys,
        "proven": proven,
        "required": required_for(user),
        "form": form,
        "qr": mark_safe(qr_svg(pending.config_url)) if pending else "",  # noqa: S308 - qrcode's own SVG
        "secret": pending and _base32(pending.bin_key),
    }
    return TemplateResponse(request, "admin/console/two_factor.html", context)


def _remove_key(request, device, keys, proven: bool) -> HttpResponse:
    """One of the user's own keys: another user's key id is not found."""
    user = request.user
    try:
        key_id = int(request.POST["remove_key"])
    except ValueError:
        raise Http404 from None
    key = next((key for key in keys if key.pk == key_id), None)
    if key is None:
        raise Http404
    if not proven:
        messages.error(request, SIGN_IN_AGAIN)
    elif required_for(user) and device is None and len(keys) == 1:
        messages.error(request, STAYS_ON)
    else:
        key_remove(request=request, key=key)
        messages.success(request, "Security key removed.")
    return HttpResponseRedirect(reverse("admin:two_factor"))


def _base32(key: bytes) -> str:
    from base64 import b32encode

    return b32encode(key).decode().rstrip("=")
