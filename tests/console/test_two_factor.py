"""Two-factor sign-in (#21): a member enrols an authenticator from the console, and from then on
signs in with a real TOTP code (computed from the device's key, as the app would); a tenant that
requires it sends its members without one to enrol before any console page opens, and they cannot
turn it off. Each step is in the audit log."""

from __future__ import annotations

import pytest
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from sentinel.console.twofactor import WRONG_CODE
from tenants.models import AuditEntry

LOGIN, TWO_FACTOR, KEYS = "/admin/login/", "/admin/two-factor/", "/admin/tenants/virtualkey/"


@pytest.fixture(autouse=True)
def no_backoff(settings):
    """django-otp makes a device wait 1 s, doubling, after each wrong code (shown in the last test);
    these tests try wrong codes and right ones in a row, and never sleep."""
    settings.OTP_TOTP_THROTTLE_FACTOR = 0


def code(device: TOTPDevice, steps_ahead: int = 0) -> str:
    """The code an authenticator app shows for the device, now or `steps_ahead` periods on (django-otp
    accepts one period of drift; a code used once is refused after)."""
    value = totp(device.bin_key, device.step, device.t0 - steps_ahead * device.step, device.digits)
    return f"{value:0{device.digits}d}"


def sign_in(user, password: str, token: str | None = None) -> tuple[Client, object]:
    web = Client()
    data = {"username": user.username, "password": password}
    if token is not None:
        data["otp_token"] = token
    return web, web.post(LOGIN, data)


def enrol(web: Client) -> TOTPDevice:
    page = web.get(TWO_FACTOR)
    assert page.status_code == 200 and page.context["device"] is None
    device = TOTPDevice.objects.get(user=page.wsgi_request.user, confirmed=False)
    assert page.context["secret"] and "<svg" in page.context["qr"]  # what the app scans
    assert web.post(TWO_FACTOR, {"token": "000000" if code(device) != "000000" else "111111"}).status_code == 200
    assert not TOTPDevice.objects.filter(pk=device.pk, confirmed=True).exists()  # a wrong code enrols nothing
    done = web.post(TWO_FACTOR, {"token": code(device)})
    assert done.status_code == 302
    device.refresh_from_db()
    assert device.confirmed
    return device


def actions(user, since: int) -> list[tuple[str, str]]:
    rows = AuditEntry.objects.filter(target=f"user {user.username}", pk__gt=since).order_by("pk")
    return [(row.action, row.detail) for row in rows]


def test_an_enrolled_member_signs_in_only_with_the_current_code(tenancy):
    t = tenancy
    start = AuditEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    web, response = sign_in(t.viewer, t.password)
    assert response.status_code == 302
    device = enrol(web)

    for token in (None, "12345", code(device)):  # no code, a wrong one, the one enrolment used already
        other, refused = sign_in(t.viewer, t.password, token)
        assert refused.status_code == 200 and WRONG_CODE in refused.context["form"].non_field_errors()
        assert other.get(KEYS).status_code == 302  # not signed in
    web, response = sign_in(t.viewer, t.password, code(device, steps_ahead=1))
    assert response.status_code == 302
    assert web.get(KEYS).status_code == 200
    unverified = Client()
    unverified.force_login(t.viewer)  # a session signed in without the code
    assert unverified.get(KEYS).status_code == 302  # opens no console page

    entries = actions(t.viewer, start)
    assert entries[:2] == [("login.succeeded", ""), ("twofactor.enrolled", "")]
    assert entries[2:5] == [("login.failed", "missing or wrong one-time code")] * 3
    assert entries[5] == ("login.succeeded", "with a one-time code")


def test_a_tenant_that_requires_it_sends_members_to_enrol_and_keeps_it_on(tenancy):
    t = tenancy
    session = Client()
    session.force_login(t.owner)
    assert session.get(KEYS).status_code == 200
    t.tenant.require_two_factor = True
    t.tenant.save()
    assert session.get(KEYS).status_code == 302  # an existing session without a code: out
    assert session.get(LOGIN)["Location"] == TWO_FACTOR  # and sent to enrol
    assert "requires two-factor sign-in" in session.get(TWO_FACTOR).content.decode()
    # Someone in no requiring tenant is not touched.
    outsider = Client()
    outsider.force_login(t.outsider)
    assert outsider.get(KEYS).status_code == 200

    web, response = sign_in(t.owner, t.password)
    assert response.status_code == 302
    assert web.get(KEYS).status_code == 302
    device = enrol(web)
    assert web.get(KEYS).status_code == 200  # enrolling verified this session
    refused = web.post(TWO_FACTOR, {"token": code(device, steps_ahead=1)})
    assert refused.context["form"].non_field_errors() == [
        "Your tenant (or this installation) requires two-factor sign-in: it stays on."
    ]
    assert "so it stays on" in refused.content.decode()
    assert TOTPDevice.objects.filter(user=t.owner, confirmed=True).count() == 1


def test_a_member_not_required_to_may_turn_it_off_with_a_current_code(tenancy, settings):
    t = tenancy
    web, _ = sign_in(t.finance, t.password)
    device = enrol(web)
    start = AuditEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    assert web.post(TWO_FACTOR, {"token": code(device)}).status_code == 200  # used already: refused
    settings.OTP_TOTP_THROTTLE_FACTOR = 1  # django-otp's default backoff: after a wrong code...
    assert web.post(TWO_FACTOR, {"token": code(device, steps_ahead=1)}).status_code == 200  # ...even a right one waits
    assert TOTPDevice.objects.filter(user=t.finance).exists()
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    assert web.post(TWO_FACTOR, {"token": code(device, steps_ahead=1)}).status_code == 302
    assert not TOTPDevice.objects.filter(user=t.finance).exists()
    assert actions(t.finance, start) == [("twofactor.removed", "")]
    assert sign_in(t.finance, t.password)[1].status_code == 302  # a password alone again
