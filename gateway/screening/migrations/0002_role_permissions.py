# The tenant admins' role group gets the screening permissions (tenants.roles).

from django.db import migrations


def sync_role_groups(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    from tenants.roles import role_groups_sync

    # Permissions are normally created after all migrations ran; the groups need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    role_groups_sync(apps=apps)


class Migration(migrations.Migration):
    dependencies = [
        ("screening", "0001_screening_policy"),
        ("tenants", "0006_role_groups"),
    ]

    operations = [migrations.RunPython(sync_role_groups, migrations.RunPython.noop)]
