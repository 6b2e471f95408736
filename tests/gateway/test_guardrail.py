"""A tenant's guardrail URL and the egress guard: the console refuses an internal URL when it is
saved, and a running gateway (started without 127.0.0.1 on its allowlist) never calls one that got
into the database anyway, streamed or not, nor follows an allowed guardrail's redirect to one; the
tenant's outage setting decides what happens to the request."""

from __future__ import annotations

import time

import openai
import pytest
from openai import OpenAI

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.screening.models import ScreeningPolicy
from sentinel.egress import Allowlist
from tests.console.conftest import as_user
from tests.gateway.test_screening_admin import policy_form
from tests.servers import INTERNAL_URLS, PUBLIC_HOST, Listener, egress_refusal, scrape_metrics, start_gateway


@pytest.fixture(scope="module")
def egress_gateway(test_database_name, mock_provider, embedding_model):
    server = start_gateway(test_database_name, env={"SENTINEL_EGRESS_ALLOW": PUBLIC_HOST})
    yield server
    server.stop()


@pytest.fixture
def guarded(egress_gateway, make_tenant, make_key, make_model, mock_provider):
    """make(url, outage) -> (client, alias, provider, tenant): a tenant whose guardrail is at `url`,
    stored as it might have been before the guard or before its DNS changed (no save-time check)."""

    def make(url: str, outage: str = "closed"):
        tenant = make_tenant()
        policy = ScreeningPolicy(tenant=tenant, guardrail_url=url, guardrail_timeout_ms=3000, guardrail_outage=outage)
        policy.set_guardrail_secret("guardrail-secret")
        policy.save()
        alias, (provider,) = make_model()
        client = OpenAI(base_url=egress_gateway.base_url, api_key=make_key(tenant), max_retries=0, timeout=30)
        return client, alias, provider, tenant

    return make


def ask(client, alias, prompt: str, *, stream: bool) -> str:
    messages = [{"role": "user", "content": prompt}]
    if stream:
        chunks = client.chat.completions.create(model=alias, messages=messages, stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    return client.chat.completions.create(model=alias, messages=messages).choices[0].message.content


def ledger_row(tenant, timeout: float = 10.0) -> LedgerEntry:
    deadline = time.monotonic() + timeout
    while True:
        drain()
        row = LedgerEntry.objects.filter(tenant=tenant).first()
        if row is not None or time.monotonic() > deadline:
            return row
        time.sleep(0.1)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_internal_guardrail_never_hears_the_prompt_and_failing_closed_refuses(
    guarded, internal, mock_provider, stream
):
    client, alias, provider, tenant = guarded(internal.url("/check"), "closed")

    with pytest.raises(openai.InternalServerError) as refused:
        ask(client, alias, "the launch code is 0000", stream=stream)

    assert refused.value.status_code == 503
    assert refused.value.response.json()["error"]["code"] == "screening_unavailable"
    assert internal.connections == 0
    assert mock_provider.stats(provider)["calls"] == 0
    assert ledger_row(tenant).screening["outages"] == [["guardrail", "in", "closed"]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_internal_guardrail_never_hears_the_prompt_and_failing_open_answers(
    guarded, internal, mock_provider, stream
):
    client, alias, provider, tenant = guarded(internal.url("/check"), "open")

    answer = ask(client, alias, "the launch code is 0000", stream=stream)

    assert answer
    assert internal.connections == 0
    assert mock_provider.stats(provider)["calls"] == 1
    assert ledger_row(tenant).screening["outages"] == [["guardrail", "in", "open"]]


@pytest.mark.parametrize("host", ["localhost", "2130706433", "0x7f.1", "[::ffff:127.0.0.1]"])
def test_no_spelling_of_an_internal_guardrail_is_called(guarded, internal, egress_gateway, host):
    client, alias, _, _ = guarded(internal.url("/check", host=host), "closed")
    refusals = scrape_metrics(egress_gateway.url).value("sentinel_guardrail_duration_seconds_count", outcome="refused")
    with pytest.raises(openai.InternalServerError):
        ask(client, alias, "hello", stream=False)
    assert internal.connections == 0
    after = scrape_metrics(egress_gateway.url).value("sentinel_guardrail_duration_seconds_count", outcome="refused")
    assert after == refusals + 1


def test_an_allowed_guardrails_redirect_to_an_internal_address_is_not_followed(guarded, internal, mock_provider):
    public = Listener(PUBLIC_HOST, status=307, headers={"location": internal.url("/check")})
    try:
        client, alias, provider, _tenant = guarded(public.url("/check"), "closed")
        with pytest.raises(openai.InternalServerError):
            ask(client, alias, "the launch code is 0000", stream=False)
        assert len(public.requests) == 1  # the allowed host was asked, and answered with a redirect
        assert internal.connections == 0
        assert mock_provider.stats(provider)["calls"] == 0
    finally:
        public.close()


def test_an_allowed_guardrail_is_consulted(guarded, internal, mock_provider):
    """The control: the same gateway does reach a guardrail the guard allows."""
    public = Listener(PUBLIC_HOST)
    try:
        client, alias, provider, _ = guarded(public.url("/check"), "closed")
        assert ask(client, alias, "hello there", stream=True)
        assert [path for path, _, _ in public.requests] == ["/check"]
        assert b"hello there" in public.requests[0][2]
        assert mock_provider.stats(provider)["calls"] == 1
    finally:
        public.close()


# --- saving ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        *INTERNAL_URLS,
        ("http://[::ffff:7f00:1]:5432/", "the host ::ffff:7f00:1 is an IPv4-mapped IPv6 address ::ffff:7f00:1"),
        ("http://10.0.0.5/check", "the host 10.0.0.5 is a private address 10.0.0.5"),
        ("http://localhost:8000/check", "localhost is an internal host name"),
    ],
)
def test_the_console_refuses_an_internal_guardrail_url_naming_why(tenancy, settings, url, reason):
    settings.EGRESS_ALLOW = Allowlist()
    page = as_user(tenancy.owner).post("/admin/screening/screeningpolicy/add/", policy_form(tenancy.tenant, url))

    assert page.status_code == 200
    assert page.context["adminform"].form.errors["guardrail_url"] == [egress_refusal(reason)]
    assert not ScreeningPolicy.objects.filter(tenant=tenancy.tenant).exists()


def test_the_console_saves_an_allowlisted_internal_guardrail(tenancy, settings):
    settings.EGRESS_ALLOW = Allowlist.parse(["10.0.0.0/8"])
    page = as_user(tenancy.owner).post(
        "/admin/screening/screeningpolicy/add/", policy_form(tenancy.tenant, "http://10.0.0.5/check")
    )
    assert page.status_code == 302
    assert ScreeningPolicy.objects.get(tenant=tenancy.tenant).guardrail_url == "http://10.0.0.5/check"
