"""Keys and members in the console: a secret appears once, on the page answering the POST that made
it, and nowhere after; rotation from the key's page; tenant admins add the people of their own
tenants by exact username, and hear nothing about other accounts."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.urls import reverse

from tenants.models import Membership, VirtualKey
from tenants.services import key_create, key_digest, membership_save
from tests.conftest import unique
from tests.console.conftest import as_user

KEYS = "/admin/tenants/virtualkey/"


def test_a_new_keys_secret_is_revealed_once_after_a_redirect(tenancy):
    """Post/redirect/get: the POST makes the key and redirects; the reveal page shows the secret the
    first time only. Reloading it shows no secret and makes no second key (reloading a POST answer
    did: two active keys)."""
    owner = as_user(tenancy.owner)
    name = unique("console-key")
    made = owner.post(f"{KEYS}add/", {"tenant": tenancy.tenant.pk, "name": name, "requests_per_minute": "60"})

    key = VirtualKey.objects.get(name=name)
    assert made.status_code == 303
    assert made["Location"].startswith(f"{KEYS}{key.pk}/reveal/")
    page = owner.get(made["Location"])
    secret = page.context["secret"]
    assert (key.tenant, key.digest, key.requests_per_minute, key.created_by) == (
        tenancy.tenant,
        key_digest(secret),
        60,
        tenancy.owner,
    )
    assert "no-store" in page["Cache-Control"]
    assert page.content.decode().count(secret) == 1
    session_text = str(dict(owner.session.items()))
    assert secret not in session_text

    reload = owner.get(made["Location"])
    assert reload.status_code == 200 and reload.context["secret"] is None
    assert "shown once already" in reload.content.decode() and secret not in reload.content.decode()
    assert VirtualKey.objects.filter(name=name).count() == 1
    # Another person's session never holds the handle.
    assert as_user(tenancy.superuser).get(made["Location"]).context["secret"] is None
    for later in (f"{KEYS}{key.pk}/change/", KEYS, "/admin/", f"{KEYS}{key.pk}/history/"):
        assert secret not in owner.get(later).content.decode(), later


def test_rotating_from_the_console_shows_the_successors_secret_once(tenancy, settings):
    settings.KEY_ROTATION_GRACE_SECONDS = 3600
    key, _ = key_create(tenant=tenancy.tenant, name=unique("rotated"))
    owner = as_user(tenancy.owner)
    rotate = reverse("admin:tenants_virtualkey_rotate", args=[key.pk])

    confirm = owner.get(rotate)
    assert confirm.status_code == 200 and "1 hour" in confirm.content.decode()
    assert VirtualKey.objects.filter(name=key.name).count() == 1  # a GET changes nothing

    redirect = owner.post(rotate)
    assert redirect.status_code == 303
    page = owner.get(redirect["Location"])
    assert page.status_code == 200 and "no-store" in page["Cache-Control"]
    key.refresh_from_db()
    new = key.successor
    assert new.digest == key_digest(page.context["secret"])
    assert key.state == "rotated"
    assert "rotated (works until" in owner.get(f"{KEYS}{key.pk}/change/").content.decode()
    assert page.context["secret"] not in owner.get(f"{KEYS}{new.pk}/change/").content.decode()
    # Rotated once: its page offers no second rotation, and a POST is refused with a message.
    again = owner.post(rotate, follow=True)
    assert "rotated already" in again.content.decode()
    assert VirtualKey.objects.filter(name=key.name).count() == 2


NOT_ADDABLE = "No account you may add has this username. An operator adds people new to your tenants."


def filled(form, prefix_data: dict | None = None) -> dict:
    """POST data that submits `form` (an admin form or formset form) as the page shows it."""
    data = dict(prefix_data or {})
    for field in form:
        if field.field.disabled:
            continue
        value = field.field.prepare_value(field.value())
        if isinstance(value, bool) or field.widget_type == "checkbox":
            if value:
                data[field.html_name] = "on"
        elif value is not None:
            data[field.html_name] = value
    return data


def tenant_page_post(client, tenant, username: str, role: str = "viewer"):
    """Saves the tenant's page with one new member row, as a browser would."""
    url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
    page = client.get(url)
    data = filled(page.context["adminform"].form)
    (inline,) = page.context["inline_admin_formsets"]
    formset = inline.formset
    for form in formset.forms:
        data = filled(form, data)
    prefix = formset.prefix
    new = len(formset.forms)
    data.update(
        {
            f"{prefix}-TOTAL_FORMS": str(new + 1),
            f"{prefix}-INITIAL_FORMS": str(formset.initial_form_count()),
            f"{prefix}-MIN_NUM_FORMS": "0",
            f"{prefix}-MAX_NUM_FORMS": "1000",
            f"{prefix}-{new}-username": username,
            f"{prefix}-{new}-role": role,
        }
    )
    return client.post(url, data)


