"""Reads behind the console's pages: traffic, latency, cache and provider figures from the ledger over a
bounded recent window; spend today and this month against budgets from billing's selectors; every
deployment's breaker state for the circuit view. The caller decides which tenants a user may see."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from itertools import accumulate

from django.db import connection
from django.db.models import Aggregate, Count, F, FloatField, Func, IntegerField, Max, Q, QuerySet, Sum
from django.db.models.functions import Trunc
from django.utils import timezone

from billing.models import DailyLatency, DailyTraffic, DailyUserTraffic, LedgerEntry, RollupDue
from billing.money import ZERO
from billing.selectors import (
    ANSWERED,
    LEDGER_TRAFFIC,
    TRAFFIC_METRICS,
    TRAFFIC_MONEY,
    key_usage,
    outside_days,
    pairs_filter,
    spend_report,
    whole_days,
)
from gateway.models import BreakerTransition, ChainEntry, Deployment, breaker_state_label
from gateway.upstream.breakers import breaker_snapshot
from gateway.upstream.load import describe_load
from tenants.models import Budget, Team, Tenant, VirtualKey

# Window name → (length, chart bucket).
WINDOWS = {
    "1h": (timedelta(hours=1), "minute"),
    "24h": (timedelta(hours=24), "hour"),
    "7d": (timedelta(days=7), "day"),
    "30d": (timedelta(days=30), "day"),
}
STEPS = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1)}
TOP = 10
DRAWN = 5  # keys and models drawn over time: the busiest of the top ones
DEFAULT_WINDOW = "24h"
PERCENTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


class PercentileCont(Aggregate):
    """PostgreSQL's percentile_cont(f) WITHIN GROUP (ORDER BY x), which Django does not ship."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, fraction: float, **extra):
        super().__init__(expression, fraction=float(fraction), **extra)


class Unnest(Func):
    """An array's elements, one row each (in the select list: arrays of one row are read in step)."""

    function = "unnest"
    output_field = IntegerField()


def traffic_totals() -> dict:
    """Ledger aggregates shared by the dashboard and the live summaries (latency: answered requests)."""
    return {**LEDGER_TRAFFIC, **latency_percentiles()}


def latency_percentiles() -> dict:
    return {name: PercentileCont("latency_ms", fraction, filter=ANSWERED) for name, fraction in PERCENTILES.items()}


def tidy(row: dict) -> dict:
    """Sums over no rows are NULL: zero for money, None for percentiles (no answered request)."""
    row["cost_usd"] = row.get("cost_usd") or ZERO
    row["saved_usd"] = row.get("saved_usd") or ZERO
    for name in PERCENTILES:
        if row.get(name) is not None:
            row[name] = round(row[name])
    return row


def ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass
class ProviderLine:
    provider: str
    requests: int
    server_errors: int
    share: float
    error_rate: float


@dataclass
class TeamSpend:
    team: Team
    today: Decimal
    month: Decimal
    daily_budget: Decimal | None
    monthly_budget: Decimal | None

    @property
    def today_used(self) -> float | None:
        return TenantSpend.used(self.today, self.daily_budget)

    @property
    def month_used(self) -> float | None:
        return TenantSpend.used(self.month, self.monthly_budget)


@dataclass
class TenantSpend:
    tenant: Tenant
    today: Decimal
    month: Decimal
    daily_budget: Decimal | None
    monthly_budget: Decimal | None

    @staticmethod
    def used(spent: Decimal, budget: Decimal | None) -> float | None:
        return float(spent / budget) if budget else None

    @property
    def today_used(self) -> float | None:
        return self.used(self.today, self.daily_budget)

    @property
    def month_used(self) -> float | None:
        return self.used(self.month, self.monthly_budget)


@dataclass
class KeyBudget:
    """One of a key's own budgets with what the key spent in its period (UTC day or month)."""

    key: VirtualKey
    period: str
    limit_usd: Decimal
    spent: Decimal

    @property
    def used(self) -> float:
        return float(self.spent / self.limit_usd) if self.limit_usd else 1.0

    @property
    def left(self) -> Decimal:
        return max(self.limit_usd - self.spent, ZERO)


