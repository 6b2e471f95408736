"""Prices on the request path: a change mid-day takes effect at once in a running gateway, and each
request keeps the version it was billed at, in the ledger and in the report."""

from __future__ import annotations

import importlib
from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace

from django.utils import timezone
from openai import OpenAI

from billing.models import LedgerEntry
from billing.prices import litellm_price_map, seeded_prices
from billing.selectors import spend_report
from billing.services import price_create, spend_roll_up
from tests.billing.conftest import drain_all
from tests.conftest import unique


def ask(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def test_price_change_mid_day_each_request_keeps_its_version(gateway, tenant, make_key, make_model):
    model = unique("priced")
    v1 = price_create(
        model=model,
        input_per_token=Decimal("0.000001"),
        output_per_token=Decimal("0.000002"),
        effective_from=timezone.now() - timedelta(hours=1),
    )
    alias, _ = make_model(litellm_model=f"openai/{model}")
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0, timeout=30)

    def call(prompt: str):
        return client.chat.completions.with_raw_response.create(model=alias, messages=ask(prompt))

    before = [call(f"before {i}") for i in range(3)]
    v2 = price_create(model=model, input_per_token=Decimal("0.000003"), output_per_token=Decimal("0.000005"))
    after = [call(f"after {i}") for i in range(4)]
    drain_all()

    rows = {row.request_id: row for row in LedgerEntry.objects.filter(tenant=tenant)}
    for responses, version in ((before, v1), (after, v2)):
        for raw in responses:
            row = rows[raw.headers["x-sentinel-request-id"]]
            assert row.price_id == version.pk
            expected = row.prompt_tokens * version.input_per_token + row.completion_tokens * version.output_per_token
            assert row.cost_usd == expected
            assert str(row.cost_usd) == raw.headers["x-sentinel-cost-usd"]

    today = timezone.now().date()
    for rolled_up in (False, True):
        if rolled_up:
            spend_roll_up()
        report = spend_report(tenants=[tenant], start=today, end=today, group_by=["day", "model", "price"])
        assert [(row.price, row.metrics["requests"]) for row in report.rows] == [(v1, 3), (v2, 4)]
        for row, version in zip(report.rows, (v1, v2), strict=True):
            assert row.metrics["cost_usd"] == sum(r.cost_usd for r in rows.values() if r.price_id == version.pk)


def test_the_seed_is_litellm_s_bundled_map_as_exact_decimals():
    columns = dict(seeded_prices(litellm_price_map()))
    seeded = {model: (c["input_per_token"], c["output_per_token"]) for model, c in columns.items()}
    assert seeded["gpt-4o-mini"] == (Decimal("0.00000015"), Decimal("0.0000006"))
    # Embedding models too (they have no output price): before, they were not seeded and billed at 0.
    assert seeded["text-embedding-3-small"] == (Decimal("0.00000002"), Decimal(0))
    assert all(isinstance(inp, Decimal) and isinstance(out, Decimal) for inp, out in seeded.values())
    # The other kinds where the map has them, as exact: Claude Haiku 4.5's cache and batch rates.
    assert columns["claude-haiku-4-5"] == {
        "input_per_token": Decimal("0.000001"),
        "output_per_token": Decimal("0.000005"),
        "cache_read_per_token": Decimal("0.0000001"),
        "cache_write_per_token": Decimal("0.00000125"),
        "batch_input_per_token": Decimal("0.0000005"),
        "batch_output_per_token": Decimal("0.0000025"),
        "batch_cache_read_per_token": Decimal("0.00000005"),
        "batch_cache_write_per_token": Decimal("0.000000625"),
    }


def test_the_kinds_migration_fills_unbilled_versions_in_place_and_adds_a_version_to_billed_ones(tenant):
    """billing/migrations/0012, run again (rolled back) on the seeded table with the kinds emptied:
    every seeded version no request was billed at gets them in place, exactly the map's; the one a
    request was billed at stays as it was, and the kinds come as a new version."""
    from django.apps import apps
    from django.db import connection, transaction

    from billing.models import Price
    from billing.prices import KIND_COLUMNS

    fill = importlib.import_module("billing.migrations.0012_token_kind_prices_from_litellm").fill
    seeded = Price.objects.filter(source="litellm")
    filled = {price.pk: [getattr(price, column) for column in KIND_COLUMNS] for price in seeded}
    with transaction.atomic():
        seeded.update(**dict.fromkeys(KIND_COLUMNS))
        billed = Price.objects.get(model="gpt-4o-mini", source="litellm")
        LedgerEntry.objects.create(
            request_id=unique("billed"),
            created_at=timezone.now(),
            tenant=tenant,
            model_requested="m",
            status_code=200,
            price=billed,
        )
        fill(apps, SimpleNamespace(connection=connection))

        again = {price.pk: [getattr(price, column) for column in KIND_COLUMNS] for price in seeded}
        # Requests of other tests were billed at some seeded versions too: those got new versions as well.
        used = set(LedgerEntry.objects.filter(price__in=seeded).values_list("price_id", flat=True))
        assert billed.pk in used
        assert {pk for pk in filled if again[pk] != filled[pk]} == {pk for pk in used if any(filled[pk])}
        assert again[billed.pk] == [None] * len(KIND_COLUMNS)
        old, new = Price.objects.filter(model="gpt-4o-mini").order_by("effective_from")
        assert old.pk == billed.pk
        assert (new.input_per_token, new.cache_read_per_token, new.batch_input_per_token, new.source) == (
            Decimal("0.00000015"),
            Decimal("0.000000075"),
            Decimal("0.000000075"),
            "litellm",
        )
        transaction.set_rollback(True)
