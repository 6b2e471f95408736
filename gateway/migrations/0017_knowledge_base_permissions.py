"""Tenant admins manage their tenant's vector stores in the console (tenants.roles)."""

from django.db import migrations

from tenants.roles import role_groups_sync_in_migration


class Migration(migrations.Migration):
    dependencies = [
        ("gateway", "0016_knowledge_bases"),
        ("tenants", "0020_key_search_indexes"),
    ]

    operations = [migrations.RunPython(role_groups_sync_in_migration, migrations.RunPython.noop)]
