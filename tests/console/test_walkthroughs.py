"""Issue #20's acceptance, in a real browser (Debian's chromium, driven by Playwright) against a real
gateway process: a tenant admin from an empty tenant to a working key that shows in the dashboard's
charts (its secret shown once, then revoked), and a finance user from the request log (filtered,
exported) to a monthly statement whose total is the sum of what the requests cost, as the gateway
told the client."""

from __future__ import annotations

import csv
import io
import time
from decimal import Decimal

import openai
import pytest
from django.utils import timezone
from openai import OpenAI

from billing.models import LedgerEntry
from tenants.models import VirtualKey
from tests.billing.conftest import drain_all
from tests.conftest import off_the_browser_loop, screenshot, unique
from tests.console.conftest import sign_in

pytestmark = pytest.mark.browser
NO_CACHE = {"x-sentinel-cache-control": "no-cache, no-store"}


def ask(gateway, secret: str, model: str, user: str, text: str = "hello"):
    """One chat completion through the official SDK; returns the raw response (headers and body)."""
    client = OpenAI(base_url=gateway.base_url, api_key=secret, max_retries=0, timeout=30)
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}], user=user, extra_headers=NO_CACHE
    )


def test_a_tenant_admin_goes_from_an_empty_tenant_to_a_working_key_in_the_charts(browser, gateway, tenancy, make_model):
    """...and on to its revocation, which every gateway process honours within a second."""
    t = tenancy
    offered, _ = make_model()
    other, _ = make_model()
    assert VirtualKey.objects.filter(tenant=t.tenant).count() == 0  # an empty tenant
    assert LedgerEntry.objects.filter(tenant=t.tenant).count() == 0
    name, end_user = unique("first-key"), unique("someone")
    with browser(permissions=["clipboard-read", "clipboard-write"]) as page:
        sign_in(page, gateway, t.owner, t.password)
        page.goto(f"{gateway.url}/admin/models/")  # what the tenant may use, to choose from
        assert offered in page.inner_text("#models-table")

        page.goto(f"{gateway.url}/admin/tenants/virtualkey/add/")
        page.fill("#id_name", name)
        page.fill("#id_allowed_models_input", offered)  # the list's filter box
        page.select_option("#id_allowed_models_from", offered)
        page.click("#id_allowed_models_add")
        page.click("[name=_save]")
        secret = page.inner_text("#key-secret").strip()
        page.click("#copy-secret")
        page.wait_for_selector("#copy-status:has-text('Copied.')")
        assert page.evaluate("navigator.clipboard.readText()") == secret
        screenshot(page, "console-key-secret")
        page.reload()  # a reload shows the secret no more and makes no second key
        page.wait_for_selector("#key-secret-gone")
        assert secret not in page.content()
        assert off_the_browser_loop(VirtualKey.objects.filter(tenant=t.tenant).count) == 1

        answered = ask(gateway, secret, offered, end_user)
        assert answered.http_response.status_code == 200 and answered.parse().choices[0].message.content
        cost = Decimal(answered.headers["x-sentinel-cost-usd"])
        assert cost > 0
        with pytest.raises(openai.PermissionDeniedError) as refused:  # off the allowlist chosen above
            ask(gateway, secret, other, end_user)
        assert refused.value.code == "model_not_allowed"

        off_the_browser_loop(drain_all)
        page.goto(f"{gateway.url}/admin/dashboard/?window=1h")
        page.wait_for_selector("body[data-charts-ready='1']")

        def lines(canvas: str):
            return page.evaluate(
                f"Chart.getChart('{canvas}').data.datasets.map(d => [d.label, d.data.reduce((a, b) => a + b, 0)])"
            )

        assert lines("chart-keys") == [[name, 2]]  # the answer and the refusal, each in the ledger
        assert sorted(lines("chart-models")) == sorted([[offered, 1], [other, 1]])
        assert page.inner_text("#top-keys tbody tr").split("\t")[2:4] == ["2", "1"]  # requests, failed
        assert end_user in page.inner_text("#top-users")
        page.select_option("#breakdown-metric", "cost_usd")
        assert lines("chart-keys") == [[name, float(cost)]]
        screenshot(page, "console-walkthrough-admin")

        page.goto(f"{gateway.url}/admin/tenants/virtualkey/")
        page.click(f"#result_list a:has-text('{name}')")
        page.wait_for_selector("#revoke-key")
        assert secret not in page.content()  # shown once: never again
        page.click("#revoke-key")
        page.click("#confirm-revoke")
        revoked = time.monotonic()
        page.wait_for_selector("text=is revoked")
        while True:
            try:
                ask(gateway, secret, offered, end_user)
            except openai.AuthenticationError as refused_key:
                assert refused_key.code == "invalid_api_key"
                break
            assert time.monotonic() - revoked < 1.0, "the gateway still accepts a revoked key"
            time.sleep(0.05)
        assert time.monotonic() - revoked < 1.0
        page.goto(f"{gateway.url}/admin/tenants/virtualkey/")
        assert name in page.content() and secret not in page.content()
        screenshot(page, "console-keys")

    key = VirtualKey.objects.get(tenant=t.tenant)
    assert (key.name, key.allowed_models, key.created_by_id, key.status) == (name, [offered], t.owner.pk, "revoked")
    entry = LedgerEntry.objects.get(request_id=answered.headers["x-sentinel-request-id"])
    assert (entry.key_id, entry.end_user, entry.model_requested, entry.cost_usd) == (key.pk, end_user, offered, cost)