@dataclass
class Dashboard:
    window: str
    since: datetime
    until: datetime
    totals: dict
    series: list[dict]
    providers: list[ProviderLine]
    spend: list[TenantSpend] | None = None  # None: the user may not see spend here
    top_keys: list[dict] = field(default_factory=list)  # name, tenant, requests, errors, cost_usd
    top_models: list[dict] = field(default_factory=list)
    top_users: list[dict] = field(default_factory=list)  # the requests' `user`, as apps name their users
    # The busiest keys' and models' requests and cost per bucket: [{name, requests: [...], cost_usd: [...]}]
    keys_over_time: list[dict] = field(default_factory=list)
    models_over_time: list[dict] = field(default_factory=list)
    spend_totals: dict = field(default_factory=dict)
    # The keys' own budgets, most used first (KEY_BUDGETS of them); None: spend is not shown
    key_budgets: list[KeyBudget] | None = None
    key_budget_count: int = 0
    team_spend: list[TeamSpend] = field(default_factory=list)  # the spend tenants' teams, most spent first

    @property
    def hit_ratio(self) -> float | None:
        """Share of answered requests that consulted the cache and were served from it."""
        t = self.totals
        return ratio(t["exact_hits"] + t["semantic_hits"], t["exact_hits"] + t["semantic_hits"] + t["misses"])

    @property
    def error_rate(self) -> float | None:
        return ratio(self.totals["errors"], self.totals["requests"])


@dataclass
class _Sources:
    """Where a window's figures are read: DailyTraffic, DailyUserTraffic and DailyLatency for the UTC days
    wholly inside it that are rolled up (none for windows drawn by the minute or hour), the ledger for
    the rest (the first day's part, today's, and any day with rows the rollup job has not folded in yet)."""

    entries: QuerySet[LedgerEntry]
    traffic: QuerySet[DailyTraffic] | None = None
    users: QuerySet[DailyUserTraffic] | None = None
    latency: QuerySet[DailyLatency] | None = None


def _sources(tenant_ids: Sequence[int] | None, since: datetime, until: datetime, rollups: bool) -> _Sources:
    scoped = LedgerEntry.objects.order_by()
    if tenant_ids is not None:
        scoped = scoped.filter(tenant_id__in=tenant_ids)
    days = whole_days(since, until) if rollups else []
    if not days:
        return _Sources(entries=scoped.filter(created_at__gte=since, created_at__lt=until))
    scope = {} if tenant_ids is None else {"tenant_id__in": tenant_ids}
    due = set(RollupDue.objects.filter(day__in=days, **scope).values_list("tenant_id", "day").distinct())
    rolled_up = [
        model.objects.filter(day__in=days, **scope).exclude(pairs_filter(due, rollups=True)).order_by()
        for model in (DailyTraffic, DailyUserTraffic, DailyLatency)
    ]
    rest = pairs_filter(due, rollups=False)
    outside = outside_days(days, since, until)
    if outside is not None:
        rest |= outside
    # The spans alone, not within the window's range too: so PostgreSQL reads each span's range of the
    # index (a bitmap OR), not the whole window's rows to filter them.
    return _Sources(scoped.filter(rest), *rolled_up)


def _latency_histogram(sources: _Sources) -> Counter[int]:
    """How many answered requests of the window took each latency_ms: the ledger's rows counted by
    latency, plus the rolled-up days' histograms added up in PostgreSQL (a few thousand distinct
    latencies come back, not the window's rows)."""
    histogram: Counter[int] = Counter(
        dict(sources.entries.filter(ANSWERED).values_list("latency_ms").annotate(requests=Count("id")))
    )
    if sources.latency is not None:
        # unnest in the select list (a ProjectSet), not in FROM: a function scan per day materialises
        # its rows and PostgreSQL memoises them, three times slower (150 ms against 55 ms for 58 days).
        days = sources.latency.values(ms=Unnest("latencies"), requests=Unnest("counts"))
        sql, params = days.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT ms, SUM(requests) FROM ({sql}) AS latency GROUP BY ms", params)  # noqa: S608
            histogram.update(dict(cursor.fetchall()))
    return histogram


