"""A store's full-text matches found in one GIN index over (store, text vector): btree_gin (a
trusted contrib extension) lets the store's id into it (gateway/knowledge/services.py)."""

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.operations import BtreeGinExtension
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("gateway", "0018_chunk_embeddings_inline")]

    operations = [
        BtreeGinExtension(),
        migrations.RemoveIndex(model_name="chunk", name="chunk_search"),
        migrations.AddIndex(
            model_name="chunk", index=GinIndex(fields=["store", "search"], name="chunk_store_search")
        ),
    ]
