"""/v1/vector_stores, OpenAI-compatible (async views on the API handler, as /v1/files and /v1/batches
are): authenticated with a virtual key and scoped to its tenant; another tenant's ids are 404."""

from __future__ import annotations

import re
import time

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Count, Q, QuerySet, Sum
from django.http import HttpRequest, HttpResponse

from billing.ledger import LedgerRecord, hand_off
from billing.money import format_usd
from gateway.auth import KeyInfo
from gateway.batches import selectors as file_selectors
from gateway.batches.models import BatchFile
from gateway.batches.views import (
    caller,
    error_response,
    json_response,
    list_response,
    method_not_allowed,
    not_found,
    page_size,
)
from gateway.cache import engine
from gateway.call import request_id_from
from gateway.errors import GatewayError, invalid_request
from gateway.knowledge import filters, schemas, services
from gateway.knowledge.models import VectorStore, VectorStoreFile

STORE_ID = re.compile(r"vs_[0-9a-f]{24}")  # whole: fullmatch
# What a /search call is filed under in the ledger's model column.
SEARCH_MODEL = "vector_store.search"


def with_counts(stores: QuerySet[VectorStore]) -> QuerySet[VectorStore]:
    """The stores with their files counted by status and their usage, in the same query."""
    status = VectorStoreFile.Status
    return stores.annotate(
        files_total=Count("files"),
        files_in_progress=Count("files", filter=Q(files__status=status.IN_PROGRESS)),
        files_completed=Count("files", filter=Q(files__status=status.COMPLETED)),
        files_failed=Count("files", filter=Q(files__status=status.FAILED)),
        files_usage=Sum("files__usage_bytes"),
    )


def recounted(store: VectorStore) -> VectorStore:
    return with_counts(VectorStore.objects.filter(pk=store.pk)).get()


def store_object(store: VectorStore) -> dict:
    """`store` as the API shows it; from with_counts()."""
    counts = {
        "in_progress": store.files_in_progress,
        "completed": store.files_completed,
        "failed": store.files_failed,
        "cancelled": 0,
        "total": store.files_total,
    }
    return {
        "id": store.public_id,
        "object": "vector_store",
        "created_at": file_selectors.stamp(store.created_at),
        "name": store.name,
        "description": store.description or None,
        "usage_bytes": store.files_usage or 0,
        "file_counts": counts,
        "status": "in_progress" if counts["in_progress"] else "completed",
        "expires_after": None,
        "expires_at": None,
        "last_active_at": file_selectors.stamp(store.last_active_at),
        "metadata": store.metadata,
    }


def file_object(entry: VectorStoreFile) -> dict:
    return {
        "id": entry.file.public_id,
        "object": "vector_store.file",
        "created_at": file_selectors.stamp(entry.created_at),
        "vector_store_id": entry.store.public_id,
        "status": entry.status,
        "last_error": entry.last_error,
        "usage_bytes": entry.usage_bytes,
        "attributes": entry.attributes,
        "chunking_strategy": {"type": "other"},  # by the document's structure (docs/knowledge.md)
    }


def _store_for(key: KeyInfo, public_id: str, *, counted: bool = False) -> VectorStore:
    store = None
    if STORE_ID.fullmatch(public_id):
        found = VectorStore.objects.filter(tenant_id=key.tenant_id, public_id=public_id)
        store = (with_counts(found) if counted else found).first()
    if store is None:
        raise not_found("vector_store", public_id)
    return store


def _file_for(key: KeyInfo, public_id: str, param: str = "file_id") -> BatchFile:
    file = file_selectors.file_for(tenant_id=key.tenant_id, public_id=public_id, with_content=False)
    if file is None:
        raise not_found("file", public_id, param=param)
    if file.purpose != BatchFile.Purpose.ASSISTANTS:
        raise invalid_request(
            f"The file '{public_id}' was uploaded for '{file.purpose}': a vector store takes files of purpose "
            "'assistants'.",
            param=param,
            code="invalid_value",
        )
    return file