def test_adding_a_member_never_tells_whether_an_unrelated_account_exists(tenancy, make_tenant):
    """A tenant admin may add the people of their own tenants; for any other name, an account that
    exists elsewhere, one that is inactive, or none at all, the answer is the same and nothing is
    added. Operators add anyone (someone new to every tenant included)."""
    User = get_user_model()
    newcomer = User.objects.create_user(unique("newcomer"), password="x")
    retired = User.objects.create_user(unique("retired"), password="x", is_active=False)
    owner = as_user(tenancy.owner)
    add = "/admin/tenants/membership/add/"

    for name in (newcomer.username, retired.username, tenancy.outsider.username, unique("no-such-account")):
        refused = owner.post(add, {"tenant": tenancy.tenant.pk, "username": name, "role": "viewer"})
        assert refused.status_code == 200
        assert refused.context["adminform"].form.errors == {"username": [NOT_ADDABLE]}, name
        via_tenant_page = tenant_page_post(owner, tenancy.tenant, name)
        (inline,) = via_tenant_page.context["inline_admin_formsets"]
        assert inline.formset.forms[-1].errors == {"username": [NOT_ADDABLE]}, name
    assert not Membership.objects.filter(tenant=tenancy.tenant, user__in=[newcomer, retired, tenancy.outsider]).exists()
    assert not Membership.objects.filter(user=newcomer).exists()

    # Someone from another of the owner's tenants: shown to them already, so theirs to add.
    elsewhere = make_tenant(name="Tenant C")
    colleague = User.objects.create_user(unique("colleague"), password="x")
    membership_save(tenant=elsewhere, user=tenancy.owner, role="viewer")
    membership_save(tenant=elsewhere, user=colleague, role="finance")
    done = owner.post(add, {"tenant": tenancy.tenant.pk, "username": colleague.username, "role": "finance"})
    assert done.status_code == 302
    assert Membership.objects.get(user=colleague, tenant=tenancy.tenant).role == "finance"
    twice = owner.post(add, {"tenant": tenancy.tenant.pk, "username": colleague.username, "role": "admin"})
    assert "member of the tenant already" in twice.content.decode()
    assert as_user(colleague).get("/admin/billing/spendreport/").status_code == 200
    # Another tenant of the owner's is still not theirs to add people to (they are no admin there).
    other = owner.post(add, {"tenant": tenancy.other.pk, "username": colleague.username, "role": "viewer"})
    assert "tenant" in other.context["adminform"].form.errors

    operator = as_user(tenancy.superuser)
    assert (
        operator.post(add, {"tenant": tenancy.tenant.pk, "username": newcomer.username, "role": "viewer"}).status_code
        == 302
    )
    assert tenant_page_post(operator, tenancy.tenant, retired.username).status_code == 200  # inactive: nobody's
    newcomer2 = User.objects.create_user(unique("newcomer"), password="x")
    assert tenant_page_post(operator, tenancy.tenant, newcomer2.username, "admin").status_code == 302
    newcomer.refresh_from_db()
    assert newcomer.is_staff and list(newcomer.groups.values_list("name", flat=True)) == ["Tenant viewers"]
    assert Membership.objects.get(user=newcomer2).role == "admin"


def test_each_key_shows_its_own_usage_and_its_cost_only_to_who_may_see_spend(tenancy):
    """The key list sums this month's requests and cost per key; the key's page breaks them down by
    period. A viewer sees the requests, not the money."""
    from decimal import Decimal

    from tests.billing.conftest import drain_all, hand_off_all, record

    tenant = tenancy.tenant
    busy, _ = key_create(tenant=tenant, name=unique("busy"))
    idle, _ = key_create(tenant=tenant, name=unique("idle"))
    hand_off_all([record(tenant, key=busy, cost="0.25", request_id=f"use-{busy.pk}-{i}") for i in range(3)])
    drain_all()

    page = as_user(tenancy.owner).get(reverse("admin:tenants_virtualkey_changelist"), {"q": busy.name})
    assert page.status_code == 200
    row = page.content.decode().lower()
    assert "requests this month" in row and "cost this month (usd)" in row
    result = page.context["cl"].result_list
    (shown,) = [k for k in result if k.pk == busy.pk]
    assert shown.month_usage["requests"] == 3 and shown.month_usage["cost_usd"] == Decimal("0.75")
    detail = as_user(tenancy.owner).get(reverse("admin:tenants_virtualkey_change", args=[busy.pk]))
    rows = {r["period"]: r for r in detail.context["usage"]["rows"]}
    assert (rows["today"]["requests"], rows["today"]["cost_usd"]) == (3, Decimal("0.75"))
    assert rows["this month"]["tokens"] == 3 * (11 + 40)
    idle_detail = as_user(tenancy.owner).get(reverse("admin:tenants_virtualkey_change", args=[idle.pk]))
    assert [r["requests"] for r in idle_detail.context["usage"]["rows"]] == [0, 0, 0]

    viewer = as_user(tenancy.viewer).get(reverse("admin:tenants_virtualkey_changelist"), {"q": busy.name})
    assert "cost this month (usd)" not in viewer.content.decode().lower()
    assert "0.75" not in viewer.content.decode()


