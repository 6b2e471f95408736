# Batches and screening came in side by side, each syncing the role groups with what existed then:
# sync once more after both, so every role holds every permission tenants.roles lists.

from django.db import migrations

from tenants.roles import role_groups_sync_in_migration


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0008_batch_role_permissions"),
        ("screening", "0002_role_permissions"),
    ]

    operations = [migrations.RunPython(role_groups_sync_in_migration, migrations.RunPython.noop)]