def percentile_cont(histogram: Mapping[int, int], fraction: float) -> float | None:
    """PostgreSQL's percentile_cont(fraction) over the values `histogram` counts ({value: rows}), to
    the same double: the values at 0-based ranks floor and ceil of fraction × (rows - 1) in sorted
    order, interpolated as PostgreSQL does (float8_lerp). None when there are no rows, as SQL's NULL."""
    values = sorted(value for value, rows in histogram.items() if rows)
    ends = list(accumulate(histogram[value] for value in values))  # ends[i]: rows holding values[i] or less
    if not ends:
        return None
    total = ends[-1]
    position = fraction * (total - 1)
    first, second = math.floor(position), math.ceil(position)
    low = float(values[bisect_right(ends, first)])
    if first == second:
        return low
    high = float(values[bisect_right(ends, second)])
    return low + (position - first) * (high - low)


def _latency(sources: _Sources) -> dict[str, float | None]:
    """Latency percentiles of the window's answered requests, exactly percentile_cont over their rows."""
    histogram = _latency_histogram(sources)
    return {name: percentile_cont(histogram, fraction) for name, fraction in PERCENTILES.items()}


def _zero(names: Sequence[str]) -> dict:
    return {name: ZERO if name in TRAFFIC_MONEY else 0 for name in names}


def _grouped(
    sources: _Sources,
    dims: dict[str, str],
    names: Sequence[str] = TRAFFIC_METRICS,
    *,
    where: Q | None = None,
    rollup_where: Q | None = None,
) -> dict[tuple, dict]:
    """Sums of `names` grouped by `dims` ({ledger name: rollup column}; "bucket" is the UTC day), over the
    window's ledger rows (narrowed by `where`) and its rollup rows (by `rollup_where`), added together."""
    entries = sources.entries.filter(where or Q())
    rollups = sources.traffic
    if "bucket" in dims:
        entries = entries.annotate(bucket=Trunc("created_at", "day", tzinfo=UTC))
    ledger_sums = {name: LEDGER_TRAFFIC[name] for name in names}
    rollup_sums = {name: Sum(name) for name in names}
    if not dims:  # totals
        sums: list = [[entries.aggregate(**ledger_sums)]]
        if rollups is not None:
            sums.append([rollups.filter(rollup_where or Q()).aggregate(**rollup_sums)])
    else:
        sums = [entries.values(*dims).annotate(**ledger_sums)]
        if rollups is not None:
            same = [name for name, column in dims.items() if name == column]
            renamed = {name: F(column) for name, column in dims.items() if name != column}
            sums.append(rollups.filter(rollup_where or Q()).values(*same, **renamed).annotate(**rollup_sums))
    groups: dict[tuple, dict] = {}
    for rows in sums:
        for row in rows:
            if "bucket" in row and not isinstance(row["bucket"], datetime):
                row["bucket"] = datetime.combine(row["bucket"], time.min, tzinfo=UTC)
            merged = groups.setdefault(tuple(row[name] for name in dims), _zero(names))
            for name in names:
                merged[name] += row[name] or 0
    return groups


def _buckets(since: datetime, until: datetime, unit: str) -> list[datetime]:
    """Every bucket of the window, from the one holding `since` (UTC minutes, hours or days)."""
    bucket = since.astimezone(UTC).replace(second=0, microsecond=0)
    if unit in ("hour", "day"):
        bucket = bucket.replace(minute=0)
    if unit == "day":
        bucket = bucket.replace(hour=0)
    buckets = []
    while bucket < until:
        buckets.append(bucket)
        bucket += STEPS[unit]
    return buckets


def _by_bucket(sources: _Sources, unit: str, dims: dict[str, str] | None = None, **kwargs) -> dict[tuple, dict]:
    """Requests, failures and cost per bucket (and per `dims`): by day from both sources, by minute or
    hour from the ledger alone (a window drawn so finely has no rollups)."""
    names = ("requests", "errors", "cost_usd")
    dims = {"bucket": "day", **(dims or {})}
    if unit == "day":
        return _grouped(sources, dims, names, **kwargs)
    rows = (
        sources.entries.filter(kwargs.get("where") or Q())
        .annotate(bucket=Trunc("created_at", unit, tzinfo=UTC))
        .values(*dims)
        .annotate(**{name: LEDGER_TRAFFIC[name] for name in names})
    )
    return {tuple(row[name] for name in dims): {name: row[name] or 0 for name in names} for row in rows}


