"""The semantic cache drops its table-wide HNSW index for per-partition ones (gateway/cache/indexes.py)
and keeps embeddings inline (PLAIN): exact scans of small partitions would otherwise detoast every row."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("gateway", "0006_batches_caps_and_concurrency")]

    operations = [
        migrations.RemoveIndex(model_name="cacheentry", name="cache_embedding_hnsw"),
        migrations.RunSQL(
            "alter table gateway_cacheentry alter column embedding set storage plain",
            "alter table gateway_cacheentry alter column embedding set storage extended",
        ),
    ]
