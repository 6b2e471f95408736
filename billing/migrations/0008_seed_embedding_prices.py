"""Embedding models' prices from litellm's bundled map (the first seed had chat models only, so
embeddings were billed at nothing): only the models not in the table yet are added."""

from django.db import migrations


def seed(apps, schema_editor):
    from billing.prices import seed_from_litellm

    seed_from_litellm(apps.get_model("billing", "Price"))


class Migration(migrations.Migration):
    dependencies = [("billing", "0007_alter_ledgerentry_options")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
