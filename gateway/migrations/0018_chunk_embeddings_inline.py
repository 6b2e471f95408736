"""Chunk embeddings kept inline (PLAIN), as the semantic cache's are (0007): a small store is searched
exactly, and a TOASTed vector would cost a detoast per row (gateway/knowledge/indexes.py)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("gateway", "0017_knowledge_base_permissions")]

    operations = [
        migrations.RunSQL(
            "alter table gateway_chunk alter column embedding set storage plain",
            "alter table gateway_chunk alter column embedding set storage extended",
        ),
    ]
