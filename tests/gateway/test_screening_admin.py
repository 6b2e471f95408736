"""Screening in the admin: the report counts decisions and outages per tenant and check (each admin
sees their own tenants only), and a policy saved in the admin keeps the guardrail secret encrypted."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.test import Client
from django.utils import timezone

from billing.models import LedgerEntry
from gateway.screening.models import ScreeningPolicy

REPORT = "/admin/screening/screeningreport/"


def as_user(user) -> Client:
    web = Client()
    web.force_login(user)
    return web


def ledger_row(tenant, screening, *, days_ago: int = 0) -> None:
    LedgerEntry.objects.create(
        request_id="req_" + uuid.uuid4().hex,
        created_at=timezone.now() - timedelta(days=days_ago),
        tenant=tenant,
        model_requested="m",
        status_code=400,
        screening=screening,
    )


def test_the_report_counts_per_tenant_and_check_and_keeps_tenants_apart(tenancy):
    a, b = tenancy.tenant, tenancy.other
    for _ in range(3):
        ledger_row(a, {"in": ["email"], "fired": [["email", "in", "block"]]})
    ledger_row(a, {"in": ["email", "moderation"], "fired": [["email", "in", "redact"], ["moderation", "out", "log"]]})
    ledger_row(a, {"in": ["moderation"], "outages": [["moderation", "in", "closed"]]})
    ledger_row(a, {"in": ["email"], "fired": [["email", "in", "block"]]}, days_ago=20)  # outside 7 days
    ledger_row(a, None)
    ledger_row(b, {"in": ["secret"], "fired": [["secret", "in", "block"]]})

    page = as_user(tenancy.owner).get(REPORT)
    assert page.status_code == 200
    decisions = {
        (r["tenant"], r["check"], r["direction"], r["action"]): r["requests"] for r in page.context["decisions"]
    }
    assert decisions == {
        (a.slug, "email", "in", "block"): 3,
        (a.slug, "email", "in", "redact"): 1,
        (a.slug, "moderation", "out", "log"): 1,
    }
    outages = [(r["tenant"], r["check"], r["outcome"], r["requests"]) for r in page.context["outages"]]
    assert outages == [(a.slug, "moderation", "closed", 1)]
    assert b.slug not in page.content.decode()

    month = as_user(tenancy.owner).get(REPORT, {"days": 30})
    assert {(r["check"], r["action"]): r["requests"] for r in month.context["decisions"]}[("email", "block")] == 4

    everyone = as_user(tenancy.superuser).get(REPORT)
    assert (b.slug, "secret", "in", "block") in {
        (r["tenant"], r["check"], r["direction"], r["action"]) for r in everyone.context["decisions"]
    }


def test_viewers_and_finance_do_not_see_the_report(tenancy):
    assert as_user(tenancy.viewer).get(REPORT).status_code == 403
    assert as_user(tenancy.finance).get(REPORT).status_code == 403


def policy_form(tenant, guardrail_url: str = "") -> dict:
    """The admin's screening policy form, filled in (test_guardrail saves it with a guardrail URL)."""
    return {
        "tenant": tenant.pk,
        "enabled": "on",
        **dict.fromkeys(("email", "phone", "iban", "output_personal_data"), "redact"),
        **dict.fromkeys(
            ("payment_card", "national_id", "secret", "injection", "moderation", "output_moderation"), "block"
        ),
        "ip_address": "log",
        "phone_region": "US",
        "stream_window": 64,
        "moderation_model": "omni-moderation-latest",
        "moderation_timeout_ms": 2000,
        "moderation_input_outage": "closed",
        "moderation_output_outage": "open",
        "guardrail_url": guardrail_url,
        "guardrail_timeout_ms": 300,
        "guardrail_outage": "closed",
    }


def test_a_tenant_admin_sets_their_own_tenants_policy_only(tenancy):
    web = as_user(tenancy.owner)
    refused = web.post("/admin/screening/screeningpolicy/add/", policy_form(tenancy.other))
    assert refused.status_code == 200 and "tenant" in refused.context["adminform"].form.errors
    assert not ScreeningPolicy.objects.filter(tenant=tenancy.other).exists()
    page = web.get("/admin/screening/screeningpolicy/add/")
    assert 'name="moderation_provider"' not in page.content.decode()  # providers are for operators to pick
    assert web.post("/admin/screening/screeningpolicy/add/", policy_form(tenancy.tenant)).status_code == 302
    assert ScreeningPolicy.objects.get(tenant=tenancy.tenant).payment_card == "block"
    assert as_user(tenancy.viewer).get("/admin/screening/screeningpolicy/").status_code == 403


def test_a_policy_saved_in_the_admin_keeps_its_guardrail_secret_encrypted(tenancy):
    web = as_user(tenancy.superuser)
    form = {
        "tenant": tenancy.tenant.pk,
        "enabled": "on",
        **dict.fromkeys(("email", "phone", "iban", "output_personal_data"), "redact"),
        **dict.fromkeys(
            ("payment_card", "national_id", "secret", "injection", "moderation", "output_moderation"), "block"
        ),
        "ip_address": "log",
        "phone_region": "gb",
        "stream_window": 64,
        "moderation_model": "omni-moderation-latest",
        "moderation_timeout_ms": 2000,
        "moderation_input_outage": "closed",
        "moderation_output_outage": "open",
        "guardrail_url": "https://guard.example.com/check",
        "guardrail_secret": "s3cret-signing-key",
        "guardrail_timeout_ms": 300,
        "guardrail_outage": "closed",
    }
    response = web.post("/admin/screening/screeningpolicy/add/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    policy = ScreeningPolicy.objects.get(tenant=tenancy.tenant)
    assert policy.phone_region == "GB"
    assert b"s3cret-signing-key" not in bytes(policy.guardrail_secret_encrypted)
    assert policy.guardrail_secret() == "s3cret-signing-key"
    page = web.get(f"/admin/screening/screeningpolicy/{policy.pk}/change/").content.decode()
    assert "s3cret-signing-key" not in page

    bad = web.post("/admin/screening/screeningpolicy/add/", {**form, "tenant": tenancy.other.pk, "phone_region": "XX"})
    assert bad.status_code == 200 and "phone_region" in bad.context["adminform"].form.errors
    assert not ScreeningPolicy.objects.filter(tenant=tenancy.other).exists()
