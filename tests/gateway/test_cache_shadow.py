"""Shadow verification of semantic hits (gateway/cache/shadow.py, pipeline.verify_in_shadow): the
estimate and its Wilson interval, when the tier tightens, and end to end through the openai SDK a
mock provider whose answers differ for prompts that only look alike."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone
from openai import OpenAI

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.cache import shadow
from gateway.models import CacheEntry, ShadowCheck
from tenants.models import Budget, Tenant, WebhookDelivery, WebhookEndpoint
from tenants.tasks import deliver_webhook
from tenants.webhooks import sign
from tests.conftest import wait_for
from tests.console.conftest import as_user
from tests.servers import Listener, scrape_metrics
from tests.tenants.test_admin import filled

# --- the estimate (no servers) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("differ", "compared", "lower", "upper"),
    [
        (1, 2, 0.0945, 0.9055),
        (0, 1, 0.0, 0.7935),
        (1, 10, 0.0179, 0.4042),
        (2, 100, 0.0055, 0.0700),
        (0, 189, 0.0, 0.0199),
        (0, 188, 0.0, 0.0200),
        (1, 189, 0.0009, 0.0294),
    ],
)
def test_the_wilson_interval_of_given_counts(differ, compared, lower, upper):
    found = shadow.figures(agree=compared - differ, differ=differ, target=0.02)
    assert (round(found.lower, 4), round(found.upper, 4)) == (lower, upper)
    assert found.estimate == differ / compared


def test_nothing_compared_has_no_interval():
    found = shadow.figures(agree=0, differ=0, skipped=3, target=0.02)
    assert (found.estimate, found.lower, found.upper, found.above_target) == (None, None, None, False)


@pytest.mark.parametrize(("target", "needed"), [(0.02, 189), (0.01, 381), (0.05, 73)])
def test_checks_needed_before_a_clean_record_proves_the_target(target, needed):
    assert shadow.checks_needed(target) == needed
    assert shadow.figures(agree=needed, differ=0, target=target).upper <= target
    assert shadow.figures(agree=needed - 1, differ=0, target=target).upper > target


@pytest.mark.parametrize(
    ("agree", "differ", "tightens"),
    [
        (188, 0, False),  # upper 2.00% > 2%, but too few checks to prove any target
        (189, 0, False),  # upper 1.99%: the target is proven
        (188, 1, True),  # 189 checks, upper 2.94%
        (1, 1, True),  # 2 checks, but even the lower bound (9.45%) is above 2%
        (9, 1, False),  # 10 checks, lower 1.79%: not conclusive yet
        (1000, 10, False),  # upper 1.82%
        (1000, 14, True),  # upper 2.31%
    ],
)
def test_when_the_tier_tightens(agree, differ, tightens):
    assert shadow.figures(agree=agree, differ=differ, target=0.02).above_target is tightens


@pytest.mark.parametrize(
    ("cached", "fresh", "reason"),
    [
        ("A US gallon holds 3.785 liters.", "A US gallon holds 4.546 liters.", "numbers differ: 3.785 vs 4.546"),
        ("Yes, you can freeze it.", "No, you cannot freeze it.", "one answers yes, the other no"),
        ("It takes 3 to 5 days.", "Usually 5 days, at most a week.", ""),  # a number in common
        ("Paris is the capital.", "The capital is Paris.", ""),
    ],
)
def test_principled_contradictions_between_answers(cached, fresh, reason):
    assert shadow.contradicts(cached, fresh) == reason


# --- end to end -----------------------------------------------------------------------------------

CAPITAL, CAPITAL_AGAIN, CAPITAL_LATER = (
    "What is the capital of France?",
    "what is the capital of france",
    "WHAT IS THE CAPITAL OF FRANCE?",
)
GALLON, GALLON_AGAIN = "How many liters are in a US gallon?", "how many liters are in a US gallon"
ANSWERS = {
    CAPITAL: "Paris is the capital of France.",
    CAPITAL_AGAIN: "The capital of France is Paris.",  # the same answer in other words: agree
    GALLON: "A US gallon holds about 3.785 liters.",
    GALLON_AGAIN: "One liter is about 0.264 US gallons.",  # looks alike, answers otherwise: a false hit
}


def ask(client: OpenAI, model: str, prompt: str) -> tuple[str, str, str]:
    """(answer, x-sentinel-cache, request id) of one chat completion."""
    raw = client.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": prompt}])
    answer = raw.parse().choices[0].message.content
    return answer, raw.headers["x-sentinel-cache"], raw.headers["x-sentinel-request-id"]


def stored(tenant, count: int) -> None:
    wait_for(lambda: CacheEntry.objects.filter(tenant=tenant).count() == count, what=f"{count} cache entries")


def checks(tenant, count: int) -> list[ShadowCheck]:
    found = lambda: ShadowCheck.objects.filter(tenant=tenant).count() == count  # noqa: E731
    wait_for(found, what=f"{count} shadow checks")
    return list(ShadowCheck.objects.filter(tenant=tenant).order_by("id"))


def shadow_rows(request_ids: list[str]) -> list[LedgerEntry]:
    def written():
        drain()
        rows = list(LedgerEntry.objects.filter(request_id__in=request_ids, cache_tier="shadow").order_by("created_at"))
        return rows if len(rows) == len(request_ids) else None

    return wait_for(written, what="the shadow ledger rows")


def test_a_false_hit_measured_in_the_shadow_tightens_the_tier(
    gateway, mock_provider, tenancy, make_key, make_model, live_db
):
    tenant = tenancy.tenant
    Tenant.objects.filter(pk=tenant.pk).update(shadow_share=100)  # every semantic hit is verified
    model, (provider,) = make_model()
    mock_provider.control(provider, answers=ANSWERS)
    receiver = Listener()
    endpoint = WebhookEndpoint(tenant=tenant, url=receiver.url("/hook"), events=["cache.semantic_tightened"])
    endpoint.set_secret("whsec-shadow")
    endpoint.save()
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0, timeout=30)
    try:
        assert ask(client, model, CAPITAL)[:2] == (ANSWERS[CAPITAL], "miss")
        stored(tenant, 1)
        answer, tier, agreeing = ask(client, model, CAPITAL_AGAIN)
        assert (answer, tier) == (ANSWERS[CAPITAL], "hit-semantic")  # the client gets the cached answer
        checks(tenant, 1)
        assert ask(client, model, GALLON)[:2] == (ANSWERS[GALLON], "miss")
        stored(tenant, 2)
        answer, tier, differing = ask(client, model, GALLON_AGAIN)
        assert (answer, tier) == (ANSWERS[GALLON], "hit-semantic")
        agree, differ = checks(tenant, 2)

        assert (agree.request_id, agree.outcome, differ.request_id, differ.outcome) == (
            agreeing,
            "agree",
            differing,
            "differ",
        )
        assert agree.answer_similarity >= shadow.ANSWER_AGREEMENT
        assert differ.reason == "numbers differ: 3.785 vs 0.264, 1"
        assert mock_provider.stats(provider)["calls"] == 4  # two misses, two shadow calls

        # Billed as shadow calls, under the hits' request ids; the hits themselves cost nothing.
        rows = shadow_rows([agreeing, differing])
        assert [(r.request_id, r.status_code, r.provider, r.completion_tokens) for r in rows] == [
            (agreeing, 200, provider, 6),
            (differing, 200, provider, 7),
        ]
        for row in rows:
            price = row.price
            exact = row.prompt_tokens * price.input_per_token + row.completion_tokens * price.output_per_token
            assert row.cost_usd == exact.quantize(Decimal("1e-10"))
            assert row.cost_usd > 0
        hits = LedgerEntry.objects.filter(request_id__in=[agreeing, differing], cache_tier="hit-semantic")
        assert sorted(hits.values_list("cost_usd", flat=True)) == [Decimal(0), Decimal(0)]

        # 1 of 2: 50%, 95% interval 9.45% to 90.55%: even the lower bound is above the 2% target.
        tenant.refresh_from_db()
        found = shadow.false_hits(tenant)
        assert (found.agree, found.differ, found.skipped, found.failed) == (1, 1, 0, 0)
        assert (found.estimate, round(found.lower, 4), round(found.upper, 4)) == (0.5, 0.0945, 0.9055)
        assert tenant.semantic_cache_enabled is False
        assert tenant.semantic_tightened_reason == (
            "measured false-hit rate 50.0% (1 of 2 semantic hits checked), 95% upper bound 90.5% above the "
            "target 2.0%: exact hits only"
        )
        # The tier is exact-only now: a third phrasing goes upstream.
        assert ask(client, model, CAPITAL_LATER)[1] == "miss"
        assert mock_provider.stats(provider)["calls"] == 5

        scrape = scrape_metrics(gateway.url)
        rate = {
            b: scrape.value("sentinel_cache_false_hit_rate", tenant=tenant.slug, bound=b) for b in ("estimate", "upper")
        }
        assert (rate["estimate"], round(rate["upper"], 4)) == (0.5, 0.9055)
        assert scrape.value("sentinel_cache_shadow_checks_total", tenant=tenant.slug, outcome="differ") == 1

        delivery = WebhookDelivery.objects.get(endpoint=endpoint)
        assert (delivery.event, delivery.payload["action"], delivery.payload["compared"]) == (
            "cache.semantic_tightened",
            "exact_only",
            2,
        )
        deliver_webhook(delivery.pk)  # what a worker does with the queued task
        _, headers, body = receiver.requests[-1]
        assert headers["x-sentinel-signature"] == sign("whsec-shadow", headers["x-sentinel-timestamp"], body)
        data = json.loads(body)["data"]
        assert (data["tenant"], data["differ"], data["upper"], data["target"]) == (tenant.slug, 1, 0.9055, 0.02)

        page = as_user(tenancy.owner).get("/admin/dashboard/", {"tenant": tenant.slug}).content.decode()
        assert "1 of 2 semantic hits checked against the provider differed" in page
        assert "50.00 % (95% interval 9.45 % – 90.55 %), target 2.00 %" in page
        assert "The semantic tier switched itself off" in page
    finally:
        receiver.close()


@pytest.mark.parametrize("case", ["soft budget spent", "provider refuses"])
def test_a_shadow_call_that_would_overspend_is_skipped_and_one_that_fails_is_counted(
    case, gateway, mock_provider, make_tenant, make_key, make_model
):
    """A soft budget lets the client past its limit; the shadow call never goes there, and nothing is
    sent. A provider that refuses the shadow call: billed at zero, counted as failed. Neither is a
    comparison: the tier stays on."""
    tenant = make_tenant(shadow_share=100)
    if case == "soft budget spent":
        Budget.objects.create(tenant=tenant, period="daily", limit_usd=Decimal("0.000001"), hard=False)
    model, (provider,) = make_model()
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0, timeout=30)
    assert ask(client, model, CAPITAL)[1] == "miss"  # spends past the soft limit, if there is one
    stored(tenant, 1)
    if case == "provider refuses":
        mock_provider.control(provider, error_rate=1.0, error_status=400)
    answer, tier, request_id = ask(client, model, CAPITAL_AGAIN)
    assert (tier, answer.split()[0]) == ("hit-semantic", mock_answer_head(CAPITAL))
    (check,) = checks(tenant, 1)
    drain()
    shadow_rows = LedgerEntry.objects.filter(request_id=request_id, cache_tier="shadow")
    if case == "soft budget spent":
        assert (check.outcome, check.reason) == ("skipped", "budget_exceeded")
        assert mock_provider.stats(provider)["calls"] == 1  # nothing sent
        assert not shadow_rows.exists()
    else:
        assert (check.outcome, check.reason) == ("failed", "invalid_request")
        assert mock_provider.stats(provider)["calls"] == 2
        row = wait_for(lambda: drain() or shadow_rows.first(), what="the failed shadow call's ledger row")
        assert (row.status_code, row.error_code, row.cost_usd) == (400, "invalid_request", Decimal(0))
    assert (check.request_id, check.answer_similarity) == (request_id, None)
    found = shadow.false_hits(tenant)
    assert (found.compared, found.skipped, found.failed) == (
        0,
        int(case == "soft budget spent"),
        int(case != "soft budget spent"),
    )
    tenant.refresh_from_db()
    assert tenant.semantic_cache_enabled is True


def mock_answer_head(prompt: str) -> str:
    from gateway.mock_provider import answer_text

    return answer_text(prompt).split()[0]


@pytest.mark.parametrize(("change", "starts_anew"), [({"semantic_cache_enabled": "on"}, True), ({}, False)])
def test_turning_the_tier_back_on_starts_a_new_measurement(tenancy, change, starts_anew):
    """An admin who turns the tier on again (or changes its threshold or target) starts a new
    measurement; saving other settings keeps the one under way."""
    tenant = tenancy.tenant
    since = timezone.now() - timedelta(days=1)
    Tenant.objects.filter(pk=tenant.pk).update(
        semantic_cache_enabled=False, shadow_since=since, semantic_tightened_reason="measured false-hit rate ..."
    )
    owner = as_user(tenancy.owner)
    url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
    data = filled(
        owner.get(url).context["adminform"].form, {"memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}
    )
    data.pop("semantic_cache_enabled", None)
    data.update(change, name="renamed")
    assert owner.post(url, data).status_code == 302
    tenant.refresh_from_db()
    assert tenant.name == "renamed"
    assert tenant.semantic_cache_enabled is starts_anew
    assert (tenant.shadow_since > since, tenant.semantic_tightened_reason == "") == (starts_anew, starts_anew)
