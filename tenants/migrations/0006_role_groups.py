# One group per membership role, with the console permissions of tenants.roles; members who exist
# already get their groups and staff status, as the membership service gives them from now on.

from django.conf import settings
from django.db import migrations


def create_role_groups(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    from tenants.roles import ROLE_GROUPS, role_groups_sync

    # Permissions are normally created after all migrations ran; the groups need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    role_groups_sync(apps=apps)

    Group = apps.get_model("auth", "Group")
    Membership = apps.get_model("tenants", "Membership")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    groups = {group.name: group for group in Group.objects.filter(name__in=ROLE_GROUPS.values())}
    for membership in Membership.objects.all():
        membership.user.groups.add(groups[ROLE_GROUPS[membership.role]])
    User.objects.filter(memberships__isnull=False).update(is_staff=True)


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("tenants", "0005_key_successor"),
        ("billing", "0003_rollups"),
        ("gateway", "0005_cache_entries"),
    ]

    operations = [migrations.RunPython(create_role_groups, migrations.RunPython.noop)]
