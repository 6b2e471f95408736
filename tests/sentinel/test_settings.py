"""Security settings from the environment, as a web process started with them applies them:
SENTINEL_HTTPS=1 behind a TLS-terminating proxy gives Secure cookies, HSTS and a redirect of plain
HTTP console pages; the original scheme is taken only from a trusted proxy (FORWARDED_ALLOW_IPS).
Security keys are bound to the host the settings name, never to a request's."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import pytest
from django.contrib.auth import get_user_model

from tests.conftest import unique
from tests.servers import start_gateway

PROXY = "127.0.0.1"  # uvicorn trusts X-Forwarded-* from here (FORWARDED_ALLOW_IPS' default)
DIRECT = "127.0.0.2"  # another loopback address: a client reaching the web process directly


@pytest.fixture(scope="module")
def https_gateway(test_database_name, mock_provider):
    server = start_gateway(test_database_name, env={"SENTINEL_HTTPS": "1"})
    yield server
    server.stop()


def client_from(address: str, gateway) -> httpx.Client:
    return httpx.Client(base_url=gateway.url, transport=httpx.HTTPTransport(local_address=address), timeout=30)


def test_behind_a_proxy_cookies_are_secure_and_hsts_is_sent(https_gateway, live_db):
    password = "correct horse battery staple"
    user = get_user_model().objects.create_user(unique("https"), password=password, is_staff=True, is_superuser=True)
    https = {"x-forwarded-proto": "https"}
    with client_from(PROXY, https_gateway) as proxy:
        page = proxy.get("/admin/login/", headers=https)
        assert page.status_code == 200
        assert page.headers["strict-transport-security"] == "max-age=31536000; includeSubDomains"
        assert page.headers["x-content-type-options"] == "nosniff"
        assert re.search(r"csrftoken=[^;]+;.*\bSecure\b", page.headers["set-cookie"])
        cookie = re.search(r"csrftoken=([^;]+)", page.headers["set-cookie"]).group(1)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        signed_in = proxy.post(
            "/admin/login/?next=/admin/",
            headers={
                **https,
                # httpx keeps Secure cookies to itself over http://: the proxy would pass it on.
                "cookie": f"csrftoken={cookie}",
                "referer": f"https://127.0.0.1:{https_gateway.url.rsplit(':', 1)[1]}/admin/login/",
            },
            data={"username": user.username, "password": password, "csrfmiddlewaretoken": token},
        )
        assert signed_in.status_code == 302, signed_in.text[:300]
        assert re.search(r"sessionid=[^;]+;.*\bSecure\b", signed_in.headers["set-cookie"])


def test_plain_http_console_pages_are_redirected_and_only_a_trusted_proxy_may_say_https(https_gateway):
    port = https_gateway.url.rsplit(":", 1)[1]
    with client_from(PROXY, https_gateway) as proxy, client_from(DIRECT, https_gateway) as direct:
        for client in (proxy, direct):
            plain = client.get("/admin/login/")
            assert (plain.status_code, plain.headers["location"]) == (301, f"https://127.0.0.1:{port}/admin/login/")
            assert "strict-transport-security" not in plain.headers  # HSTS is only ever sent over HTTPS
        claimed = direct.get("/admin/login/", headers={"x-forwarded-proto": "https"})
        assert claimed.status_code == 301  # not from a trusted proxy: the header is ignored
        # The API and the probes are not redirected (clients would resend their key), nor are metrics
        # (Prometheus scrapes each replica over the internal network).
        assert direct.get("/v1/models").status_code == 401
        assert direct.get("/health/ready").status_code == 200
        assert direct.get("/metrics").status_code == 200


def webauthn_settings(**env: str) -> tuple[str, str] | str:
    """The security keys' origin and relying party ID the settings give under `env` (read in a child
    process: settings are read once per process), or the error that stopped them."""
    names = ("SENTINEL_WEBAUTHN_ORIGIN", "SENTINEL_HTTPS", "SENTINEL_ALLOWED_HOSTS", "SENTINEL_PORT")
    child_env = {k: v for k, v in os.environ.items() if k not in names} | {"SENTINEL_SECRET_KEY": "check", **env}
    code = "from django.conf import settings as s; print(s.WEBAUTHN_ORIGIN, s.OTP_WEBAUTHN_RP_ID)"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'sentinel.settings'; {code}",
        ],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1]
    origin, rp_id = done.stdout.split()
    return origin, rp_id


def test_security_keys_are_bound_to_the_installations_host_never_a_request():
    assert webauthn_settings() == ("http://localhost:8000", "localhost")  # `make run`
    assert webauthn_settings(SENTINEL_PORT="8400") == ("http://localhost:8400", "localhost")
    behind_tls = {"SENTINEL_HTTPS": "true", "SENTINEL_ALLOWED_HOSTS": "10.0.0.7,.example.com,console.example.com"}
    assert webauthn_settings(**behind_tls) == ("https://console.example.com", "console.example.com")
    explicit = {**behind_tls, "SENTINEL_WEBAUTHN_ORIGIN": "https://sentinel.example.com:8443"}
    assert webauthn_settings(**explicit) == ("https://sentinel.example.com:8443", "sentinel.example.com")
    for bad in ("https://10.0.0.7", "https://console.example.com/admin", "console.example.com"):
        error = webauthn_settings(SENTINEL_WEBAUTHN_ORIGIN=bad)
        assert (
            error == f"ValueError: SENTINEL_WEBAUTHN_ORIGIN must be scheme://host[:port] with a host name, not {bad!r}"
        )


@pytest.mark.parametrize(
    ("argv", "controller"),
    [
        (["pytest", "-n", "2", "--dist", "worksteal"], True),
        (["pytest", "-n2"], True),
        (["pytest", "--numprocesses=auto"], True),
        (["pytest", "-n", "0"], False),
        (["pytest", "-q"], False),
        # a Celery worker a test starts reads the test settings too: its -n names the worker
        (["sentinel.celery_cli", "-A", "sentinel", "worker", "-n", "quiet-4242@%h"], False),
    ],
)
def test_only_pytest_xdists_controller_skips_the_servers(monkeypatch, argv, controller):
    from tests.settings import xdist_controller

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(sys, "argv", argv)
    assert xdist_controller() is controller
    monkeypatch.delitem(sys.modules, "pytest")  # a process that is not pytest, whatever its arguments
    assert xdist_controller() is False
