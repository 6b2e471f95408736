"""Reads about spend: period totals for budgets, spend reports for finance, the request log.

Settled figures come from the daily rollups wherever a tenant's day is rolled up and from the ledger
itself where it is not (a day with new rows the rollup job has not folded in yet, or part of a day),
so every figure equals the sum of the ledger rows it covers, whenever it is asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from billing.models import DailyRollup, LedgerDeadLetter, LedgerEntry, Price, RollupDue
from billing.money import ZERO
from tenants.models import Team, Tenant, VirtualKey

ONE_DAY = timedelta(days=1)
# Report dimensions, in the order columns and sorting use them. A report by end user reads the
# ledger itself (rollups do not keep end users), so it is not among the defaults.
DIMENSIONS = ("day", "tenant", "team", "key", "end_user", "model", "price")
DEFAULT_DIMENSIONS = ("day", "tenant", "key", "model", "price")
# The kinds of token within the prompt and completion tokens, and what each kind cost within cost_usd
# (issue #16: priced as the provider prices them): in reports, statements and the request log.
TOKEN_KINDS = (
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cache_read_cost_usd",
    "cache_write_cost_usd",
    "reasoning_cost_usd",
)
METRICS = (
    "requests",
    "successful_requests",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "exact_hits",
    "semantic_hits",
    "saved_cost_usd",
    # Added later, so last (exports' columns keep their places).
    *TOKEN_KINDS,
    "images",  # generated (POST /v1/images/generations); what they cost is in cost_usd
)
MONEY_METRICS = frozenset(
    {"cost_usd", "saved_cost_usd", "cache_read_cost_usd", "cache_write_cost_usd", "reasoning_cost_usd"}
)

_LEDGER_METRICS = {
    "requests": Count("id"),
    "successful_requests": Count("id", filter=Q(status_code=200)),
    "prompt_tokens": Sum("prompt_tokens"),
    "completion_tokens": Sum("completion_tokens"),
    "cost_usd": Sum("cost_usd"),
    "exact_hits": Count("id", filter=Q(cache_tier=LedgerEntry.CacheTier.EXACT)),
    "semantic_hits": Count("id", filter=Q(cache_tier=LedgerEntry.CacheTier.SEMANTIC)),
    "saved_cost_usd": Sum("saved_cost_usd"),
    **{name: Sum(name) for name in METRICS[8:]},
}
_ROLLUP_METRICS = {name: Sum(name) for name in METRICS}

# The dashboard's traffic figures, counted alike from ledger rows and from DailyTraffic (whose columns
# they name): cache hits and misses are among answered requests; errors are any other status.
ANSWERED = Q(status_code=200)
TRAFFIC_METRICS = (
    "requests",
    "errors",
    "server_errors",
    "exact_hits",
    "semantic_hits",
    "misses",
    "cost_usd",
    "saved_usd",
)
TRAFFIC_MONEY = frozenset({"cost_usd", "saved_usd"})
LEDGER_TRAFFIC = {
    "requests": Count("id"),
    "errors": Count("id", filter=~ANSWERED),
    "server_errors": Count("id", filter=Q(status_code__gte=500)),
    "exact_hits": Count("id", filter=Q(cache_tier=LedgerEntry.CacheTier.EXACT) & ANSWERED),
    "semantic_hits": Count("id", filter=Q(cache_tier=LedgerEntry.CacheTier.SEMANTIC) & ANSWERED),
    "misses": Count("id", filter=Q(cache_tier=LedgerEntry.CacheTier.MISS) & ANSWERED),
    "cost_usd": Sum("cost_usd"),
    "saved_usd": Sum("saved_cost_usd"),
}
USER_METRICS = ("requests", "errors", "cost_usd")  # DailyUserTraffic's
# Where each dimension lives in the rollups and in the ledger.
_ROLLUP_FIELDS = {"day": "day", "tenant": "tenant_id", "key": "key_id", "model": "model", "price": "price_id"}
_LEDGER_FIELDS = {
    "day": "day",
    "tenant": "tenant_id",
    "team": "team_id",
    "key": "key_id",
    "end_user": "end_user",
    "model": "model_requested",
    "price": "price_id",
}


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """A day is a UTC day, here and in the rollups."""
    start = datetime.combine(day, time.min, tzinfo=UTC)
    return start, start + ONE_DAY


def _zeroed(row: dict) -> dict:
    """Sums over no rows are NULL in SQL; here they are zero."""
    for name in METRICS:
        if row.get(name) is None:
            row[name] = ZERO if name in MONEY_METRICS else 0
    return row


def ledger_totals(entries: QuerySet[LedgerEntry], fields: Sequence[str]) -> list[dict]:
    """Ledger sums grouped by `fields` (ledger field names), one dict per group."""
    if not fields:
        # One group, or none when no row matches. (values() with no fields would group by the primary
        # key as the ORM knows it, the id alone, which is no key of the partitioned table.)
        totals = entries.order_by().aggregate(**_LEDGER_METRICS)
        return [_zeroed(totals)] if totals["requests"] else []
    # order_by() drops the model's default ordering, which would otherwise join the GROUP BY.
    return [_zeroed(row) for row in entries.order_by().values(*fields).annotate(**_LEDGER_METRICS)]


# --- period totals (budgets) -----------------------------------------------------------------------


def whole_days(start: datetime, end: datetime) -> list[date]:
    """The UTC days wholly inside [start, end), in order."""
    first = start.astimezone(UTC).date()
    if day_bounds(first)[0] < start:
        first += ONE_DAY
    days = []
    while day_bounds(first)[1] <= end:
        days.append(first)
        first += ONE_DAY
    return days


def outside_days(days: list[date], start: datetime, end: datetime) -> Q | None:
    """A filter on created_at for [start, end) minus the given whole days (sorted)."""
    spans, cursor = [], start
    for day in days:
        day_start, day_end = day_bounds(day)
        if cursor < day_start:
            spans.append((cursor, day_start))
        cursor = day_end
    if cursor < end:
        spans.append((cursor, end))
    query = None
    for low, high in spans:
        span = Q(created_at__gte=low, created_at__lt=high)
        query = span if query is None else query | span
    return query


def spend_in_period(
    *, tenant_id: int, key_id: int | None = None, team_id: int | None = None, start: datetime, end: datetime
) -> Decimal:
    """Settled spend of a tenant (or one of its keys, or teams) in [start, end): rollups for the whole
    days that are rolled up, ledger rows for the rest. Requests still queued for the ledger are not in
    it; the live counters in Redis cover those. A team's is summed from the ledger alone (its partial
    index): rollups have no team, and a key that changed teams keeps its earlier spend in the old one."""
    if end <= start:
        return ZERO
    if team_id is not None and key_id is None:
        rows = LedgerEntry.objects.filter(
            tenant_id=tenant_id, team_id=team_id, created_at__gte=start, created_at__lt=end
        )
        return rows.aggregate(s=Sum("cost_usd"))["s"] or ZERO
    scope = {"tenant_id": tenant_id} if key_id is None else {"tenant_id": tenant_id, "key_id": key_id}
    days = whole_days(start, end)
    due = set(RollupDue.objects.filter(tenant_id=tenant_id, day__in=days).values_list("day", flat=True))
    rolled_up = [day for day in days if day not in due]
    total = ZERO
    if rolled_up:
        total += DailyRollup.objects.filter(day__in=rolled_up, **scope).aggregate(s=Sum("cost_usd"))["s"] or ZERO
    rest = outside_days(rolled_up, start, end)
    if rest is not None:
        total += LedgerEntry.objects.filter(rest, **scope).aggregate(s=Sum("cost_usd"))["s"] or ZERO
    return total


@dataclass(frozen=True)
class Usage:
    cost_usd: Decimal
    tokens: int  # prompt and completion


def audience_usage(*, key_id: int, scope: str, subject: str, start: datetime, end: datetime) -> Usage:
    """What one end user (`scope` "end_user") or session ("session") of a key spent and used in
    [start, end), from the ledger (its partial indexes); requests still queued for it are in Redis's
    counters instead."""
    column = "end_user" if scope == "end_user" else "session_id"
    # The key's predecessors too: a rotated key's limits moved to its successor with their spend.
    key_ids, new = {key_id}, {key_id}
    while new:
        new = set(VirtualKey.objects.filter(successor_id__in=new).values_list("pk", flat=True)) - key_ids
        key_ids |= new
    totals = LedgerEntry.objects.filter(
        key_id__in=key_ids, created_at__gte=start, created_at__lt=end, **{column: subject}
    ).aggregate(cost=Sum("cost_usd"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    return Usage(cost_usd=totals["cost"] or ZERO, tokens=(totals["prompt"] or 0) + (totals["completion"] or 0))


# --- spend reports -----------------------------------------------------------------------------


@dataclass
class SpendRow:
    """One group of a report: its dimensions (None where not grouped by) and its totals."""

    day: date | None = None
    tenant: Tenant | None = None
    team: Team | None = None  # None where grouped by team too: keys of no team
    key: VirtualKey | None = None
    end_user: str | None = None  # "": requests that named none
    model: str | None = None
    price: Price | None = None
    metrics: dict = field(default_factory=lambda: _zeroed({}))

    def add(self, values: dict) -> None:
        for name in METRICS:
            self.metrics[name] += values[name] or 0


@dataclass
class SpendReport:
    start: date
    end: date
    group_by: list[str]
    tenants: list[Tenant]
    rows: list[SpendRow]
    totals: SpendRow

    @property
    def tenant_slugs(self) -> list[str]:
        return [tenant.slug for tenant in self.tenants]


def pairs_filter(pairs: Iterable[tuple[int, date]], *, rollups: bool) -> Q:
    """Rows of the given (tenant id, UTC day)s: rollup rows by their day, ledger rows by created_at."""
    query = Q(pk__in=[])
    for tenant_id, day in pairs:
        if rollups:
            query |= Q(tenant_id=tenant_id, day=day)
        else:
            low, high = day_bounds(day)
            query |= Q(tenant_id=tenant_id, created_at__gte=low, created_at__lt=high)
    return query


def spend_report(
    *,
    tenants: Sequence[Tenant],
    start: date,
    end: date,
    group_by: Sequence[str],
    key_ids: Sequence[int] | None = None,
    team_ids: Sequence[int] | None = None,
) -> SpendReport:
    """Spend of `tenants` (of those keys only, where `key_ids` are given; of those teams' requests,
    where `team_ids` are) from `start` to `end` (whole UTC days, both included), grouped by any of
    DIMENSIONS (none: totals only), with totals. The caller decides which tenants (and teams) the
    user may see."""
    group_by = [name for name in DIMENSIONS if name in group_by]
    tenant_ids = [tenant.pk for tenant in tenants]
    if {"end_user", "team"} & set(group_by) or team_ids is not None:
        # The rollups keep neither end users nor teams: the ledger serves the whole range (a request
        # counts for the team its key was in when it was made).
        rollups = DailyRollup.objects.none()
        entries = LedgerEntry.objects.filter(
            tenant_id__in=tenant_ids, created_at__gte=day_bounds(start)[0], created_at__lt=day_bounds(end)[1]
        )
    else:
        due = set(
            RollupDue.objects.filter(tenant_id__in=tenant_ids, day__gte=start, day__lte=end)
            .values_list("tenant_id", "day")
            .distinct()
        )
        rollups = (
            DailyRollup.objects.filter(tenant_id__in=tenant_ids, day__gte=start, day__lte=end)
            .exclude(pairs_filter(due, rollups=True))
            .order_by()
            .values(*[_ROLLUP_FIELDS[name] for name in group_by])
            .annotate(**_ROLLUP_METRICS)
        )
        entries = LedgerEntry.objects.filter(pairs_filter(due, rollups=False))
    if key_ids is not None:
        rollups = rollups.filter(key_id__in=key_ids)
        entries = entries.filter(key_id__in=key_ids)
    if team_ids is not None:
        entries = entries.filter(team_id__in=team_ids)
    if "day" in group_by:
        entries = entries.annotate(day=TruncDate("created_at", tzinfo=UTC))
    ledger = ledger_totals(entries, [_LEDGER_FIELDS[name] for name in group_by])
    groups: dict[tuple, dict] = {}
    for values, fields in [(row, _ROLLUP_FIELDS) for row in rollups] + [(row, _LEDGER_FIELDS) for row in ledger]:
        key = tuple(values[fields[name]] for name in group_by)
        merged = groups.setdefault(key, _zeroed({}))
        for name in METRICS:
            merged[name] += values[name] or 0
    totals = SpendRow()
    for metrics in groups.values():
        totals.add(metrics)
    # Without dimensions the one group is the totals.
    rows = _labelled(group_by, groups) if group_by else []
    return SpendReport(start=start, end=end, group_by=group_by, tenants=list(tenants), rows=rows, totals=totals)


def _labelled(group_by: list[str], groups: dict[tuple, dict]) -> list[SpendRow]:
    """Rows with their tenants, keys and prices loaded, sorted by day, tenant, key, model, price."""
    ids = {name: {key[i] for key in groups if key[i] is not None} for i, name in enumerate(group_by)}
    objects = {
        "tenant": Tenant.objects.in_bulk(ids.get("tenant", ())),
        "team": Team.objects.in_bulk(ids.get("team", ())),
        "key": VirtualKey.objects.in_bulk(ids.get("key", ())),
        "price": Price.objects.in_bulk(ids.get("price", ())),
    }
    rows = []
    for key, metrics in groups.items():
        row = SpendRow(metrics=metrics)
        for name, value in zip(group_by, key, strict=True):
            setattr(row, name, objects[name].get(value) if name in objects else value)
        rows.append(row)

    def order(row: SpendRow) -> tuple:
        return (
            row.day or date.min,
            row.tenant.slug if row.tenant else "",
            row.team.name if row.team else "",
            row.key.pk if row.key else 0,
            row.end_user or "",
            row.model or "",
            row.price.effective_from if row.price else datetime.min.replace(tzinfo=UTC),
        )

    return sorted(rows, key=order)


def key_usage(*, keys: Sequence[VirtualKey], start: date, end: date) -> dict[int, dict]:
    """{key id: METRICS} of the given keys over whole UTC days from `start` to `end` (both included),
    figured as spend reports are; keys without requests are left out."""
    if not keys:
        return {}
    tenants = list(Tenant.objects.filter(pk__in={key.tenant_id for key in keys}))
    wanted = [key.pk for key in keys]
    report = spend_report(tenants=tenants, start=start, end=end, group_by=["key"], key_ids=wanted)
    return {row.key.pk: row.metrics for row in report.rows if row.key is not None}


# --- the request log ---------------------------------------------------------------------------


def ledger_entries(
    *,
    tenant_id: int,
    start: date | None = None,
    end: date | None = None,
    status: int | None = None,
    model: str | None = None,
    provider: str | None = None,
    cache_tier: str | None = None,
    key_id: int | None = None,
) -> QuerySet[LedgerEntry]:
    """One tenant's requests, newest first, narrowed by whichever filters are given (days are UTC
    days, both ends included)."""
    entries = LedgerEntry.objects.filter(tenant_id=tenant_id).select_related("key", "price")
    if start is not None:
        entries = entries.filter(created_at__gte=day_bounds(start)[0])
    if end is not None:
        entries = entries.filter(created_at__lt=day_bounds(end)[1])
    if status is not None:
        entries = entries.filter(status_code=status)
    if model:
        entries = entries.filter(model_requested=model)
    if provider:
        entries = entries.filter(provider=provider)
    if cache_tier:
        entries = entries.filter(cache_tier=cache_tier)
    if key_id is not None:
        entries = entries.filter(key_id=key_id)
    return entries.order_by("-created_at", "-id")


def dead_letter_counts() -> dict[str, int]:
    """Ledger records ever set aside as dead letters, by kind; every kind is there, zero included, so
    a counter built on it exists before its first increase."""
    counts = dict.fromkeys(LedgerDeadLetter.Kind.values, 0)
    counts.update(LedgerDeadLetter.objects.order_by().values_list("kind").annotate(n=Count("id")))
    return counts
