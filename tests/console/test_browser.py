"""The console in a real browser (Debian's chromium, driven by Playwright) against a real gateway
process: the dashboard's charts and live panel, the live circuit view following a failing provider
without a reload, and a member's two-factor enrolment and sign-in (a key from creation to revocation
is in test_walkthroughs.py), and a security key registered and signing in, through Chromium's
virtual authenticator. Screenshots go to tests/artifacts/ (docs/ holds copies of the
dashboard's and the circuit view's)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from django.utils import timezone

from billing.money import format_usd
from gateway.models import BreakerPolicy, Deployment
from gateway.upstream.load import sample_deployments
from sentinel.console.live import live_publish
from tenants.models import Budget
from tests.billing.conftest import drain_all, hand_off_all, record
from tests.conftest import CHROMIUM, off_the_browser_loop, require_chromium, screenshot, unique
from tests.console.conftest import sign_in

pytestmark = pytest.mark.browser


def test_without_chromium_browser_tests_skip_or_in_ci_fail(tmp_path):
    missing = tmp_path / "chromium"
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        require_chromium(missing, required=False)
    with pytest.raises(pytest.fail.Exception, match="browser tests need Debian's chromium"):
        require_chromium(missing, required=True)
    if CHROMIUM.exists():
        require_chromium(CHROMIUM, required=True)  # present: neither


def chat(gateway, secret: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {secret}", "x-sentinel-cache-control": "no-cache, no-store"},
        json={"model": model, "messages": [{"role": "user", "content": "hello"}]},
        timeout=30,
    )


def seed_traffic(tenant, now) -> dict:
    """A day of one tenant's traffic over two providers and the cache, six requests of it in the last
    minute; returns what the dashboard should show."""
    records = []
    for i in range(72):
        at = now - timedelta(seconds=10 + i) if i < 6 else now - timedelta(minutes=20 * i + 5)
        provider, tier = ("mock-secondary" if i % 4 == 1 else "mock-primary"), "miss"
        if i % 6 == 2:
            provider, tier = "cache", "hit-exact"
        elif i % 9 == 4:
            provider, tier = "cache", "hit-semantic"
        hit = tier != "miss"
        status = 503 if i % 11 == 3 and not hit else 200
        records.append(
            record(
                tenant,
                at=at,
                provider=provider,
                deployment=provider,
                cache_tier=tier,
                status=status,
                cost="0" if hit or status != 200 else f"0.000{150 + 13 * i}",
                saved_cost_usd="0.0004" if hit else "0",
                latency_ms=12 if hit else 380 + (i * 37) % 900,
                request_id=f"dash-{i}",
            )
        )
    hand_off_all(records)
    drain_all()
    answered = [r for r in records if r.status_code == 200]
    by_provider = Counter(r.provider for r in records)
    return {
        "requests": len(records),
        "live": 6,
        "cache": [sum(r.cache_tier == tier for r in answered) for tier in ("hit-exact", "hit-semantic", "miss")],
        "providers": sorted(by_provider, key=lambda name: (-by_provider[name], name)),
    }


def test_the_dashboard_draws_its_charts_and_follows_live_figures(browser, gateway, tenancy):
    t = tenancy
    seeded = seed_traffic(t.tenant, timezone.now())
    Budget.objects.create(tenant=t.tenant, period="monthly", limit_usd=Decimal("0.05"))
    Budget.objects.create(tenant=t.tenant, period="daily", limit_usd=Decimal("0.02"))
    with browser() as page:
        sign_in(page, gateway, t.owner, t.password)
        page.goto(f"{gateway.url}/admin/dashboard/?window=24h")
        page.wait_for_selector("body[data-charts-ready='1']")
        page.wait_for_selector("#live-status[data-state='live']")

        def chart(canvas: str, expression: str):
            return page.evaluate(f"(() => {{ const c = Chart.getChart('{canvas}'); return {expression}; }})()")

        assert chart("chart-traffic", "c.data.datasets[0].data.reduce((a, b) => a + b, 0)") == seeded["requests"]
        assert chart("chart-cache", "c.data.datasets[0].data") == seeded["cache"]
        assert chart("chart-providers", "c.data.labels") == seeded["providers"]
        assert all(value > 0 for value in chart("chart-latency", "c.data.datasets[0].data"))
        assert chart("chart-spend", "c.data.labels") == [t.tenant.name]
        assert page.inner_text("#tile-requests") == str(seeded["requests"])

        summaries = off_the_browser_loop(live_publish)
        (mine,) = [s for s in summaries if s["tenant_id"] == t.tenant.pk]
        assert mine["requests"] == seeded["live"]
        page.wait_for_selector(f"#live-requests:has-text('{seeded['live']}')", timeout=5000)
        spend = format(Decimal(mine["spend_today_usd"]).quantize(Decimal("0.0001")), "f")
        assert f"spend today ${spend}" in page.inner_text("#live-detail")
        assert chart("chart-live", "c.data.datasets[0].data") == [seeded["live"]]
        screenshot(page, "console-dashboard")

        # Dark theme (Unfold's switch keeps the choice in localStorage): the page and the charts' text follow.
        page.evaluate("localStorage.setItem('adminTheme', JSON.stringify('dark'))")
        page.reload()
        page.wait_for_selector("body[data-charts-ready='1']")
        page.wait_for_function("document.documentElement.classList.contains('dark')")
        assert page.evaluate("Chart.defaults.color") == "#cbd5e1"
        screenshot(page, "console-dashboard-dark")
    assert format_usd(Decimal(mine["spend_today_usd"])) == mine["spend_today_usd"]


def test_the_live_circuit_view_follows_a_failing_provider_without_a_reload(
    browser, gateway, tenancy, make_model, make_key, mock_provider
):
    alias, (primary, secondary) = make_model(chain_length=2)
    policy = BreakerPolicy.objects.create(
        name=unique("policy"), window_seconds=30, minimum_calls=4, open_seconds=60, half_open_probes=1
    )
    Deployment.objects.filter(name__in=[primary, secondary]).update(breaker_policy=policy)
    Deployment.objects.filter(name=primary).update(
        self_hosted=True, load_metrics_url=f"{mock_provider.url}/p/{primary}/metrics", saturated_waiting=4
    )
    secret = make_key(tenancy.tenant)
    with browser() as page:
        sign_in(page, gateway, tenancy.superuser, tenancy.password)
        page.goto(f"{gateway.url}/admin/circuits/?q={alias}")
        page.wait_for_selector("#live-status[data-state='live']")
        state = page.locator(f"tr[data-deployment='{primary}'] td.state")
        assert state.inner_text() == "closed"
        assert page.locator(f"tr[data-deployment='{primary}'] td.load").inner_text() == "not sampled"
        assert page.locator(f"tr[data-deployment='{secondary}'] td.load").inner_text() == "-"
        assert page.locator("#circuits-table tbody tr").count() == 2
        page.evaluate("window.notReloaded = true")

        mock_provider.control(primary, error_rate=1.0, error_status=503)
        for _ in range(2):  # one retry each: four failures open the breaker
            assert chat(gateway, secret, alias).headers["x-sentinel-provider"] == secondary
        page.wait_for_function(
            f"document.querySelector(\"tr[data-deployment='{primary}'] td.state\").textContent === 'open'",
            timeout=5000,
        )
        # Pushed, not polled or reloaded: the socket's handler is the only writer of this count.
        assert page.evaluate("document.body.dataset.liveEvents") == "1"
        assert page.evaluate("window.notReloaded") is True
        assert f"{primary}" in page.inner_text("#transitions-table tbody tr:first-child")
        assert "closed → open" in page.inner_text("#transitions-table tbody tr:first-child")

        # The self-hosted deployment's load arrives with each sample, also without a reload.
        mock_provider.control(primary, load_waiting=6, load_kv_cache=0.5)
        # Ours is read (the page shows it next); other tests' self-hosted deployments may be read too.
        assert off_the_browser_loop(sample_deployments) >= 1
        page.wait_for_function(
            f"document.querySelector(\"tr[data-deployment='{primary}'] td.load\").textContent"
            " === 'saturated: 0 running, 6 waiting, KV cache 50%'",
            timeout=5000,
        )
        assert page.evaluate("window.notReloaded") is True
        screenshot(page, "console-circuits")
    mock_provider.control(primary, error_rate=0.0)


def test_a_member_enrols_an_authenticator_and_signs_in_with_its_code(browser, gateway, tenancy):
    """Two-factor sign-in (#21) in the browser: the enrolment page's key, a code from it as an
    authenticator app computes it, then a sign-in that asks for the next code."""
    from base64 import b32decode

    from django_otp.oath import totp

    t = tenancy

    def code(secret: str, steps_ahead: int) -> str:
        key = b32decode(secret + "=" * (-len(secret) % 8))
        return f"{totp(key, 30, -steps_ahead * 30, 6):06d}"

    with browser() as page:
        sign_in(page, gateway, t.viewer, t.password)
        page.goto(f"{gateway.url}/admin/two-factor/")
        secret = page.inner_text("#two-factor-secret").strip()
        assert page.locator(".console-qr svg").count() == 1
        page.fill("#id_token", code(secret, 0))
        page.click("#two-factor-enrol [type=submit]")
        page.wait_for_selector("#two-factor-on")
        screenshot(page, "console-two-factor")

        page.context.clear_cookies()  # signed out
        page.goto(f"{gateway.url}/admin/login/")
        page.fill("#id_username", t.viewer.get_username())
        page.fill("#id_password", t.password)
        page.fill("#id_otp_token", code(secret, 1))  # the enrolment used the current code
        page.click("[type=submit]")
        page.wait_for_selector("#nav-sidebar-inner")


def virtual_authenticator(page) -> tuple[object, str]:
    """Chromium's virtual authenticator (DevTools' WebAuthn domain): a platform passkey that always
    verifies its user, standing in for a security key."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    added = cdp.send(
        "WebAuthn.addVirtualAuthenticator",
        {
            "options": {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
            }
        },
    )
    return cdp, added["authenticatorId"]


