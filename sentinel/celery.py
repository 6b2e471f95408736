"""The Celery app: ledger batches, cache stores, webhooks, exports, and beat's periodic jobs."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sentinel.settings")

app = Celery("sentinel")


@app.on_configure.connect
def _storage(sender: Celery, **kwargs: object) -> None:
    """A worker or beat started on its own (`celery -A sentinel worker`) with nothing set gets the
    embedded servers, before Celery reads settings; settings themselves start nothing."""
    from sentinel.embedded import ensure_environment

    ensure_environment()


app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
