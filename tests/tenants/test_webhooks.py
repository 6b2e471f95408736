"""Webhook endpoints and the egress guard: the console refuses an internal URL when it is saved, and
a real Celery worker (started without 127.0.0.1 on its allowlist) never contacts one that got into
the database anyway, nor follows an allowed endpoint's redirect to one. A refused delivery fails at
once and its log names the guard's reason, never a status or an error from the target."""

from __future__ import annotations

import json
import time

import pytest

from sentinel.egress import Allowlist
from tenants.models import WebhookDelivery, WebhookEndpoint
from tenants.webhooks import sign, webhook_publish
from tests.console.conftest import as_user
from tests.servers import INTERNAL_URLS, PUBLIC_HOST, Listener, egress_refusal, start_celery_worker


@pytest.fixture(scope="module")
def egress_worker(test_database_name):
    worker = start_celery_worker(test_database_name, env={"SENTINEL_EGRESS_ALLOW": PUBLIC_HOST}, name="egress")
    yield worker
    worker.stop()


def endpoint_at(tenant, url: str) -> WebhookEndpoint:
    """Stored as it might have been before the guard or before its DNS changed (no save-time check)."""
    endpoint = WebhookEndpoint(tenant=tenant, url=url)
    endpoint.set_secret("whsec-egress")
    endpoint.save()
    return endpoint


def delivery_after_first_attempt(endpoint: WebhookEndpoint, timeout: float = 120.0) -> WebhookDelivery:
    webhook_publish(event="budget.threshold", payload={"tenant": endpoint.tenant.slug}, tenant_id=endpoint.tenant_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        delivery = WebhookDelivery.objects.get(endpoint=endpoint)
        if delivery.attempts:
            return delivery
        time.sleep(0.1)
    raise AssertionError("the worker made no attempt in time (it starts slowly on a busy machine)")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "2130706433", "[::ffff:127.0.0.1]"])
def test_a_webhook_to_an_internal_address_is_never_sent(egress_worker, tenant, internal, host):
    endpoint = endpoint_at(tenant, internal.url("/hook", host=host))
    try:
        delivery = delivery_after_first_attempt(endpoint)
        reason = {
            "127.0.0.1": "the host 127.0.0.1 is a loopback address 127.0.0.1",
            "localhost": "localhost is an internal host name",
            "2130706433": "the host 2130706433 is a loopback address 127.0.0.1",
            "[::ffff:127.0.0.1]": "the host ::ffff:7f00:1 is an IPv4-mapped IPv6 address ::ffff:7f00:1",
        }[host]
        assert (delivery.status, delivery.attempts, delivery.last_status_code, delivery.last_error) == (
            "failed",
            1,
            None,
            f"refused by the egress guard: {reason}",
        )
        assert internal.connections == 0
    finally:
        endpoint.delete()


def test_an_allowed_endpoints_redirect_to_an_internal_address_is_not_followed(egress_worker, tenant, internal):
    public = Listener(PUBLIC_HOST, status=302, headers={"location": internal.url("/hook")})
    endpoint = endpoint_at(tenant, public.url("/hook"))
    try:
        delivery = delivery_after_first_attempt(endpoint)
        assert (delivery.status, delivery.last_status_code, delivery.last_error) == ("pending", 302, "HTTP 302")
        # One request per attempt (a retry may already have run), each to the allowed host alone.
        assert public.requests and [path for path, _, _ in public.requests] == ["/hook"] * len(public.requests)
        assert internal.connections == 0
    finally:
        endpoint.delete()  # its retries find nothing to deliver
        public.close()


def test_an_allowed_endpoint_gets_the_signed_delivery(egress_worker, tenant, internal):
    """The control: the same worker does deliver where the guard allows."""
    public = Listener(PUBLIC_HOST)
    endpoint = endpoint_at(tenant, public.url("/hook"))
    try:
        delivery = delivery_after_first_attempt(endpoint)
        assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 1, 200)
        ((path, headers, body),) = public.requests
        assert path == "/hook"
        assert headers["x-sentinel-signature"] == sign("whsec-egress", headers["x-sentinel-timestamp"], body)
        assert json.loads(body)["data"] == {"tenant": tenant.slug}
    finally:
        endpoint.delete()
        public.close()


# --- saving ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        *INTERNAL_URLS,
        ("http://192.168.1.20:9000/hook", "the host 192.168.1.20 is a private address 192.168.1.20"),
        ("http://100.64.0.7/hook", "the host 100.64.0.7 is a shared (CGNAT) address 100.64.0.7"),
        ("http://metadata.google.internal/", "metadata.google.internal is an internal host name"),
        ("http://localhost:8000/hook", "localhost is an internal host name"),
        ("ftp://hooks.example.com/x", "the scheme 'ftp' is not allowed (http or https only)"),
    ],
)
def test_the_console_refuses_an_internal_webhook_url_naming_why(tenancy, settings, url, reason):
    settings.EGRESS_ALLOW = Allowlist()
    form = {"tenant": tenancy.tenant.pk, "url": url, "secret": "whsec", "events": "", "active": "on"}
    page = as_user(tenancy.owner).post("/admin/tenants/webhookendpoint/add/", form)

    assert page.status_code == 200
    assert page.context["adminform"].form.errors["url"] == [egress_refusal(reason)]
    assert not WebhookEndpoint.objects.filter(tenant=tenancy.tenant).exists()


def test_the_console_saves_an_allowlisted_internal_webhook(tenancy, settings):
    settings.EGRESS_ALLOW = Allowlist.parse(["hooks.corp.internal"])
    form = {"tenant": tenancy.tenant.pk, "url": "http://hooks.corp.internal/x", "secret": "s", "events": ""}
    assert as_user(tenancy.owner).post("/admin/tenants/webhookendpoint/add/", form).status_code == 302
    assert WebhookEndpoint.objects.get(tenant=tenancy.tenant).url == "http://hooks.corp.internal/x"
