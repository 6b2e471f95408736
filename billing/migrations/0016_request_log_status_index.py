from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """The request log filtered by status (docs/console.md, "List pages at scale"). Built without
    locking the ledger's writes: a big ledger takes a while to index."""

    atomic = False

    dependencies = [
        ("billing", "0015_dashboard_rollups"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="ledgerentry",
            index=models.Index(fields=["tenant", "status_code", "created_at"], name="ledger_tenant_status"),
        ),
    ]
