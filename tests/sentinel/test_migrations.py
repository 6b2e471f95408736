"""Every model change has its migration (a model edited without one would leave the database behind)."""

from io import StringIO

from django.core.management import call_command


def test_no_model_change_lacks_a_migration(live_db):
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)  # exits 1 on a missing migration
    assert out.getvalue().strip() == "No changes detected"
