"""One rule for the text Sentinel stores or keys on (sentinel.text): names refuse control characters,
free text refuses NUL, JSON is bounded; in every console form (each a clear error on its field) and
in the management API's parameters (a 400 naming the parameter)."""

from __future__ import annotations

import pytest
from django import forms
from django.contrib import admin
from django.contrib.postgres.forms import SimpleArrayField
from django.test import RequestFactory

from gateway.models import Provider
from sentinel.text import (
    MAX_JSON_DEPTH,
    control_character,
    json_problem,
    no_control_characters,
    no_control_characters_but_line_breaks,
    storable_json,
)
from tenants.models import Tenant, VirtualKey
from tests.conftest import unique
from tests.console.conftest import as_user

OUR_APPS = {"tenants", "gateway", "billing"}


@pytest.mark.parametrize(
    ("text", "multiline", "found"),
    [
        ("plain name-1.ok", False, None),
        ("naïve café ✓ 日本", False, None),
        ("a\u0000", False, "U+0000"),
        ("a\tb", False, "U+0009"),
        ("a\nb", False, "U+000A"),
        ("a\u007f", False, "U+007F"),
        ("a\u0085", False, "U+0085"),  # C1: next line
        ("a\u009f", False, "U+009F"),
        ("a\u00a0", False, None),  # no-break space is text
        ("a\tb\r\nc", True, None),
        ("a\u0000", True, "U+0000"),
        ("a\u001b[31m", True, "U+001B"),
    ],
)
def test_control_characters(text, multiline, found):
    assert control_character(text, multiline=multiline) == found


def test_json_problems_name_where_they_are():
    assert json_problem({"a": [{"b": "ok"}, {"c": "x\u0000"}]}).path == "a[1].c"
    assert json_problem({"a": {"k\u0000": 1}}).path == "a"
    deep: dict = {}
    for _ in range(MAX_JSON_DEPTH - 1):  # with the innermost {}: MAX_JSON_DEPTH levels
        deep = {"d": deep}
    assert json_problem(deep) is None
    problem = json_problem({"outer": deep})
    assert (problem.path, problem.code) == ("outer", "nesting_too_deep")
    assert json_problem("tab\tand\nnewline") is None


# --- the console ---------------------------------------------------------------------------------


def _expected(field) -> object | None:
    if isinstance(field, SimpleArrayField):
        return _expected(field.base_field)
    if isinstance(field, forms.JSONField):
        return storable_json
    if isinstance(field, forms.CharField):
        return (
            no_control_characters_but_line_breaks if isinstance(field.widget, forms.Textarea) else no_control_characters
        )
    return None


def _forms(request):
    for model, model_admin in admin.site._registry.items():
        editable = model_admin.has_add_permission(request) or model_admin.has_change_permission(request)
        if model._meta.app_label not in OUR_APPS or not editable:
            continue  # the report pages show no form of their model
        yield f"{model.__name__} admin", model_admin.get_form(request, None)
        for inline in model_admin.get_inline_instances(request):
            yield f"{model.__name__} inline {inline.model.__name__}", inline.get_formset(request, None).form


def test_every_text_field_of_every_console_form_refuses_control_characters(tenancy):
    request = RequestFactory().get("/admin/")
    request.user = tenancy.superuser
    checked = 0
    for name, form_class in _forms(request):
        for field_name, field in form_class().fields.items():
            expected = _expected(field)
            if expected is None:
                continue
            target = field.base_field if isinstance(field, SimpleArrayField) else field
            assert expected in target.validators, f"{name}: {field_name}"
            checked += 1
    assert checked >= 20  # names, slugs, URLs, secrets, JSON, allowlists of every admin (26 today)


def test_a_key_name_with_an_escape_is_a_form_error_and_nothing_is_created(tenancy):
    owner = as_user(tenancy.owner)
    name = unique("key") + "\u001b[2J"
    page = owner.post("/admin/tenants/virtualkey/add/", {"tenant": tenancy.tenant.pk, "name": name})
    assert page.status_code == 200
    assert page.context["adminform"].form.errors["name"] == ["Control characters are not allowed (U+001B found)."]
    assert not VirtualKey.objects.filter(name=name).exists()


def test_a_tenant_name_with_a_line_break_is_a_form_error(tenancy):
    root = as_user(tenancy.superuser)
    data = {
        "name": "Acme\r\nInc",
        "slug": unique("acme"),
        "status": "active",
        "redis_outage": "open",
        "memberships-TOTAL_FORMS": "0",
        "memberships-INITIAL_FORMS": "0",
    }
    page = root.post("/admin/tenants/tenant/add/", data)
    assert page.status_code == 200
    assert page.context["adminform"].form.errors["name"] == ["Control characters are not allowed (U+000D found)."]
    assert not Tenant.objects.filter(slug=data["slug"]).exists()


def test_provider_settings_json_refuses_nul_and_deep_nesting(tenancy):
    request = RequestFactory().post("/admin/")
    request.user = tenancy.superuser
    form_class = admin.site._registry[Provider].get_form(request, None)
    base = {"name": unique("prov"), "kind": "openai", "timeout_seconds": "30", "first_token_timeout_seconds": "10"}
    nul = form_class(data={**base, "litellm_params": '{"organization": "acme\\u0000"}'})
    assert not nul.is_valid()
    assert nul.errors["litellm_params"] == ["NUL characters (U+0000) cannot be stored; remove them. (at organization)"]
    deep = form_class(data={**base, "litellm_params": "[" * 100 + "]" * 100})
    assert not deep.is_valid()
    assert "at most 64 levels" in deep.errors["litellm_params"][0]
    assert not Provider.objects.filter(name=base["name"]).exists()


# --- the management API ----------------------------------------------------------------------------


@pytest.mark.parametrize(("param", "value"), [("model", "gpt\u0007"), ("provider", "p\r\nx"), ("model", "m\u0000")])
def test_management_api_parameters_refuse_control_characters(tenancy, param, value):
    response = as_user(tenancy.owner).get(f"/api/v1/tenants/{tenancy.tenant.slug}/requests", {param: value})
    assert response.status_code == 400
    assert list(response.json()) == [param]


HOSTILE_FORM_VALUES = ["9" * 5000, "1e999999", "NaN", "-Infinity", "\u0661\u0662", "\u00b2", "99999-12-31", "1" * 200]


def test_no_console_form_field_raises_on_hostile_values(tenancy):
    """Every field of every console form (admins' and inlines'), given numbers past any column, ones
    int() refuses, NaN and infinities, other scripts' digits, a superscript, a year past 9999: the form
    says it is invalid or cleans it; nothing raises (a raise is a 500 on the page)."""
    request = RequestFactory().post("/admin/")
    request.user = tenancy.superuser
    checked = json_fields = 0
    for name, form_class in _forms(request):
        for field_name, field in form_class().fields.items():
            for value in HOSTILE_FORM_VALUES:
                try:
                    field.clean(value)
                except forms.ValidationError:
                    pass
                except Exception as exc:  # noqa: BLE001 - what the test is looking for
                    pytest.fail(f"{name}.{field_name} raised {type(exc).__name__} on {value[:20]!r}: {exc}")
                checked += 1
            if isinstance(field, forms.JSONField):
                # Stored, these would fail the save: jsonb takes no NaN or Infinity.
                for value in ("NaN", '{"rpm": Infinity}', "[1e999999]", "9" * 5000):
                    with pytest.raises(forms.ValidationError):
                        field.clean(value)
                json_fields += 1
    assert checked >= 200
    assert json_fields >= 1  # the provider's litellm_params today
