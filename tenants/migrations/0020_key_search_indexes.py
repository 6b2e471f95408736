import django.contrib.postgres.indexes
import django.db.models.functions.text
from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations


def search_index(name: str, column: str):
    """The index as the model declares it, created by SQL: Django 5.2 writes an OpClass over an
    expression inside one pair of parentheses too many (`((UPPER("name") gin_trgm_ops))`), which
    PostgreSQL refuses."""
    return migrations.SeparateDatabaseAndState(
        database_operations=[
            migrations.RunSQL(
                f'CREATE INDEX "{name}" ON "tenants_virtualkey" USING gin ((UPPER("{column}")) gin_trgm_ops)',
                f'DROP INDEX "{name}"',
            )
        ],
        state_operations=[
            migrations.AddIndex(
                model_name="virtualkey",
                index=django.contrib.postgres.indexes.GinIndex(
                    django.contrib.postgres.indexes.OpClass(
                        django.db.models.functions.text.Upper(column), name="gin_trgm_ops"
                    ),
                    name=name,
                ),
            )
        ],
    )


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0019_list_order_indexes"),
    ]

    operations = [
        TrigramExtension(),  # pg_trgm, for the key list's search
        search_index("key_name_search", "name"),
        search_index("key_prefix_search", "prefix"),
    ]
