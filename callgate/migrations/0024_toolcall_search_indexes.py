"""The search's indexes (``callgate.search``, ``selectors.search_q``): the conversation ID
within a project, and on PostgreSQL a trigram GIN index of the upper-cased error text, which
serves ``observation__icontains`` (Django writes it ``UPPER(observation::text) LIKE
UPPER(%s)``) at any position of the text. SQLite has neither ``pg_trgm`` nor GIN: there the
trigram steps do nothing and the search reads the project's calls."""

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations, models

TRIGRAM_INDEX = "toolcall_observation_trgm"


def trigram_index_create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {TRIGRAM_INDEX} ON callgate_toolcall "
            "USING gin (UPPER(observation) gin_trgm_ops)"
        )


def trigram_index_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {TRIGRAM_INDEX}")


class Migration(migrations.Migration):
    dependencies = [
        ("callgate", "0023_toolcall_decision_arguments"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(
                fields=["project", "conversation_id"], name="toolcall_project_conversation"
            ),
        ),
        TrigramExtension(),  # CREATE EXTENSION pg_trgm on PostgreSQL; nothing elsewhere
        migrations.RunPython(trigram_index_create, trigram_index_drop),
    ]