def test_the_key_list_says_what_the_tightest_budget_has_left(tenancy):
    """Of a key's own budgets, the one with the least left this period is shown; a key without one
    shows a dash, and a viewer sees no money."""
    from decimal import Decimal

    from tenants.models import Budget
    from tests.billing.conftest import drain_all, hand_off_all, record

    tenant = tenancy.tenant
    busy, _ = key_create(tenant=tenant, name=unique("budgeted"))
    free, _ = key_create(tenant=tenant, name=unique("unbudgeted"))
    Budget.objects.create(tenant=tenant, key=busy, period="daily", limit_usd=Decimal("1"))
    Budget.objects.create(tenant=tenant, key=busy, period="monthly", limit_usd=Decimal("100"))
    hand_off_all([record(tenant, key=busy, cost="0.3", request_id=f"b-{busy.pk}-{i}") for i in range(2)])
    drain_all()

    page = as_user(tenancy.owner).get(reverse("admin:tenants_virtualkey_changelist"), {"q": "budgeted"})
    shown = {k.pk: k.budget_left for k in page.context["cl"].result_list}
    assert shown[busy.pk] == "$0.40 of $1.00 daily" and shown[free.pk] == "—"
    assert "budget left" in page.content.decode().lower() and "$0.40 of $1.00 daily" in page.content.decode()
    viewer = as_user(tenancy.viewer).get(reverse("admin:tenants_virtualkey_changelist"), {"q": "budgeted"})
    assert "$0.40" not in viewer.content.decode()


def test_a_tenant_added_with_members_in_the_same_save_keeps_them(tenancy):
    """The tenant's add page with member rows: the tenant and its members are saved together (the
    form once asked the database about a tenant that was not saved yet: a 500). The same person twice
    in one save is a form error, not an integrity error."""
    User = get_user_model()
    first, second = (User.objects.create_user(unique("founder"), password="x") for _ in range(2))
    operator = as_user(tenancy.superuser)
    add = reverse("admin:tenants_tenant_add")
    page = operator.get(add)
    slug = unique("fresh")

    def post(*rows):
        data = filled(page.context["adminform"].form, {"name": slug, "slug": slug})
        (inline,) = page.context["inline_admin_formsets"]
        prefix = inline.formset.prefix
        data.update({f"{prefix}-TOTAL_FORMS": str(len(rows)), f"{prefix}-INITIAL_FORMS": "0"})
        for n, (username, role) in enumerate(rows):
            data.update({f"{prefix}-{n}-username": username, f"{prefix}-{n}-role": role})
        return operator.post(add, data)

    twice = post((first.username, "admin"), (first.username, "viewer"))
    assert twice.status_code == 200
    assert "more than once" in twice.content.decode()
    assert not Membership.objects.filter(user=first).exists()

    done = post((first.username, "admin"), (second.username, "finance"))
    assert done.status_code == 302
    memberships = Membership.objects.filter(tenant__slug=slug).order_by("role")
    assert [(m.user, m.role) for m in memberships] == [(first, "admin"), (second, "finance")]


