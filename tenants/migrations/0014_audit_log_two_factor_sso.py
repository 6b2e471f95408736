# The audit log (append-only: a trigger refuses UPDATE and DELETE of its rows), tenants that require
# two-factor sign-in, single sign-on rules; tenant admins get to read the audit log.

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

from tenants.roles import role_groups_sync_in_migration

APPEND_ONLY = """
CREATE FUNCTION tenants_auditentry_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % refused', TG_OP;
END $$;
CREATE TRIGGER tenants_auditentry_append_only BEFORE UPDATE OR DELETE ON tenants_auditentry
    FOR EACH ROW EXECUTE FUNCTION tenants_auditentry_append_only();
"""
DROP_APPEND_ONLY = """
DROP TRIGGER tenants_auditentry_append_only ON tenants_auditentry;
DROP FUNCTION tenants_auditentry_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0013_shadow_verification"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="require_two_factor",
            field=models.BooleanField(
                default=False,
                help_text="Members must sign in to the console with a one-time code (TOTP) as well as their password; members without an authenticator app enrol at their next sign-in. Single sign-on users are exempt: their identity provider checks them.",
            ),
        ),
        migrations.CreateModel(
            name="SingleSignOnRule",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "role",
                    models.CharField(
                        choices=[("admin", "Admin"), ("finance", "Finance"), ("viewer", "Viewer")],
                        default="viewer",
                        max_length=16,
                    ),
                ),
                (
                    "email_domain",
                    models.CharField(
                        blank=True,
                        help_text="e.g. example.com: people whose verified email is at this domain.",
                        max_length=200,
                    ),
                ),
                (
                    "group",
                    models.CharField(blank=True, help_text="A value of the provider's groups claim.", max_length=200),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="sso_rules", to="tenants.tenant"
                    ),
                ),
            ],
            options={
                "verbose_name": "single sign-on rule",
                "ordering": ["tenant__name", "role"],
            },
        ),
        migrations.CreateModel(
            name="AuditEntry",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("created_at", models.DateTimeField(db_index=True, default=django.utils.timezone.now, editable=False)),
                ("actor_name", models.CharField(blank=True, help_text="Empty: Sentinel itself.", max_length=150)),
                ("address", models.GenericIPAddressField(blank=True, help_text="The client's address.", null=True)),
                (
                    "action",
                    models.CharField(
                        choices=[
                            ("key.issued", "Key issued"),
                            ("key.rotated", "Key rotated"),
                            ("key.revoked", "Key revoked"),
                            ("object.changed", "Changed"),
                            ("object.added", "Added"),
                            ("object.deleted", "Deleted"),
                            ("tenant.status", "Tenant suspended or reactivated"),
                            ("member.added", "Member added"),
                            ("member.role", "Member's role changed"),
                            ("member.removed", "Member removed"),
                            ("login.succeeded", "Signed in"),
                            ("login.sso", "Signed in with single sign-on"),
                            ("login.failed", "Sign-in failed"),
                            ("twofactor.enrolled", "Two-factor sign-in enrolled"),
                            ("twofactor.removed", "Two-factor sign-in removed"),
                            ("export.downloaded", "Export downloaded"),
                        ],
                        max_length=32,
                    ),
                ),
                ("target", models.CharField(blank=True, help_text="What was acted on.", max_length=300)),
                (
                    "changes",
                    models.JSONField(blank=True, default=dict, help_text="{field: [before, after]}; secrets never."),
                ),
                ("detail", models.CharField(blank=True, max_length=500)),
                (
                    "actor",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        help_text="Empty: the installation's (operators only).",
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="tenants.tenant",
                    ),
                ),
            ],
            options={
                "verbose_name": "audit log entry",
                "verbose_name_plural": "audit log",
                "ordering": ["-created_at", "-id"],
                "indexes": [models.Index(fields=["tenant", "-created_at"], name="tenants_aud_tenant__08063f_idx")],
            },
        ),
        migrations.CreateModel(
            name='SingleSignOnIdentity',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('issuer', models.CharField(max_length=500)),
                ('subject', models.CharField(max_length=255)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='sso_identity', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('issuer', 'subject'), name='sso_identity_unique_subject')],
            },
        ),
        migrations.RunSQL(APPEND_ONLY, DROP_APPEND_ONLY),
        migrations.RunPython(role_groups_sync_in_migration, migrations.RunPython.noop),
    ]
