"""Security keys as the second factor (#21): a member registers a key on the two-factor page and signs
in with the password and then the key, answered by a software authenticator whose signatures the
server really verifies. Options are issued only at the right step; another member's key, a wrong
signature or an origin other than the installation's sign no one in; a key satisfies a tenant's
requirement, and with a code as well either one signs in. Each step is in the audit log."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client
from django_otp_webauthn.models import WebAuthnCredential

from sentinel.console.securitykeys import KEY_STEP, WRONG_KEY
from sentinel.console.twofactor import SIGN_IN_AGAIN, STAYS_ON
from tenants.models import AuditEntry
from tests.console.authenticator import SoftwareAuthenticator, b64url
from tests.console.test_two_factor import KEYS, TWO_FACTOR, actions, code, enrol, sign_in

REGISTER_BEGIN, REGISTER_COMPLETE = "/webauthn/registration/begin/", "/webauthn/registration/complete/"
ASSERT_BEGIN, ASSERT_COMPLETE = "/webauthn/authentication/begin/", "/webauthn/authentication/complete/"


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.OTP_TOTP_THROTTLE_FACTOR = 0


def last_audit_pk() -> int:
    return AuditEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def register(web: Client, authenticator: SoftwareAuthenticator) -> WebAuthnCredential:
    options = web.post(REGISTER_BEGIN)
    assert options.status_code == 200, options.content
    assert options.json()["rp"]["id"] == settings.OTP_WEBAUTHN_RP_ID == "localhost"
    done = web.post(
        REGISTER_COMPLETE, authenticator.register(options.json(), settings.WEBAUTHN_ORIGIN), "application/json"
    )
    assert done.status_code == 200, done.content
    return WebAuthnCredential.objects.get(pk=done.json()["id"])


def password_step(user, password: str) -> Client:
    """The sign-in form with the right password and no code, for someone with a key: the key step."""
    web, page = sign_in(user, password)
    assert page.status_code == 200 and page.context["form"].key_step
    assert "passkey-verification-button" in page.content.decode()
    assert web.get(KEYS).status_code == 302  # nobody signed in yet
    return web


def key_step(web: Client, authenticator: SoftwareAuthenticator, *, origin: str | None = None, credential_id=None):
    options = web.post(ASSERT_BEGIN)
    assert options.status_code == 200, options.content
    answer = authenticator.sign_assertion(
        options.json(), origin or settings.WEBAUTHN_ORIGIN, settings.OTP_WEBAUTHN_RP_ID, credential_id
    )
    return options.json(), web.post(ASSERT_COMPLETE, answer, "application/json")


def test_a_member_registers_a_key_and_signs_in_with_the_password_and_the_key(tenancy):
    t = tenancy
    start = last_audit_pk()
    web, _ = sign_in(t.viewer, t.password)
    authenticator = SoftwareAuthenticator()
    key = register(web, authenticator)
    assert key.user == t.viewer and key.confirmed and key.name == "Security key 1"
    page = web.get(TWO_FACTOR)
    assert [k.pk for k in page.context["keys"]] == [key.pk]
    assert "Security key 1" in page.content.decode()

    web = password_step(t.viewer, t.password)
    options, done = key_step(web, authenticator)
    assert [c["id"] for c in options["allowCredentials"]] == [authenticator_id(authenticator)]
    assert done.status_code == 200 and done.json()["redirect_url"] == "/admin/"
    assert web.get(KEYS).status_code == 200
    assert KEY_STEP not in web.session

    entries = actions(t.viewer, start)
    assert entries == [
        ("login.succeeded", ""),
        ("twofactor.enrolled", "security key Security key 1"),
        ("login.succeeded", "with a security key"),
    ]
    assert not any(authenticator_id(authenticator) in detail for _, detail in entries)  # no credential in the log


def authenticator_id(authenticator: SoftwareAuthenticator) -> str:
    return b64url(authenticator.credential_id)


def test_options_are_issued_only_at_the_right_step(tenancy):
    t = tenancy
    anonymous = Client()
    assert anonymous.post(REGISTER_BEGIN).status_code == 403
    assert anonymous.post(ASSERT_BEGIN).status_code == 403  # no passwordless sign-in
    assert anonymous.post(ASSERT_COMPLETE, {}, "application/json").status_code == 403

    web, _ = sign_in(t.viewer, t.password)
    authenticator = SoftwareAuthenticator()
    register(web, authenticator)
    wrong, page = sign_in(t.viewer, "not the password")
    assert page.status_code == 200 and not page.context["form"].key_step
    assert wrong.post(ASSERT_BEGIN).status_code == 403  # a wrong password starts no key step

    unverified = Client()
    unverified.force_login(t.viewer)  # a session that did not use the key
    refused = unverified.post(REGISTER_BEGIN)
    assert refused.status_code == 403 and refused.json()["code"] == "user_not_verified"
    assert unverified.get(KEYS).status_code == 302
    assert unverified.post(ASSERT_BEGIN).status_code == 403  # signed in is not the key step
    page = unverified.get(TWO_FACTOR)
    assert not page.context["proven"] and "passkey-register-button" not in page.content.decode()
    assert WebAuthnCredential.objects.filter(user=t.viewer).count() == 1

    # A staff-less account is no console user: no key for it.
    t.finance.is_staff = False
    t.finance.save()
    other = Client()
    other.force_login(t.finance)
    assert other.post(REGISTER_BEGIN).status_code == 403
    assert not WebAuthnCredential.objects.filter(user=t.finance).exists()


def test_another_members_key_neither_signs_in_nor_is_removed(tenancy):
    t = tenancy
    mine, theirs = SoftwareAuthenticator(), SoftwareAuthenticator()
    web_owner, _ = sign_in(t.owner, t.password)
    register(web_owner, mine)
    web_outsider, _ = sign_in(t.outsider, t.password)
    outsiders_key = register(web_outsider, theirs)
    start = last_audit_pk()

    web = password_step(t.owner, t.password)
    _, refused = key_step(web, theirs)  # the outsider's key, rightly signed, in the owner's sign-in
    assert refused.status_code == 403 and refused.json()["code"] == "credential_user_mismatch"
    assert web.get(KEYS).status_code == 302
    assert web.post(ASSERT_BEGIN).status_code == 403  # the step is over: the password again
    assert actions(t.owner, start) == [("login.failed", WRONG_KEY)]
    outsiders_key.refresh_from_db()
    assert outsiders_key.sign_count == 0  # its signature was never even checked: not a use
    assert outsiders_key.last_used_at is None

    # The owner's own session cannot remove the outsider's key (not found), and their own stays.
    assert web_owner.post(TWO_FACTOR, {"remove_key": str(outsiders_key.pk)}).status_code == 404
    assert WebAuthnCredential.objects.filter(pk=outsiders_key.pk).exists()
    assert WebAuthnCredential.objects.filter(user=t.owner).count() == 1


def test_a_wrong_signature_another_origin_or_a_replay_is_refused(tenancy):
    t = tenancy
    authenticator = SoftwareAuthenticator()
    web, _ = sign_in(t.finance, t.password)
    key = register(web, authenticator)
    start = last_audit_pk()

    impostor = SoftwareAuthenticator()  # its own key pair, claiming the finance member's credential
    web = password_step(t.finance, t.password)
    _, refused = key_step(web, impostor, credential_id=authenticator.credential_id)
    assert refused.status_code == 422
    assert web.get(KEYS).status_code == 302

    web = password_step(t.finance, t.password)
    _, refused = key_step(web, authenticator, origin="http://testserver")  # the Host this client sends
    assert refused.status_code == 422
    assert web.get(KEYS).status_code == 302

    assert actions(t.finance, start) == [("login.failed", WRONG_KEY)] * 2
    key.refresh_from_db()
    assert key.last_used_at is None

    web = password_step(t.finance, t.password)
    options = web.post(ASSERT_BEGIN).json()
    answer = authenticator.sign_assertion(options, settings.WEBAUTHN_ORIGIN, settings.OTP_WEBAUTHN_RP_ID)
    assert web.post(ASSERT_COMPLETE, answer, "application/json").status_code == 200  # the key itself signs in
    assert web.get(KEYS).status_code == 200

    replay = password_step(t.finance, t.password)  # the same answer again, against a fresh challenge
    assert replay.post(ASSERT_BEGIN).status_code == 200
    assert replay.post(ASSERT_COMPLETE, answer, "application/json").status_code == 422
    assert replay.get(KEYS).status_code == 302


def test_a_key_satisfies_the_tenants_requirement_and_with_a_code_either_signs_in(tenancy):
    t = tenancy
    t.tenant.require_two_factor = True
    t.tenant.save()
    web, _ = sign_in(t.owner, t.password)
    assert web.get(KEYS).status_code == 302  # required, nothing enrolled: sent to enrol
    assert "requires two-factor sign-in" in web.get(TWO_FACTOR).content.decode()
    authenticator = SoftwareAuthenticator()
    key = register(web, authenticator)
    assert web.get(KEYS).status_code == 200  # registering verified this session

    # The only second factor stays while it is required.
    start = last_audit_pk()
    refused = web.post(TWO_FACTOR, {"remove_key": str(key.pk)}, follow=True)
    assert STAYS_ON in refused.content.decode()
    assert WebAuthnCredential.objects.filter(pk=key.pk).exists()

    # An authenticator app as well: either one signs in.
    device = enrol(web)
    _, by_code = sign_in(t.owner, t.password, code(device, steps_ahead=1))
    assert by_code.status_code == 302
    web = password_step(t.owner, t.password)
    assert key_step(web, authenticator)[1].status_code == 200
    assert web.get(KEYS).status_code == 200
    _, wrong_code = sign_in(t.owner, t.password, "000000" if code(device) != "000000" else "111111")
    assert wrong_code.status_code == 200 and not wrong_code.context["form"].key_step  # a code given is checked

    # With the app left, the key may go.
    removed = web.post(TWO_FACTOR, {"remove_key": str(key.pk)})
    assert removed.status_code == 302
    assert not WebAuthnCredential.objects.filter(pk=key.pk).exists()
    assert ("twofactor.removed", "security key Security key 1") in actions(t.owner, start)


def test_a_session_that_did_not_use_its_key_changes_no_second_factor(tenancy):
    t = tenancy
    web, _ = sign_in(t.viewer, t.password)
    key = register(web, SoftwareAuthenticator())
    unverified = Client()
    unverified.force_login(t.viewer)
    start = last_audit_pk()
    page = unverified.post(TWO_FACTOR, {"remove_key": str(key.pk)}, follow=True)
    assert SIGN_IN_AGAIN in page.content.decode()
    assert WebAuthnCredential.objects.filter(pk=key.pk).exists()
    refused = unverified.post(TWO_FACTOR, {"token": "123456"})  # nor enrols an app (which would verify it)
    assert SIGN_IN_AGAIN in refused.context["form"].non_field_errors()
    assert actions(t.viewer, start) == []
    web.post(TWO_FACTOR, {"remove_key": str(key.pk)})
    assert not WebAuthnCredential.objects.filter(pk=key.pk).exists()
    assert sign_in(t.viewer, t.password)[1].status_code == 302  # a password alone again
