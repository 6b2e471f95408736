"""Django views of the API side: the health probes, metrics, and JSON 404s under /v1. The hot
endpoints (chat completions, models) are served without Django: gateway.http."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.log import log_response
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from gateway import metrics
from gateway.cache import shadow
from gateway.cache.engine import embedder_ready
from gateway.errors import GatewayError
from gateway.upstream import breakers, load
from sentinel.localstate import DATABASE_AWAY, has_loaded
from sentinel.redis_clients import async_redis

log = logging.getLogger(__name__)


def error_response(error: GatewayError) -> HttpResponse:
    response = HttpResponse(error.body(), status=error.status, content_type="application/json")
    for name, value in error.headers.items():
        response[name] = value
    return response


async def not_found(request: HttpRequest, path: str = "") -> HttpResponse:
    return error_response(GatewayError(404, "unknown_url", f"Unknown request URL: {request.method} {request.path}."))


@require_GET
def metrics_export(request: HttpRequest) -> HttpResponse:
    """GET /metrics (Prometheus): see gateway.metrics."""
    registries = (breakers.STATE_REGISTRY, load.LOAD_REGISTRY, shadow.STATE_REGISTRY)
    return HttpResponse(metrics.exposition(*registries), content_type=CONTENT_TYPE_LATEST)


@require_GET
async def live(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"status": "ok"})


def _database_ok() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("select 1")
    except DATABASE_AWAY:
        with contextlib.suppress(*DATABASE_AWAY):
            connection.close()  # broken: the next use of this thread's connection reconnects
        raise


@require_GET
async def ready(request: HttpRequest) -> HttpResponse:
    """Ready when the database and Redis both answer within a second; "degraded" (still 200) when
    only the database does not and this process has configuration to serve from. `semantic_cache`
    says whether the embedding model has loaded (until then the semantic tier is skipped)."""
    failing = []
    try:
        await asyncio.wait_for(sync_to_async(_database_ok)(), 1.0)
    except Exception:  # noqa: BLE001 - whatever the failure, the answer is "not ready"
        failing.append("database")
    try:
        await asyncio.wait_for(async_redis().ping(), 1.0)
    except Exception:  # noqa: BLE001 - whatever the failure, the answer is "not ready"
        failing.append("redis")
    semantic_cache = "ready" if embedder_ready() else "loading"
    if failing == ["database"] and has_loaded():
        # Known keys and models are served from what this process read (gateway.auth): keep it in
        # the load balancer's rotation.
        return JsonResponse({"status": "degraded", "failing": failing, "semantic_cache": semantic_cache})
    if failing:
        response = JsonResponse(
            {"status": "unavailable", "failing": failing, "semantic_cache": semantic_cache}, status=503
        )
        # Not ready is what this probe is for (a process starting, a store away), not a server error:
        # a warning naming what failed, instead of django.request's error for every 503.
        log_response(
            "Not ready: %s did not answer within a second",
            " and ".join(failing),
            response=response,
            request=request,
            logger=log,
            level="warning",
        )
        return response
    return JsonResponse({"status": "ok", "semantic_cache": semantic_cache})
