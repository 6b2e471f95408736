"""HTTP endpoints of the OpenAI-compatible API and the health probes (async views)."""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from gateway import metrics, pipeline
from gateway.auth import authenticate, ensure_not_blocked
from gateway.errors import GatewayError
from gateway.pipeline import Reply
from gateway.routing import model_names
from sentinel.redis_clients import async_redis


def to_response(reply: Reply) -> HttpResponse:
    if reply.stream is not None:
        response = StreamingHttpResponse(reply.stream, status=reply.status)
    else:
        response = HttpResponse(reply.body, status=reply.status, content_type="application/json")
    for name, value in reply.headers.items():
        response[name] = value
    return response


def error_response(error: GatewayError) -> HttpResponse:
    response = HttpResponse(error.body(), status=error.status, content_type="application/json")
    for name, value in error.headers.items():
        response[name] = value
    return response


async def chat_completions(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return error_response(
            GatewayError(405, "method_not_allowed", "Use POST for /v1/chat/completions.", headers={"allow": "POST"})
        )
    return to_response(await pipeline.chat_completions(request.headers, request.body))


async def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return error_response(
            GatewayError(405, "method_not_allowed", "Use GET for /v1/models.", headers={"allow": "GET"})
        )
    try:
        key = await authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
        await ensure_not_blocked(key)
    except GatewayError as error:
        return error_response(error)
    names = [name for name in await sync_to_async(model_names)() if key.may_use(name)]
    return JsonResponse(
        {
            "object": "list",
            "data": [{"id": name, "object": "model", "created": 0, "owned_by": "sentinel"} for name in sorted(names)],
        }
    )


async def not_found(request: HttpRequest, path: str = "") -> HttpResponse:
    return error_response(GatewayError(404, "unknown_url", f"Unknown request URL: {request.method} {request.path}."))


@require_GET
def metrics_export(request: HttpRequest) -> HttpResponse:
    """GET /metrics (Prometheus): see gateway.metrics."""
    return HttpResponse(metrics.exposition(), content_type=CONTENT_TYPE_LATEST)


@require_GET
async def live(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"status": "ok"})


def _database_ok() -> None:
    with connection.cursor() as cursor:
        cursor.execute("select 1")


@require_GET
async def ready(request: HttpRequest) -> HttpResponse:
    """Ready when the database and Redis both answer within a second."""
    failing = []
    try:
        await asyncio.wait_for(sync_to_async(_database_ok)(), 1.0)
    except Exception:
        failing.append("database")
    try:
        await asyncio.wait_for(async_redis().ping(), 1.0)
    except Exception:
        failing.append("redis")
    if failing:
        return JsonResponse({"status": "unavailable", "failing": failing}, status=503)
    return JsonResponse({"status": "ok"})