def _series(sources: _Sources, since: datetime, until: datetime, unit: str) -> list[dict]:
    """Requests, failures and cost per bucket, every bucket present (zeros included)."""
    rows = _by_bucket(sources, unit)
    series = []
    for bucket in _buckets(since, until, unit):
        row = rows.get((bucket,), {})
        series.append(
            {
                "at": bucket.isoformat(),
                "requests": row.get("requests", 0),
                "errors": row.get("errors", 0),
                "cost_usd": row.get("cost_usd") or ZERO,
            }
        )
    return series


def _over_time(
    sources: _Sources, name: str, column: str, lines: dict, since: datetime, until: datetime, unit: str
) -> list[dict]:
    """Requests and cost per bucket of each value of ledger field `name` (rollup `column`) in `lines`
    ({value: label}), in the order given, every bucket present."""
    if not lines:
        return []
    buckets = {bucket: i for i, bucket in enumerate(_buckets(since, until, unit))}
    drawn = {
        value: {"name": label, "requests": [0] * len(buckets), "cost_usd": [ZERO] * len(buckets)}
        for value, label in lines.items()
    }
    rows = _by_bucket(
        sources,
        unit,
        {name: column},
        where=Q(**{f"{name}__in": list(lines)}),
        rollup_where=Q(**{f"{column}__in": list(lines)}),
    )
    for (bucket, value), row in rows.items():
        line, i = drawn[value], buckets[bucket]
        line["requests"][i] = row["requests"]
        line["cost_usd"][i] = row["cost_usd"] or ZERO
    return list(drawn.values())


TOP_METRICS = ("requests", "errors", "cost_usd")


def _top(groups: dict[tuple, dict], *fields: str) -> list[dict]:
    """The TOP busiest groups ({(values of fields): sums}), with their requests, failures and cost;
    ties in the order of their values."""
    busiest = sorted(groups.items(), key=lambda item: (-item[1]["requests"], item[0]))[:TOP]
    return [
        {
            **dict(zip(fields, values, strict=True)),
            "requests": sums["requests"],
            "errors": sums["errors"],
            "cost_usd": sums["cost_usd"],
        }
        for values, sums in busiest
    ]


def _top_keys(sources: _Sources) -> list[dict]:
    rows = _top(
        _grouped(sources, {"key_id": "key_id"}, TOP_METRICS, where=~Q(key=None), rollup_where=~Q(key=None)), "key_id"
    )
    keys = VirtualKey.objects.select_related("tenant").only("name", "tenant__name").in_bulk([r["key_id"] for r in rows])
    return [
        {**row, "key__name": keys[row["key_id"]].name, "tenant__name": keys[row["key_id"]].tenant.name} for row in rows
    ]


def _top_users(sources: _Sources) -> list[dict]:
    """The TOP busiest end users of the window, ranked in PostgreSQL: a window can name hundreds of
    thousands of them, and only TOP come back. Grouped by user and tenant name, ties in the order of
    those (byte order, as Python sorts the other panels' ties), as the ledger alone would rank them."""
    metrics = {name: LEDGER_TRAFFIC[name] for name in TOP_METRICS}
    parts = [sources.entries.exclude(end_user="").values("end_user", "tenant_id").annotate(**metrics)]
    if sources.users is not None:
        sums = {name: Sum(name) for name in TOP_METRICS}
        parts.append(sources.users.values("end_user", "tenant_id").annotate(**sums))
    compiled = [part.query.sql_with_params() for part in parts]
    union = " UNION ALL ".join(f"({sql})" for sql, _ in compiled)
    # Only Django's compiled queries (their values passed as parameters) and a table name are put in.
    ranked = (
        "SELECT u.end_user, t.name, SUM(u.requests)::bigint, SUM(u.errors)::bigint, SUM(u.cost_usd) "  # noqa: S608
        f"FROM ({union}) AS u "
        f"JOIN {Tenant._meta.db_table} AS t ON t.id = u.tenant_id GROUP BY u.end_user, t.name "
        'ORDER BY 3 DESC, u.end_user COLLATE "C", t.name COLLATE "C" LIMIT %s'
    )
    with connection.cursor() as cursor:
        cursor.execute(ranked, [param for _, params in compiled for param in params] + [TOP])
        rows = cursor.fetchall()
    return [
        {"end_user": user, "tenant__name": tenant, "requests": requests, "errors": errors, "cost_usd": cost or ZERO}
        for user, tenant, requests, errors, cost in rows
    ]