def test_allowlists_are_chosen_from_the_models_that_exist(tenancy):
    """A typo in an allowlist (`gpt4o`) once saved silently and locked every key out; now the key
    and tenant forms offer the installation's models to pick from and name anything else as an
    error, and a key cannot name a model outside its tenant's list. Nothing is saved on an error."""
    from gateway.models import ModelAlias

    real = ModelAlias.objects.create(name=unique("gpt-4o"), description="the omni model")
    other = ModelAlias.objects.create(name=unique("small"))
    owner = as_user(tenancy.owner)
    page = owner.get(f"{KEYS}add/")
    choices = dict(page.context["adminform"].form.fields["allowed_models"].choices)
    assert choices[real.name] == f"{real.name}: the omni model" and other.name in choices and "auto" in choices

    name = unique("typo-key")
    typo = owner.post(f"{KEYS}add/", {"tenant": tenancy.tenant.pk, "name": name, "allowed_models": ["gpt4o"]})
    assert typo.status_code == 200
    assert typo.context["adminform"].form.errors["allowed_models"] == ["No such model: gpt4o. Choose from the list."]
    assert not VirtualKey.objects.filter(name=name).exists()

    made = owner.post(f"{KEYS}add/", {"tenant": tenancy.tenant.pk, "name": name, "allowed_models": [real.name]})
    assert made.status_code == 303
    assert VirtualKey.objects.get(name=name).allowed_models == [real.name]

    tenant = tenancy.tenant
    tenant.allowed_models = [real.name]
    tenant.save()
    outside = owner.post(f"{KEYS}add/", {"tenant": tenant.pk, "name": unique("k"), "allowed_models": [other.name]})
    assert outside.context["adminform"].form.errors["allowed_models"] == [
        f"Not on {tenant.name}'s list of models: {other.name}. A key narrows it only."
    ]

    operator = as_user(tenancy.superuser)
    url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
    form = operator.get(url).context["adminform"].form
    data = filled(form, {"memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})
    data["allowed_models"] = [real.name, "gpt-5-turbo"]
    refused = operator.post(url, data)
    assert refused.context["adminform"].form.errors["allowed_models"] == [
        "No such model: gpt-5-turbo. Choose from the list."
    ]
    tenant.refresh_from_db()
    assert tenant.allowed_models == [real.name]


def end_user_limits_post(web, url: str, rows: list[dict]) -> dict:
    """The key's page as shown, with `rows` as its end-user limits."""
    page = web.get(url)
    data = filled(page.context["adminform"].form)
    (inline,) = page.context["inline_admin_formsets"]
    prefix = inline.formset.prefix
    data.update({f"{prefix}-TOTAL_FORMS": str(len(rows)), f"{prefix}-INITIAL_FORMS": "0"})
    for i, row in enumerate(rows):
        data.update({f"{prefix}-{i}-{name}": value for name, value in row.items()})
    return data


def test_a_tenant_admin_sets_the_end_user_and_session_limits_on_a_key(tenancy):
    """On the key's page (#21): each end user and each session held to a budget, a token cap or both;
    a row setting neither is refused; other tenants' admins and the tenant's viewers change nothing.
    Saving tells the gateway processes to re-read the key."""
    from decimal import Decimal

    from sentinel.localstate import GENERATION_KEY
    from sentinel.redis_clients import sync_redis
    from tenants.models import AuditEntry, EndUserLimit

    key, _ = key_create(tenant=tenancy.tenant, name=unique("app"))
    url = reverse("admin:tenants_virtualkey_change", args=[key.pk])
    owner = as_user(tenancy.owner)
    rows = [
        {"scope": "end_user", "period": "daily", "limit_usd": "1.50", "token_cap": "20000"},
        {"scope": "session", "period": "monthly", "limit_usd": "", "token_cap": "5000"},
    ]
    data = end_user_limits_post(owner, url, rows)

    refused = owner.post(url, {**data, "end_user_limits-1-token_cap": ""})
    assert refused.status_code == 200
    assert "Set a budget, a token cap, or both." in refused.content.decode()
    assert not EndUserLimit.objects.filter(key=key).exists()
    for person, status in ((tenancy.outsider, 404), (tenancy.viewer, 403)):
        assert as_user(person).post(url, data).status_code == status
        assert not EndUserLimit.objects.filter(key=key).exists()

    generation = int(sync_redis().get(GENERATION_KEY) or 0)
    assert owner.post(url, data).status_code == 302
    saved = EndUserLimit.objects.filter(key=key).order_by("scope")
    assert [(r.scope, r.period, r.limit_usd, r.token_cap) for r in saved] == [
        ("end_user", "daily", Decimal("1.5000"), 20000),
        ("session", "monthly", None, 5000),
    ]
    assert int(sync_redis().get(GENERATION_KEY)) > generation
    trail = AuditEntry.objects.filter(tenant=tenancy.tenant, target__startswith="end-user limit").order_by("pk")
    assert [(e.action, e.actor_name, e.changes["token_cap"]) for e in trail] == [
        ("object.added", tenancy.owner.username, [None, 20000]),
        ("object.added", tenancy.owner.username, [None, 5000]),
    ]
