"""Shadow verification: the semantic tier's false-hit rate, measured in production.

A sampled share of a tenant's semantic hits (Tenant.shadow_share, 1% by default) is also asked of the
provider after the client has its cached answer (gateway.pipeline.verify_in_shadow: same route, same
budgets, billed and marked `shadow` in the ledger). This module compares the two answers, records
the check, estimates the tenant's false-hit rate with a 95% Wilson interval, and switches the tenant's
semantic tier off (exact hits only) when that rate is shown to be above the tenant's target
(docs/cache.md, "Measured false hits").

Two answers agree when their embeddings (the cache's own MiniLM) reach ANSWER_AGREEMENT and none of
the verifier's principled checks sees a contradiction: both state numbers and share none, or one
answers "yes" and the other "no". A provider's answers vary from call to call, so a disagreement may
be a paraphrase the embedding did not see through: the estimate leans towards too many false hits,
the safe side for a rule that tightens the cache.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

import numpy as np
from django.db.models import Count, F
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.cache import acceptance
from gateway.models import ShadowCheck
from tenants.models import Tenant

ANSWER_AGREEMENT = 0.80  # cosine of the two answers' embeddings at or above which they may agree
CONFIDENCE = 0.95
_POLARITY = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)

Outcome = ShadowCheck.Outcome


def sampled(share: float) -> bool:
    """Is this semantic hit one of the share verified (0 to 1)?"""
    return share > 0 and (share >= 1 or random.random() < share)


@dataclass(frozen=True)
class Comparison:
    outcome: str  # agree | differ
    similarity: float | None  # cosine of the two answers' embeddings
    reason: str


async def compare(cached: str, fresh: str | None, *, embed_many) -> Comparison:
    """The cached answer against the provider's fresh one to the prompt that was served it, embedded
    with `embed_many` (the cache's: gateway.cache.engine.embed_many)."""
    if not fresh or not fresh.strip():
        return Comparison(Outcome.DIFFER, None, "the provider answered without text")
    vectors = await embed_many([cached, fresh])
    similarity = float(np.dot(vectors[0], vectors[1]))
    contradiction = contradicts(cached, fresh)
    if contradiction:
        return Comparison(Outcome.DIFFER, similarity, contradiction)
    if similarity < ANSWER_AGREEMENT:
        return Comparison(Outcome.DIFFER, similarity, f"answers' cosine {similarity:.3f} below {ANSWER_AGREEMENT}")
    return Comparison(Outcome.AGREE, similarity, f"answers' cosine {similarity:.3f}")


def contradicts(a: str, b: str) -> str:
    """What makes two answers to one question say different things, by the verifier's principled
    checks; empty when none applies."""
    numbers_a, numbers_b = acceptance.numbers_in(a), acceptance.numbers_in(b)
    if numbers_a and numbers_b and not numbers_a & numbers_b:
        shown = ", ".join(sorted(n.lstrip("#") for n in numbers_a)), ", ".join(sorted(n.lstrip("#") for n in numbers_b))
        return f"numbers differ: {shown[0]} vs {shown[1]}"
    polarity_a, polarity_b = _POLARITY.match(a), _POLARITY.match(b)
    if polarity_a and polarity_b and polarity_a[1].lower() != polarity_b[1].lower():
        return f"one answers {polarity_a[1].lower()}, the other {polarity_b[1].lower()}"
    return ""


# --- the estimate ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FalseHits:
    """A tenant's shadow checks since its `shadow_since`, and what they say."""

    agree: int
    differ: int
    skipped: int
    failed: int
    target: float  # the tenant's allowed false-hit rate (a fraction)
    estimate: float | None  # differ / compared; None before any comparison
    lower: float | None  # the 95% Wilson interval
    upper: float | None

    @property
    def compared(self) -> int:
        return self.agree + self.differ

    @property
    def needed(self) -> int:
        return checks_needed(self.target)

    @property
    def above_target(self) -> bool:
        """Tighten: the upper bound exceeds the target, judged once enough answers were compared
        that a spotless record would have proven the target (`needed`), or sooner when even the
        lower bound exceeds it."""
        if self.upper is None or self.upper <= self.target:
            return False
        return self.compared >= self.needed or self.lower > self.target

    def as_payload(self) -> dict:
        """Figures as a webhook or the console shows them (rates as fractions, 4 decimals)."""

        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        return {
            "compared": self.compared,
            "differ": self.differ,
            "skipped": self.skipped,
            "failed": self.failed,
            "estimate": rounded(self.estimate),
            "lower": rounded(self.lower),
            "upper": rounded(self.upper),
            "target": rounded(self.target),
            "confidence": CONFIDENCE,
        }


def wilson(differ: int, compared: int) -> tuple[float, float] | None:
    """The 95% Wilson score interval of differ/compared (scipy's), None when nothing was compared."""
    if compared == 0:
        return None
    from scipy.stats import binomtest  # imported on first use: a second's import, off the hot path

    interval = binomtest(differ, compared).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    return float(interval.low), float(interval.high)


def checks_needed(target: float) -> int:
    """The fewest comparisons whose Wilson upper bound, with no false hit among them, is at or
    below `target` (z²/(n+z²) ≤ t): 189 for 2%. Fewer cannot prove any target, so the rate is not
    judged on them unless the lower bound already exceeds it."""
    from scipy.stats import norm

    z2 = norm.ppf(1 - (1 - CONFIDENCE) / 2) ** 2
    return math.ceil(z2 * (1 - target) / target)


def figures(*, agree: int, differ: int, skipped: int = 0, failed: int = 0, target: float) -> FalseHits:
    compared = agree + differ
    interval = wilson(differ, compared)
    return FalseHits(
        agree=agree,
        differ=differ,
        skipped=skipped,
        failed=failed,
        target=target,
        estimate=differ / compared if compared else None,
        lower=interval[0] if interval else None,
        upper=interval[1] if interval else None,
    )


def false_hits(tenant: Tenant) -> FalseHits:
    """The tenant's figures over its current measurement (checks since `shadow_since`)."""
    counts = dict(
        ShadowCheck.objects.filter(tenant=tenant, created_at__gte=tenant.shadow_since)
        .values_list("outcome")
        .annotate(n=Count("id"))
    )
    return figures(
        agree=counts.get(Outcome.AGREE, 0),
        differ=counts.get(Outcome.DIFFER, 0),
        skipped=counts.get(Outcome.SKIPPED, 0),
        failed=counts.get(Outcome.FAILED, 0),
        target=float(tenant.false_hit_target) / 100,
    )


def false_hits_by_tenant() -> dict[str, FalseHits]:
    """Every tenant's current figures, by slug, in one query (the /metrics scrape)."""
    rows = (
        ShadowCheck.objects.filter(created_at__gte=F("tenant__shadow_since"))
        .values_list("tenant__slug", "tenant__false_hit_target", "outcome")
        .annotate(n=Count("id"))
    )
    counts: dict[str, dict] = {}
    for slug, target, outcome, n in rows:
        counts.setdefault(slug, {"target": float(target) / 100})[outcome] = n
    return {
        slug: figures(
            agree=found.get(Outcome.AGREE, 0),
            differ=found.get(Outcome.DIFFER, 0),
            skipped=found.get(Outcome.SKIPPED, 0),
            failed=found.get(Outcome.FAILED, 0),
            target=found["target"],
        )
        for slug, found in counts.items()
    }


def checks_by_tenant() -> list[tuple[str, str, int]]:
    """(tenant slug, outcome, checks ever made): the counters /metrics exports."""
    return list(ShadowCheck.objects.values_list("tenant__slug", "outcome").annotate(n=Count("id")))


# --- /metrics ----------------------------------------------------------------------------------


class FalseHitState(Collector):
    """Each tenant's measured false-hit rate (gateway/cache/shadow.py): the estimate and its 95%
    Wilson bounds over the current measurement, and the shadow checks ever made by outcome. Read from
    Postgres at scrape, where every process records them."""

    NAMES = ("sentinel_cache_false_hit_rate", "sentinel_cache_shadow_checks_total")

    def describe(self):
        return []

    def collect(self):
        from django.db import DatabaseError

        try:
            current, checks = false_hits_by_tenant(), checks_by_tenant()
        except DatabaseError:
            return []
        rate = GaugeMetricFamily(
            "sentinel_cache_false_hit_rate",
            "Share of a tenant's semantic hits whose cached answer differed from the provider's fresh one "
            "(shadow verification), since its measurement started: the estimate and the 95% Wilson bounds "
            "(bound: estimate, lower, upper); target: the tenant's allowed rate.",
            labels=("tenant", "bound"),
        )
        for slug, found in sorted(current.items()):
            for bound in ("estimate", "lower", "upper", "target"):
                value = getattr(found, bound)
                if value is not None:
                    rate.add_metric([slug, bound], value)
        counted = CounterMetricFamily(
            "sentinel_cache_shadow_checks",
            "Semantic hits verified in the shadow, by tenant and outcome: agree, differ (a false hit), "
            "skipped (budget or limits) or failed (the provider).",
            labels=("tenant", "outcome"),
        )
        for slug, outcome, count in checks:
            counted.add_metric([slug, outcome], count)
        return [rate, counted]


STATE_REGISTRY = CollectorRegistry(auto_describe=False)
STATE_REGISTRY.register(FalseHitState())


# --- recording and judging ---------------------------------------------------------------------


def check_record(
    *,
    tenant_id: int,
    request_id: str,
    entry_id: int,
    prompt_similarity: float,
    outcome: str,
    answer_similarity: float | None = None,
    reason: str = "",
) -> ShadowCheck:
    """Record one shadow check, then judge the tenant's semantic tier on its figures."""
    check = ShadowCheck.objects.create(
        tenant_id=tenant_id,
        request_id=request_id,
        entry_id=entry_id,
        prompt_similarity=prompt_similarity,
        outcome=outcome,
        answer_similarity=answer_similarity,
        reason=reason[:300],
    )
    if outcome in (Outcome.AGREE, Outcome.DIFFER):
        judge(tenant_id=tenant_id)
    return check


def judge(*, tenant_id: int) -> bool:
    """Switch the tenant's semantic tier off when its measured false-hit rate is above its target.
    True when this call did (another process may have already)."""
    from tenants.services import tenant_tighten_semantic

    tenant = Tenant.objects.filter(pk=tenant_id, semantic_cache_enabled=True).first()
    if tenant is None:
        return False
    found = false_hits(tenant)
    if not found.above_target:
        return False
    reason = (
        f"measured false-hit rate {found.estimate:.1%} ({found.differ} of {found.compared} semantic hits "
        f"checked), 95% upper bound {found.upper:.1%} above the target {found.target:.1%}: exact hits only"
    )
    return tenant_tighten_semantic(tenant=tenant, reason=reason, figures=found.as_payload())