async def _answer(request: HttpRequest, methods: str, handle) -> HttpResponse:
    if request.method not in methods.split(","):
        return method_not_allowed(request, methods)
    try:
        key = await caller(request)
        return await handle(key)
    except GatewayError as error:
        return error_response(error)


# --- stores --------------------------------------------------------------------------------------


async def stores(request: HttpRequest) -> HttpResponse:
    async def handle(key: KeyInfo) -> HttpResponse:
        if request.method == "POST":
            create = schemas.parse(schemas.StoreCreate, request.body, schemas.STORE_IDENTIFIERS)
            return await sync_to_async(_create)(key, create)
        return await sync_to_async(_list)(key, page_size(request, 20, 100), request.GET.get("after"))

    return await _answer(request, "GET,POST", handle)


def _quota_error(exc: services.QuotaExceeded, param: str) -> GatewayError:
    return GatewayError(400, "storage_quota_exceeded", str(exc), param=param)


@transaction.atomic  # a file over the quota leaves no store behind
def _create(key: KeyInfo, create: schemas.StoreCreate) -> HttpResponse:
    files = [_file_for(key, file_id, param="file_ids") for file_id in dict.fromkeys(create.file_ids or [])]
    store = services.store_create(
        tenant_id=key.tenant_id,
        name=create.name or "",
        description=create.description or "",
        metadata=create.metadata or {},
    )
    for file in files:
        try:
            services.file_add(store=store, file=file, attributes={})
        except services.QuotaExceeded as exc:
            raise _quota_error(exc, "file_ids") from None
    return json_response(store_object(recounted(store)))


def _list(key: KeyInfo, limit: int, after: str | None) -> HttpResponse:
    found = VectorStore.objects.filter(tenant_id=key.tenant_id)
    if after is not None:
        last = _store_for(key, after)
        found = found.filter(Q(created_at__lt=last.created_at) | Q(created_at=last.created_at, id__lt=last.pk))
    page = list(with_counts(found).order_by("-created_at", "-id")[: limit + 1])
    return list_response([store_object(store) for store in page[:limit]], has_more=len(page) > limit)


async def store(request: HttpRequest, store_id: str) -> HttpResponse:
    async def handle(key: KeyInfo) -> HttpResponse:
        if request.method == "POST":
            update = schemas.parse(schemas.StoreUpdate, request.body, schemas.STORE_IDENTIFIERS)
            return await sync_to_async(_update)(key, store_id, update)
        if request.method == "DELETE":
            return await sync_to_async(_delete)(key, store_id)
        return await sync_to_async(lambda: json_response(store_object(_store_for(key, store_id, counted=True))))()

    return await _answer(request, "GET,POST,DELETE", handle)


def _update(key: KeyInfo, store_id: str, update: schemas.StoreUpdate) -> HttpResponse:
    found = _store_for(key, store_id)
    if update.name is not None:
        found.name = update.name
    if update.metadata is not None:
        found.metadata = update.metadata
    found.save(update_fields=["name", "metadata"])
    return json_response(store_object(recounted(found)))


def _delete(key: KeyInfo, store_id: str) -> HttpResponse:
    services.store_delete(store=_store_for(key, store_id))
    return json_response({"id": store_id, "object": "vector_store.deleted", "deleted": True})


# --- a store's files -----------------------------------------------------------------------------


async def store_files(request: HttpRequest, store_id: str) -> HttpResponse:
    async def handle(key: KeyInfo) -> HttpResponse:
        if request.method == "POST":
            add = schemas.parse(schemas.FileAdd, request.body, schemas.FILE_IDENTIFIERS)
            return await sync_to_async(_add)(key, store_id, add)
        limit = page_size(request, 20, 100)
        status = request.GET.get("filter")
        if status is not None and status not in VectorStoreFile.Status.values:
            raise invalid_request("filter must be in_progress, completed or failed.", param="filter")
        return await sync_to_async(_files)(key, store_id, limit, status)

    return await _answer(request, "GET,POST", handle)


