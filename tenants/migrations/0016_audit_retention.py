# The audit log's retention: the append-only trigger lets one kind of DELETE through, that of a row
# older than both the cutoff the pruning session names (SET LOCAL sentinel.audit_prune_before) and
# the floor written here (AUDIT_RETENTION_FLOOR_DAYS), so no session, whatever it sets, deletes a
# recent entry; UPDATE stays refused.

from django.db import migrations

RETENTION = """
CREATE OR REPLACE FUNCTION tenants_auditentry_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cutoff text := current_setting('sentinel.audit_prune_before', true);
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(cutoff, '') <> ''
            AND OLD.created_at < cutoff::timestamptz
            AND OLD.created_at < now() - interval '30 days' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit log is append-only: % refused', TG_OP;
END $$;
"""
APPEND_ONLY = """
CREATE OR REPLACE FUNCTION tenants_auditentry_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % refused', TG_OP;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("tenants", "0015_tenant_budget_fallback")]

    operations = [migrations.RunSQL(RETENTION, APPEND_ONLY)]
