"""The ledger becomes a table partitioned by month (billing/partitions.py, docs/billing.md).

Every row is copied into its month's partition in one transaction: on a large ledger this takes a
while (about a minute per million rows on the benchmark machine) and holds the ledger's writes,
which wait in the ledger stream meanwhile. The Django model does not change: its primary key is
still `id` to the ORM, (id, created_at) in the database.
"""

from django.db import migrations


def forward(apps, schema_editor):
    from billing.partitions import partition_table

    with schema_editor.connection.cursor() as cursor:
        partition_table(cursor)


def backward(apps, schema_editor):
    from billing.partitions import unpartition_table

    with schema_editor.connection.cursor() as cursor:
        unpartition_table(cursor)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0020_rollup_images"),
    ]

    operations = [migrations.RunPython(forward, backward)]
