"""Sentinel: a self-hosted, multi-tenant LLM gateway."""

from sentinel.celery import app as celery_app

__all__ = ["celery_app"]
