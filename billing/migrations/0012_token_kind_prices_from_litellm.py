"""The prices of the other kinds of token (cache reads and writes, reasoning, batch) from litellm's
bundled map, for the models seeded from it whose seeded price is still the one in force and still
the map's. As an edit in the admin is: a version no request was billed at yet is filled in place;
one already used stays as it was (those requests were billed without these rates) and the rates
come as a new version from now on."""

from django.db import migrations
from django.utils import timezone


def fill(apps, schema_editor):
    from billing.prices import KIND_COLUMNS, litellm_price_map, seeded_prices

    Price = apps.get_model("billing", "Price")
    LedgerEntry = apps.get_model("billing", "LedgerEntry")
    published = {model: columns for model, columns in seeded_prices(litellm_price_map())}
    newest = {}
    for price in Price.objects.filter(model__in=published).order_by("model", "-effective_from"):
        newest.setdefault(price.model, price)
    in_place, versions = [], []
    used = set(LedgerEntry.objects.exclude(price=None).values_list("price_id", flat=True).distinct())
    now = timezone.now()
    for model, price in newest.items():
        columns = published[model]
        kinds = {column: value for column, value in columns.items() if column in KIND_COLUMNS}
        same_base = (price.input_per_token, price.output_per_token) == (
            columns["input_per_token"],
            columns["output_per_token"],
        )
        if price.source != "litellm" or not kinds or not same_base:
            continue
        if any(getattr(price, column) is not None for column in KIND_COLUMNS):
            continue  # filled already
        if price.pk in used:
            versions.append(Price(model=model, effective_from=now, source="litellm", **columns))
        else:
            for column, value in kinds.items():
                setattr(price, column, value)
            in_place.append(price)
    Price.objects.bulk_update(in_place, list(KIND_COLUMNS), batch_size=1000)
    Price.objects.bulk_create(versions, batch_size=1000)


class Migration(migrations.Migration):
    dependencies = [("billing", "0011_token_kind_prices_and_ledger_columns")]

    operations = [migrations.RunPython(fill, migrations.RunPython.noop)]