def _providers(sources: _Sources) -> list[ProviderLine]:
    groups = _grouped(
        sources,
        {"provider": "provider"},
        ("requests", "server_errors"),
        where=~Q(provider=""),
        rollup_where=~Q(provider=""),
    )
    rows = sorted(groups.items(), key=lambda item: (-item[1]["requests"], item[0]))
    total = sum(sums["requests"] for _, sums in rows)
    return [
        ProviderLine(
            provider=provider,
            requests=sums["requests"],
            server_errors=sums["server_errors"],
            share=sums["requests"] / total,
            error_rate=sums["server_errors"] / sums["requests"],
        )
        for (provider,), sums in rows
    ]


def tenant_spend(*, tenants: Sequence[Tenant], now: datetime) -> list[TenantSpend]:
    """Spend today and this month (UTC) of each tenant, as exact as spend reports, against its
    tenant-wide daily and monthly budgets (the smallest, where there are several)."""
    if not tenants:
        return []
    today = now.astimezone(UTC).date()
    spent = {}
    for label, start in (("today", today), ("month", today.replace(day=1))):
        report = spend_report(tenants=tenants, start=start, end=today, group_by=["tenant"])
        spent[label] = {row.tenant.pk: row.metrics["cost_usd"] for row in report.rows}
    budgets = _smallest_budgets(
        Budget.objects.filter(tenant__in=tenants, key__isnull=True, team__isnull=True), owner="tenant_id"
    )
    return [
        TenantSpend(
            tenant=tenant,
            today=spent["today"].get(tenant.pk, ZERO),
            month=spent["month"].get(tenant.pk, ZERO),
            daily_budget=budgets.get((tenant.pk, Budget.Period.DAILY)),
            monthly_budget=budgets.get((tenant.pk, Budget.Period.MONTHLY)),
        )
        for tenant in tenants
    ]


def _smallest_budgets(budgets, *, owner: str) -> dict[tuple[int, str], Decimal]:
    """The smallest limit of each (owner, period) among `budgets` (a tenant or team may have several)."""
    smallest: dict[tuple[int, str], Decimal] = {}
    for budget in budgets:
        slot = (getattr(budget, owner), budget.period)
        smallest[slot] = min(budget.limit_usd, smallest.get(slot, budget.limit_usd))
    return smallest


def team_spend(*, tenants: Sequence[Tenant], now: datetime) -> list[TeamSpend]:
    """Spend today and this month (UTC) of each team of `tenants`, against its daily and monthly
    budgets (the smallest of each). From the ledger's team index (rollups keep no team): tenants
    without teams cost no query of it."""
    teams = list(Team.objects.filter(tenant__in=tenants).select_related("tenant"))
    if not teams:
        return []
    today = now.astimezone(UTC).date()
    ids = [team.pk for team in teams]
    spent = {}
    for label, start in (("today", today), ("month", today.replace(day=1))):
        report = spend_report(tenants=tenants, start=start, end=today, group_by=["team"], team_ids=ids)
        spent[label] = {row.team.pk: row.metrics["cost_usd"] for row in report.rows if row.team}
    budgets = _smallest_budgets(Budget.objects.filter(team__in=teams), owner="team_id")
    lines = [
        TeamSpend(
            team=team,
            today=spent["today"].get(team.pk, ZERO),
            month=spent["month"].get(team.pk, ZERO),
            daily_budget=budgets.get((team.pk, Budget.Period.DAILY)),
            monthly_budget=budgets.get((team.pk, Budget.Period.MONTHLY)),
        )
        for team in teams
    ]
    return sorted(lines, key=lambda line: (-line.month, line.team.tenant.name, line.team.name))


KEY_BUDGETS = 20  # key budgets listed on the dashboard: the most used


