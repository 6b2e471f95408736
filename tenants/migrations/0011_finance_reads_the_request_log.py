# Finance reads (and downloads) its tenants' request log: the role groups get the permission.

from django.db import migrations

from tenants.roles import role_groups_sync_in_migration


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0010_tenant_log_prompts"),
        ("billing", "0007_alter_ledgerentry_options"),
    ]

    operations = [migrations.RunPython(role_groups_sync_in_migration, migrations.RunPython.noop)]
