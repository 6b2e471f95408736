"""The semantic tier searches a static first stage's vectors (gateway/cache/static.py): a column for
them, kept inline (PLAIN) as the MiniLM one is (0007); the partition HNSW indexes were built on the
MiniLM column, so they are dropped here and beat builds them again on the new one
(gateway/cache/indexes.py). Rows filed before have no static vector: a lookup in their partition
computes it (a few hundredths of a millisecond each)."""

import pgvector.django
from django.db import migrations

DROP_PARTITION_INDEXES = r"""
do $$
declare name text;
begin
  for name in
    select c.relname from pg_index i join pg_class c on c.oid = i.indexrelid
    where i.indrelid = 'gateway_cacheentry'::regclass and c.relname like 'cache\_hnsw\_p\_%'
  loop
    execute format('drop index if exists %I', name);
  end loop;
end $$;
"""


class Migration(migrations.Migration):
    dependencies = [("gateway", "0019_chunk_store_search_index")]

    operations = [
        migrations.AddField(
            model_name="cacheentry",
            name="static_embedding",
            field=pgvector.django.VectorField(dimensions=256, null=True),
        ),
        migrations.RunSQL(
            "alter table gateway_cacheentry alter column static_embedding set storage plain",
            migrations.RunSQL.noop,
        ),
        migrations.RunSQL(DROP_PARTITION_INDEXES, migrations.RunSQL.noop),
    ]