def key_budgets(*, tenants: Sequence[Tenant], now: datetime) -> tuple[list[KeyBudget], int]:
    """The own budgets of the keys of `tenants` (never another tenant's), each with what its key spent
    this UTC day or month (as exact as spend reports), the KEY_BUDGETS most used first; and how many
    there are in all."""
    budgets = list(
        Budget.objects.filter(tenant__in=tenants, key__isnull=False).select_related("key__tenant").order_by("pk")
    )
    if not budgets:
        return [], 0
    today = now.astimezone(UTC).date()
    keys = list({budget.key_id: budget.key for budget in budgets}.values())
    spent = {
        Budget.Period.DAILY: key_usage(keys=keys, start=today, end=today),
        Budget.Period.MONTHLY: key_usage(keys=keys, start=today.replace(day=1), end=today),
    }
    lines = [
        KeyBudget(
            key=budget.key,
            period=budget.period,
            limit_usd=budget.limit_usd,
            spent=spent[budget.period].get(budget.key_id, {}).get("cost_usd", ZERO),
        )
        for budget in budgets
    ]
    lines.sort(key=lambda line: (-line.used, line.key.name, line.period))
    return lines[:KEY_BUDGETS], len(lines)


def dashboard(
    *,
    tenant_ids: Sequence[int] | None,
    spend_tenants: Sequence[Tenant] | None,
    window: str = DEFAULT_WINDOW,
    now: datetime | None = None,
    rollups: bool = True,
) -> Dashboard:
    """The dashboard's figures over the last `window` for `tenant_ids` (None: every tenant), and spend
    and key budgets for `spend_tenants` (None: spend is not shown). Windows drawn by the day read the
    rollups for the whole days they hold (`rollups` False: the ledger alone, the same figures)."""
    length, unit = WINDOWS[window]
    until = now or timezone.now()
    since = until - length
    sources = _sources(tenant_ids, since, until, rollups and unit == "day")
    totals = tidy({**_grouped(sources, {})[()], **_latency(sources)})
    spend = None
    spend_totals = {}
    budgets, budget_count = None, 0
    teams: list[TeamSpend] = []
    if spend_tenants is not None:
        teams = team_spend(tenants=spend_tenants, now=until)
        spend = sorted(tenant_spend(tenants=spend_tenants, now=until), key=lambda s: (-s.month, s.tenant.name))
        spend_totals = {
            "today": sum((s.today for s in spend), ZERO),
            "month": sum((s.month for s in spend), ZERO),
        }
        budgets, budget_count = key_budgets(tenants=spend_tenants, now=until)
    top_keys = _top_keys(sources)
    top_models = _top(_grouped(sources, {"model_requested": "model"}, TOP_METRICS), "model_requested")
    return Dashboard(
        window=window,
        since=since,
        until=until,
        totals=totals,
        series=_series(sources, since, until, unit),
        providers=_providers(sources),
        spend=spend,
        top_keys=top_keys,
        top_models=top_models,
        top_users=_top_users(sources),
        keys_over_time=_over_time(
            sources,
            "key_id",
            "key_id",
            {row["key_id"]: row["key__name"] for row in top_keys[:DRAWN]},
            since,
            until,
            unit,
        ),
        models_over_time=_over_time(
            sources,
            "model_requested",
            "model",
            {row["model_requested"]: row["model_requested"] for row in top_models[:DRAWN]},
            since,
            until,
            unit,
        ),
        spend_totals=spend_totals,
        key_budgets=budgets,
        key_budget_count=budget_count,
        team_spend=teams,
    )


# --- circuits ----------------------------------------------------------------------------------


@dataclass
class Circuit:
    deployment: Deployment
    aliases: list[str]
    state: str
    label: str
    open_for_seconds: float | None
    last_change: datetime | None
    load: str = "-"  # a self-hosted deployment's last sampled load and saturation
    latency: str = "-"  # its answered calls' latency over LATENCY_WINDOW (deployment_latency)


LATENCY_WINDOW = timedelta(minutes=5)