def console_at_localhost(gateway) -> str:
    """The console where security keys work: http://localhost (a secure context, and the relying
    party the test gateway is given; 127.0.0.1 is an address, which no key can be bound to)."""
    return gateway.url.replace("127.0.0.1", "localhost")


def register_key(page, gateway, console: str, user, password: str) -> None:
    """Signs `user` in and registers a key on the page's virtual authenticator."""
    page.context.clear_cookies()
    sign_in(page, gateway, user, password, console=console)
    page.goto(f"{console}/admin/two-factor/")
    assert page.evaluate("window.isSecureContext") is True
    page.click("#passkey-register-button")
    page.wait_for_selector("#security-keys tbody tr")  # the page reloads with the key listed


def sign_in_to_key_step(page, console: str, user, password: str) -> None:
    page.context.clear_cookies()  # signed out
    page.goto(f"{console}/admin/login/")
    page.fill("#id_username", user.get_username())
    page.fill("#id_password", password)
    page.click("[type=submit]")
    page.wait_for_selector("#passkey-verification-button")


def login_actions(user) -> list[tuple[str, str]]:
    from tenants.models import AuditEntry

    rows = AuditEntry.objects.filter(target=f"user {user.username}", action__startswith="login").order_by("pk")
    return [(row.action, row.detail) for row in rows]


