"""Structured logs: one JSON object per line on stdout, each carrying the id of the request it was
emitted in. python-json-logger formats; this module adds the request id (a context variable that
sentinel.asgi sets where a request enters) and holds the one logging configuration that Django
(settings.LOGGING) and uvicorn (sentinel.web) both apply.

Prompts and answers are never logged: nothing in Sentinel logs a message body, and litellm, which
logs whole requests at DEBUG, is held at WARNING whatever SENTINEL_LOG_LEVEL says.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from pythonjsonlogger.core import RESERVED_ATTRS

request_id: ContextVar[str | None] = ContextVar("sentinel_request_id", default=None)

# Loggers of litellm (they log request bodies at DEBUG; see providers.adopt_litellm_loggers).
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")
_OWN_LOGGERS = ("sentinel", "tenants", "gateway", "billing")
# Celery's loggers of each task received and finished, and of each periodic task sent.
CELERY_PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace", "celery.beat")


class RequestIdFilter(logging.Filter):
    """Stamps every record with the current request's id (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class ClientFaultFilter(logging.Filter):
    """Django logs each SuspiciousOperation (an admin query string filtering across a relation the
    admin does not offer, a forged Host header, a tampered session) at ERROR with a traceback on a
    django.security.* logger, and answers 400. The fault is the client's: one warning line, no
    traceback. (On a handler of its own: a filter on a handler sees records of child loggers.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


def config(level: str) -> dict:
    """The logging configuration (logging.config.dictConfig) for every Sentinel process."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "request_id": {"()": "sentinel.logs.RequestIdFilter"},
            "client_fault": {"()": "sentinel.logs.ClientFaultFilter"},
        },
        "formatters": {
            "json": {
                "()": "pythonjsonlogger.orjson.OrjsonFormatter",
                "fmt": "%(levelname)s %(name)s %(message)s %(request_id)s",
                "timestamp": "time",  # ISO 8601, UTC
                "rename_fields": {"levelname": "level", "name": "logger"},
                # Attributes others add to records that say nothing: uvicorn's ANSI-coloured copy of
                # the message, litellm's marker of records its redaction filter has seen.
                "reserved_attrs": [*RESERVED_ATTRS, "color_message", "litellm_redacted"],
            }
        },
        "handlers": {
            "stdout": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stdout",
                "formatter": "json",
                "filters": ["request_id"],
            },
            "client_faults": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stdout",
                "formatter": "json",
                "filters": ["request_id", "client_fault"],
            },
        },
        "root": {"handlers": ["stdout"], "level": "WARNING"},
        "loggers": {
            **{name: {"level": level} for name in _OWN_LOGGERS},
            # Django logs every 4xx as a warning: the request log already says it, once.
            "django.request": {"level": "ERROR"},
            "django.security": {"handlers": ["client_faults"], "level": "WARNING", "propagate": False},
            # uvicorn and celery install handlers of their own; these replace them with ours.
            "uvicorn": {"handlers": ["stdout"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"level": "INFO"},
            "celery": {"handlers": ["stdout"], "level": "INFO", "propagate": False},
            # One line per task received, run and scheduled is ~1 MB a quarter-hour of beat's periodic
            # jobs: a quiet system logs nothing at INFO. Failures still log (at ERROR).
            **{name: {"level": "WARNING"} for name in CELERY_PER_TASK_LOGGERS},
            **{name: {"handlers": [], "level": "WARNING", "propagate": True} for name in LITELLM_LOGGERS},
        },
    }


def adopt_loggers(names: tuple[str, ...]) -> None:
    """Send loggers that a library equipped with its own handlers through Sentinel's instead
    (needed for libraries imported after the configuration was applied, as litellm is)."""
    for name in names:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
        if logger.level == logging.NOTSET or logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)
