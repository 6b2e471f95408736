"""The prices of the other kinds of token (cache reads and writes, reasoning, batch) from litellm's
bundled map, for the models seeded from it whose seeded price is still the one in force and still
the map's. As an edit in the admin is: a version no request was billed at yet is filled in place;
one already used stays as it was (those requests were billed without these rates) and the rates
come as a new version from now on.

Written in SQL where the ORM was slow: bulk_update's CASE per column and row took 15 s for the
~1,700 seeded rows (one UPDATE from arrays: under a second), and "which versions were billed at"
is asked per version through the ledger's price index, never by scanning the ledger."""

from django.db import migrations
from django.utils import timezone


def fill(apps, schema_editor):
    from billing.prices import KIND_COLUMNS, litellm_price_map, seeded_prices

    Price = apps.get_model("billing", "Price")
    LedgerEntry = apps.get_model("billing", "LedgerEntry")
    published = dict(seeded_prices(litellm_price_map()))
    newest = {}
    for price in Price.objects.filter(model__in=published).order_by("model", "-effective_from"):
        newest.setdefault(price.model, price)
    candidates = []
    for model, price in newest.items():
        rates = published[model]
        same_base = (price.input_per_token, price.output_per_token) == (
            rates["input_per_token"],
            rates["output_per_token"],
        )
        filled = any(getattr(price, column) is not None for column in KIND_COLUMNS)
        if price.source == "litellm" and same_base and not filled and len(rates) > 2:
            candidates.append(price)
    columns = list(KIND_COLUMNS)
    ledger, prices = LedgerEntry._meta.db_table, Price._meta.db_table
    billed_at = (
        f"SELECT v.id FROM unnest(%s::bigint[]) AS v(id) WHERE EXISTS (SELECT 1 FROM {ledger} WHERE price_id = v.id)"
    )
    arrays = ", ".join(["%s::bigint[]"] + ["%s::numeric[]"] * len(columns))
    assignments = ", ".join(f"{column} = v.{column}" for column in columns)
    fill_in = (
        f"UPDATE {prices} AS p SET {assignments} "
        f"FROM unnest({arrays}) AS v(id, {', '.join(columns)}) WHERE p.id = v.id"
    )
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(billed_at, [[price.pk for price in candidates]])
        used = {row[0] for row in cursor.fetchall()}
        in_place = [price for price in candidates if price.pk not in used]
        by_column = [[published[price.model].get(column) for price in in_place] for column in columns]
        cursor.execute(fill_in, [[price.pk for price in in_place], *by_column])
    now = timezone.now()
    Price.objects.bulk_create(
        [
            Price(model=price.model, effective_from=now, source="litellm", **published[price.model])
            for price in candidates
            if price.pk in used
        ],
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [("billing", "0011_token_kind_prices_and_ledger_columns")]

    operations = [migrations.RunPython(fill, migrations.RunPython.noop)]
