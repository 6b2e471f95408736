from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """The ledger's (tenant, created_at) index again, with the status and latency included so the
    dashboard's latency percentiles are an index-only scan; built beside the old one, which then goes,
    without locking the ledger's writes."""

    atomic = False

    dependencies = [
        ("billing", "0016_request_log_status_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="ledgerentry",
            index=models.Index(
                fields=["tenant", "created_at"], include=["status_code", "latency_ms"], name="ledger_tenant_window"
            ),
        ),
        RemoveIndexConcurrently(model_name="ledgerentry", name="billing_led_tenant__ad76bd_idx"),
    ]