def deployment_latency(*, now: datetime | None = None) -> dict[str, str]:
    """Each deployment's answered calls over the last LATENCY_WINDOW, from the ledger (every
    process's calls, unlike the balancer's per-process estimates): p50 and p95 of the request's
    latency (to the last byte, streams too) and how many, as the circuits page writes them."""
    now = now or timezone.now()
    rows = (
        LedgerEntry.objects.filter(created_at__gte=now - LATENCY_WINDOW, created_at__lt=now, status_code=200)
        .exclude(deployment="")
        .order_by()
        .values("deployment")
        .annotate(calls=Count("id"), p50=PercentileCont("latency_ms", 0.5), p95=PercentileCont("latency_ms", 0.95))
    )
    window = int(LATENCY_WINDOW.total_seconds() // 60)
    return {
        row["deployment"]: f"p50 {round(row['p50'])} ms · p95 {round(row['p95'])} ms ({row['calls']} in {window} min)"
        for row in rows
    }


def circuits(*, search: str = "") -> list[Circuit]:
    """Every deployment (whose name, provider or alias contains `search`) with its breaker's shared
    state (one Redis read each) and the aliases it serves."""
    aliases: dict[int, list[str]] = {}
    for deployment_id, alias in ChainEntry.objects.values_list("deployment_id", "alias__name").order_by("alias__name"):
        aliases.setdefault(deployment_id, []).append(alias)
    deployments = Deployment.objects.select_related("provider").order_by("name")
    if search:
        deployments = deployments.filter(
            Q(name__icontains=search) | Q(provider__name__icontains=search) | Q(aliases__name__icontains=search)
        ).distinct()
    deployments = list(deployments)
    last_changes = dict(
        BreakerTransition.objects.filter(deployment__in=deployments)
        .order_by()
        .values("deployment_id")
        .annotate(at=Max("created_at"))
        .values_list("deployment_id", "at")
    )
    latency = deployment_latency()
    rows = []
    for deployment in deployments:
        snapshot = breaker_snapshot(deployment.pk)
        rows.append(
            Circuit(
                deployment=deployment,
                aliases=aliases.get(deployment.pk, []),
                state=snapshot["state"],
                label=breaker_state_label(snapshot["state"]),
                open_for_seconds=snapshot["open_for_seconds"],
                last_change=last_changes.get(deployment.pk),
                load=describe_load(deployment),
                latency=latency.get(deployment.name, "-"),
            )
        )
    return rows


def recent_transitions(*, deployments: Sequence[Deployment] | None = None, limit: int = 50) -> list[BreakerTransition]:
    """The latest transitions, of the given deployments only if any are given."""
    transitions = BreakerTransition.objects.select_related("deployment__provider", "actor")
    if deployments is not None:
        transitions = transitions.filter(deployment__in=deployments)
    return list(transitions[:limit])


# --- models and prices ---------------------------------------------------------------------------

PER_MILLION = Decimal(1_000_000)


@dataclass
class ModelOffer:
    name: str
    description: str
    served_by: str  # the deployment tried first
    fallbacks: int  # deployments behind it in the chain
    context_window: int | None  # input tokens (litellm's map), None when unknown
    max_output: int | None
    input_per_million: str  # USD, exact ("0.15", "150")
    output_per_million: str


def models_offered(tenant: Tenant) -> list[ModelOffer]:
    """What `tenant`'s keys may call (its allowlist, or every alias), each with the context window and
    the prices of the deployment that serves it first (its override, else the price table)."""
    from billing.prices import UNPRICED, litellm_price_map, price_at, price_key
    from gateway.models import ModelAlias
    from gateway.upstream.autoroute import AUTO_MODEL
    from gateway.upstream.routing import price_overrides

    sizes = litellm_price_map()
    aliases = ModelAlias.objects.prefetch_related("chain__deployment").order_by("name")
    if tenant.allowed_models:
        aliases = aliases.filter(name__in=tenant.allowed_models)
    offers = []
    for alias in aliases:
        chain = [entry.deployment for entry in alias.chain.all() if entry.deployment.enabled]
        if not chain or alias.name == AUTO_MODEL:
            continue
        first = chain[0]
        overrides = price_overrides(first)
        price = overrides.over(UNPRICED if overrides.complete else price_at(first.litellm_model))
        inp, out = price.input_per_token, price.output_per_token
        size = next((sizes[n] for n in price_key(first.litellm_model) if isinstance(sizes.get(n), dict)), {})
        offers.append(
            ModelOffer(
                name=alias.name,
                description=alias.description,
                served_by=first.name,
                fallbacks=len(chain) - 1,
                context_window=size.get("max_input_tokens"),
                max_output=size.get("max_output_tokens"),
                input_per_million=format((inp * PER_MILLION).normalize(), "f"),
                output_per_million=format((out * PER_MILLION).normalize(), "f"),
            )
        )
    return offers