def downloaded(page, selector: str) -> list[list[str]]:
    """The CSV file that clicking `selector` downloads, as rows."""
    with page.expect_download() as download:
        page.click(selector)
    return list(csv.reader(io.StringIO(download.value.path().read_text())))


def test_finance_goes_from_the_request_log_to_a_statement_that_reconciles(browser, gateway, tenancy, model, make_key):
    t = tenancy
    alias, _ = model
    app, batch = unique("app"), unique("batch")
    secrets = {app: make_key(t.tenant, name=app), batch: make_key(t.tenant, name=batch)}
    costs: list[tuple[str, str, Decimal]] = []  # key, user, what the gateway said it cost
    for i, (key, user) in enumerate([(app, "ann"), (app, "ben"), (batch, "ann"), (batch, "cid")]):
        answered = ask(gateway, secrets[key], alias, user, text=f"question {i}")
        costs.append((key, user, Decimal(answered.headers["x-sentinel-cost-usd"])))
    drain_all()
    month = timezone.now().strftime("%Y-%m")
    anns = [cost for _, user, cost in costs if user == "ann"]

    with browser() as page:
        sign_in(page, gateway, t.finance, t.password)
        page.goto(f"{gateway.url}/admin/billing/ledgerentry/")
        assert page.locator("#result_list tbody tr").count() == 4
        page.click("a:has-text('Filters')")  # Unfold's filter panel
        page.fill("#filter-form input[name=end_user]", "ann")
        page.click("#filter-form button:has-text('Apply Filters')")
        page.wait_for_url("**end_user=ann**")
        assert page.locator("#result_list tbody tr").count() == 2
        header, *rows = downloaded(page, "#export-csv")
        rows = [dict(zip(header, row, strict=True)) for row in rows]
        assert {row["end_user"] for row in rows} == {"ann"} and {row["key_name"] for row in rows} == {app, batch}
        assert sum(Decimal(row["cost_usd"]) for row in rows) == sum(anns)

        page.goto(f"{gateway.url}/admin/billing/spendreport/")
        page.fill("#statement-form input[name=month]", month)
        statement = downloaded(page, "#statement-form button[value=csv]")
        screenshot(page, "console-walkthrough-finance")

    assert statement[0][:2] == ["tenant", t.tenant.slug]
    by_line = {(line[0], line[1]): Decimal(line[5]) for line in statement[2:] if not line[0].startswith("TOTAL")}
    assert by_line == {(key, alias): sum(c for k, _, c in costs if k == key) for key in (app, batch)}
    (total,) = [line for line in statement if line[0] == "TOTAL"]
    assert (total[2], Decimal(total[5])) == ("4", sum(cost for _, _, cost in costs))