def test_a_member_registers_a_security_key_and_signs_in_with_it(browser, gateway, tenancy):
    """Security keys (#21) in the browser: Chromium's virtual authenticator registers a key on the
    two-factor page, then, signed out, the password and the key sign the member in."""
    t = tenancy
    console = console_at_localhost(gateway)
    with browser() as page:
        cdp, authenticator = virtual_authenticator(page)
        register_key(page, gateway, console, t.viewer, t.password)
        assert "Security key 1" in page.inner_text("#security-keys")
        assert len(cdp.send("WebAuthn.getCredentials", {"authenticatorId": authenticator})["credentials"]) == 1
        screenshot(page, "console-security-keys")

        sign_in_to_key_step(page, console, t.viewer, t.password)
        page.click("#passkey-verification-button")
        page.wait_for_selector("#nav-sidebar-inner")  # signed in
        page.goto(f"{console}/admin/tenants/virtualkey/")
        page.wait_for_selector("#nav-sidebar-inner")
    assert off_the_browser_loop(login_actions, t.viewer)[-1] == ("login.succeeded", "with a security key")


def test_without_the_registered_key_the_sign_in_is_refused(browser, gateway, tenancy):
    """The key registered on one authenticator; the sign-in tried with that authenticator gone and
    another one present (holding a key of its own for another member): nobody is signed in."""
    t = tenancy
    console = console_at_localhost(gateway)
    with browser() as page:
        cdp, first = virtual_authenticator(page)
        register_key(page, gateway, console, t.owner, t.password)
        cdp.send("WebAuthn.removeVirtualAuthenticator", {"authenticatorId": first})

        virtual_authenticator(page)
        register_key(page, gateway, console, t.outsider, t.password)  # the second one holds the outsider's key

        sign_in_to_key_step(page, console, t.owner, t.password)
        page.click("#passkey-verification-button")
        page.wait_for_selector("#passkey-verification-status-message[data-status-enum='not-allowed-or-aborted']")
        screenshot(page, "console-security-key-refused")
        page.goto(f"{console}/admin/tenants/virtualkey/")
        page.wait_for_selector("#login-form")  # not signed in: back at the sign-in page
    assert ("login.succeeded", "with a security key") not in off_the_browser_loop(login_actions, t.owner)