def _add(key: KeyInfo, store_id: str, add: schemas.FileAdd) -> HttpResponse:
    found = _store_for(key, store_id)
    try:
        entry = services.file_add(store=found, file=_file_for(key, add.file_id), attributes=add.attributes or {})
    except services.QuotaExceeded as exc:
        raise _quota_error(exc, "file_id") from None
    return json_response(file_object(VectorStoreFile.objects.select_related("file", "store").get(pk=entry.pk)))


def _files(key: KeyInfo, store_id: str, limit: int, status: str | None) -> HttpResponse:
    entries = VectorStoreFile.objects.filter(store=_store_for(key, store_id)).select_related("file", "store")
    if status is not None:
        entries = entries.filter(status=status)
    page = list(entries.order_by("-created_at", "-id")[: limit + 1])
    return list_response([file_object(entry) for entry in page[:limit]], has_more=len(page) > limit)


async def store_file(request: HttpRequest, store_id: str, file_id: str) -> HttpResponse:
    async def handle(key: KeyInfo) -> HttpResponse:
        return await sync_to_async(_store_file)(key, store_id, file_id, delete=request.method == "DELETE")

    return await _answer(request, "GET,DELETE", handle)


def _store_file(key: KeyInfo, store_id: str, file_id: str, *, delete: bool) -> HttpResponse:
    found = _store_for(key, store_id)
    entry = VectorStoreFile.objects.filter(store=found, file__public_id=file_id).select_related("file", "store").first()
    if entry is None:
        raise not_found("file", file_id)
    if delete:
        services.file_remove(entry=entry)
        return json_response({"id": file_id, "object": "vector_store.file.deleted", "deleted": True})
    return json_response(file_object(entry))


# --- search --------------------------------------------------------------------------------------


async def _record_search(request: HttpRequest, key: KeyInfo, query: str, started: float) -> None:
    """A search's ledger record: the query's tokens and the search's price (no provider was called)."""
    used = services.retrieval_used(query)
    await hand_off(
        LedgerRecord(
            request_id=request_id_from(request.headers.get("x-request-id")),
            tenant_id=key.tenant_id,
            key_id=key.key_id,
            team_id=key.team_id,
            model_requested=SEARCH_MODEL,
            status_code=200,
            provider="sentinel",
            cost_usd=format_usd(used.cost),
            retrieval_tokens=used.tokens,
            retrieval_cost_usd=format_usd(used.cost),
            latency_ms=int((time.perf_counter() - started) * 1000),
        )
    )


async def search(request: HttpRequest, store_id: str) -> HttpResponse:
    started = time.perf_counter()

    async def handle(key: KeyInfo) -> HttpResponse:
        asked = schemas.parse(schemas.Search, request.body)
        found = await sync_to_async(_store_for)(key, store_id)
        query = asked.query if isinstance(asked.query, str) else " ".join(asked.query)
        vector = await engine.embed(query)
        try:
            where = filters.to_sql(asked.filters) if asked.filters is not None else None
        except filters.FilterError as exc:
            raise invalid_request(f"Invalid filters: {exc}.", param="filters", code="invalid_value") from None
        hits = await sync_to_async(services.search)(
            stores=[found],
            query=query,
            vector=vector,
            limit=asked.max_num_results or 10,
            mode=asked.search_mode or "hybrid",
            where=where,
        )
        await _record_search(request, key, query, started)
        threshold = asked.ranking_options.score_threshold if asked.ranking_options else None
        data = [
            {
                "file_id": hit.file_id,
                "filename": hit.filename,
                "score": round(hit.score, 6),
                "attributes": hit.attributes,
                "content": [{"type": "text", "text": hit.text}],
            }
            for hit in hits
            if threshold is None or hit.score >= threshold
        ]
        return json_response(
            {
                "object": "vector_store.search_results.page",
                "search_query": [query],
                "data": data,
                "has_more": False,
                "next_page": None,
            }
        )

    return await _answer(request, "POST", handle)
