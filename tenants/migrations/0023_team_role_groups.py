from django.db import migrations

from tenants.roles import role_groups_sync_in_migration


class Migration(migrations.Migration):
    """The team roles' groups (Team admins, Team viewers), and the tenant roles' permissions on teams."""

    dependencies = [
        ("tenants", "0022_teams"),
        ("billing", "0024_ledger_team"),
    ]

    operations = [migrations.RunPython(role_groups_sync_in_migration, migrations.RunPython.noop)]
