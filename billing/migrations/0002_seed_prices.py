from django.db import migrations


def seed(apps, schema_editor):
    from billing.prices import seed_from_litellm

    seed_from_litellm(apps.get_model("billing", "Price"))


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
