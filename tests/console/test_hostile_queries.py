"""Every list in the console takes its filters, search, ordering and page from the query string, which
anyone who can open the page controls. Each filter parameter of every list, and the shared ones, with
hostile values: never a server error (Django's test client raises the view's exception, so a 500 fails
here with its traceback), and what is not a valid value narrows to nothing or is ignored."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.admin.views.main import ORDER_VAR, PAGE_VAR, SEARCH_VAR
from django.test import Client, RequestFactory
from django.urls import reverse

from tests.console.conftest import as_user
from tests.sentinel.test_text import OUR_APPS

HOSTILE = [
    "9" * 5000,  # int() refuses over 4,300 digits
    "9" * 20,  # past bigint
    "-1",
    "\u0661",  # an Arabic-Indic one: isdigit() and int() take it
    "\u00b2",  # a superscript two: isdigit() takes it, int() refuses it
    "1\x00",
    "a\r\nb",
    "%",
    "2026-13-45",
    "x" * 20_000,
]


def _lists(request):
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label in OUR_APPS and model_admin.has_view_permission(request):
            name = f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist"
            yield model, model_admin, reverse(name)


def _parameters(model_admin, request) -> set[str]:
    """Every query parameter the list's filters read, from Django's own filter objects."""
    changelist = model_admin.get_changelist_instance(request)
    names = {name for spec in changelist.filter_specs for name in spec.expected_parameters()}
    return names | {SEARCH_VAR, ORDER_VAR, PAGE_VAR}


@pytest.mark.parametrize("value", HOSTILE, ids=lambda value: repr(value[:12]))
def test_no_list_filter_search_order_or_page_value_is_a_server_error(tenancy, value):
    root = as_user(tenancy.superuser)
    request = RequestFactory().get("/admin/")
    request.user = tenancy.superuser
    checked = 0
    for model, model_admin, url in _lists(request):
        request = RequestFactory().get(url)
        request.user = tenancy.superuser
        for name in sorted(_parameters(model_admin, request)):
            response = root.get(url, {name: value})
            # 200, or Django's redirect to the list with ?e=1 for lookups it cannot apply; NUL, which
            # nothing takes and PostgreSQL cannot compare, is a 400 before the view
            expected = {400} if "\x00" in value else {200, 302}
            assert response.status_code in expected, (model.__name__, name, response.status_code)
            checked += 1
    assert checked >= 60


def test_nul_in_a_query_string_name_or_value_is_a_400_before_the_view(tenancy):
    root = as_user(tenancy.superuser)
    for query in ({"q": "a\x00"}, {"role__exact\x00": "admin"}, {"q": ["ok", "\x00"]}):
        refused = root.get(reverse("admin:tenants_membership_changelist"), query)
        assert (refused.status_code, refused.content) == (400, b"NUL (U+0000) is not allowed in a query string."), query
    assert root.get(reverse("admin:tenants_membership_changelist"), {"q": "a"}).status_code == 200
    api = root.get("/api/v1/reports/spend", {"start": "2026-01-01", "end": "2026-01-01", "tenant": "a\x00"})
    assert (api.status_code, api.json()) == (400, {"tenant": ["NUL (U+0000) is not allowed in a query string."]})


PAGES = {
    "admin:dashboard": ["window", "tenant"],
    "admin:circuits": ["q", "tenant"],
    "admin:models": ["q", "tenant"],
    "admin:billing_spendreport_changelist": ["start", "end", "group_by", "tenant", "team", "format"],
    "admin:billing_spendreport_statement": ["tenant", "month", "format"],
    "admin:billing_ledgerentry_export": ["format", "tenant", "status_code__exact", "team"],
    "admin:screening_screeningreport_changelist": ["days"],
}


@pytest.mark.parametrize("value", [v for v in HOSTILE if "\x00" not in v], ids=lambda value: repr(value[:12]))
def test_no_console_page_parameter_value_is_a_server_error(tenancy, value):
    """The console's own pages (dashboard, circuits, models, the spend report, statements, the request
    log's export) with each of their parameters hostile, alone and beside a valid report query."""
    root = as_user(tenancy.superuser)
    report = {"start": "2026-12-01", "end": "2026-12-02", "group_by": "tenant"}
    for name, params in PAGES.items():
        for param in params:
            for query in ({param: value}, {**report, param: value}):
                response = root.get(reverse(name), query)
                assert response.status_code in (200, 302, 400, 404), (name, param, response.status_code)


def test_the_request_log_export_refuses_a_filter_the_list_does_not_have_and_exports_nothing(tenancy):
    from tenants.audit import AuditEntry

    root = as_user(tenancy.superuser)
    audited = AuditEntry.objects.count()
    refused = root.get(reverse("admin:billing_ledgerentry_export"), {"format": "csv", "start": "2026-12-01"})
    assert (refused.status_code, refused.content) == (400, b"Unknown or invalid filter in the query string.")
    assert AuditEntry.objects.count() == audited


@pytest.mark.parametrize("selected", ["abc", "9" * 5000, "\u0661", "1.0", "-1", ""], ids=repr)
def test_a_list_action_on_rows_that_are_not_ids_is_a_400_and_changes_nothing(tenancy, selected):
    """Every action of every console list (deletes, revocations, breakers forced, batches cancelled,
    cache entries invalidated, ...) posted with a selection that is not a row id."""
    from tenants.audit import AuditEntry
    from tenants.models import VirtualKey

    root = as_user(tenancy.superuser)
    request = RequestFactory().get("/admin/")
    request.user = tenancy.superuser
    keys, audited = VirtualKey.objects.filter(status="active").count(), AuditEntry.objects.count()
    checked = 0
    for model, model_admin, url in _lists(request):
        for action in model_admin.get_actions(request):
            response = root.post(url, {"action": action, "_selected_action": [selected], "index": "0"})
            assert (response.status_code, response.content) == (400, b"Selected rows are named by their ids."), (
                model.__name__,
                action,
            )
            checked += 1
    assert checked >= 20
    assert (VirtualKey.objects.filter(status="active").count(), AuditEntry.objects.count()) == (keys, audited)


CEREMONIES = [
    "/webauthn/registration/begin/",
    "/webauthn/registration/complete/",
    "/webauthn/authentication/begin/",
    "/webauthn/authentication/complete/",
]
HOSTILE_JSON = [b"{", b"9" * 5000, b"[NaN]", b'{"a": 1e999}', b"[" * 5000 + b"]" * 5000, b'{"id": "\\u0000"}', b"[]"]


@pytest.mark.parametrize("signed_in", [False, True], ids=["anonymous", "signed in"])
def test_the_security_key_ceremonies_refuse_hostile_json_without_a_server_error(tenancy, signed_in):
    """django-otp-webauthn's JSON views, reachable before sign-in: a body of 5,000 digits raised
    ValueError in them (a 500). Bodies Python's decoder cannot take as JSON are a 400 before the view;
    the rest are the library's to answer (a ceremony's begin reads no body), never with a 5xx."""
    client = as_user(tenancy.owner) if signed_in else Client()
    for url in CEREMONIES:
        for body in HOSTILE_JSON:
            response = client.post(url, body, content_type="application/json")
            assert response.status_code < 500, (url, body[:12], response.status_code)
        refused = client.post(url, b"9" * 5000, content_type="application/json")
        assert refused.status_code == 400
        assert refused.json()["detail"].startswith("The body is not JSON this page takes:")
