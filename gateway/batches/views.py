"""/v1/files and /v1/batches, OpenAI-compatible (async views on the API handler, like the chat
endpoint): authenticated with a virtual key and scoped to its tenant; another tenant's ids are 404."""

from __future__ import annotations

import re

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.utils.http import content_disposition_header

from gateway.auth import KeyInfo, authenticate, ensure_not_blocked
from gateway.batches import selectors, services
from gateway.batches.models import Batch, BatchFile
from gateway.batches.schemas import parse_batch_create
from gateway.errors import GatewayError, invalid_request
from sentinel.text import row_id

FINISHED = (Batch.Status.COMPLETED, Batch.Status.FAILED, Batch.Status.EXPIRED)
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def json_response(payload: dict, status: int = 200) -> HttpResponse:
    return HttpResponse(orjson.dumps(payload), status=status, content_type="application/json")


def error_response(error: GatewayError) -> HttpResponse:
    response = HttpResponse(error.body(), status=error.status, content_type="application/json")
    for name, value in error.headers.items():
        response[name] = value
    return response


def method_not_allowed(request: HttpRequest, allowed: str) -> HttpResponse:
    return error_response(
        GatewayError(
            405,
            "method_not_allowed",
            f"Use {allowed.replace(',', ' or ')} for {request.path}.",
            headers={"allow": allowed},
        )
    )


async def caller(request: HttpRequest) -> KeyInfo:
    key = await authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
    await ensure_not_blocked(key)
    return key


def not_found(kind: str, public_id: str, param: str | None = None) -> GatewayError:
    return GatewayError(404, f"{kind}_not_found", f"No {kind} with id '{public_id}'.", param=param)


def page_size(request: HttpRequest, default: int, most: int) -> int:
    raw = request.GET.get("limit")
    if raw is None:
        return default
    size = row_id(raw)  # ASCII digits, at most 19 of them (int() refuses over 4,300: a 500)
    if size is None or size > most:
        raise invalid_request(f"limit must be an integer from 1 to {most}.", param="limit", code="invalid_value")
    return size


def list_response(objects: list[dict], has_more: bool) -> HttpResponse:
    return json_response(
        {
            "object": "list",
            "data": objects,
            "first_id": objects[0]["id"] if objects else None,
            "last_id": objects[-1]["id"] if objects else None,
            "has_more": has_more,
        }
    )


# --- files -------------------------------------------------------------------------------------


async def files(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "POST"):
        return method_not_allowed(request, "GET,POST")
    try:
        key = await caller(request)
        if request.method == "POST":
            return await file_upload(request, key)
        return await file_list(request, key)
    except GatewayError as error:
        return error_response(error)


def _read_upload(request: HttpRequest) -> tuple[str, object]:
    """The form's purpose and file (Django parses multipart bodies synchronously, off the loop)."""
    return request.POST.get("purpose"), request.FILES.get("file")


async def file_upload(request: HttpRequest, key: KeyInfo) -> HttpResponse:
    if not request.content_type.startswith("multipart/form-data"):
        raise invalid_request("Upload files as multipart/form-data with `file` and `purpose`.", code="invalid_value")
    try:
        purpose, upload = await sync_to_async(_read_upload)(request)
    except MultiPartParserError as exc:
        raise invalid_request(f"The multipart body could not be read: {exc}.", code="invalid_value") from None
    if not purpose:
        raise invalid_request(
            "Missing required parameter: 'purpose'.", param="purpose", code="missing_required_parameter"
        )
    if purpose not in (BatchFile.Purpose.BATCH, BatchFile.Purpose.ASSISTANTS):
        raise invalid_request(
            "Sentinel stores files for batches and vector stores: purpose must be 'batch' or 'assistants'.",
            param="purpose",
            code="invalid_value",
        )
    if upload is None:
        raise invalid_request("Missing required parameter: 'file'.", param="file", code="missing_required_parameter")
    if upload.size > settings.BATCH_MAX_FILE_BYTES:
        raise GatewayError(
            413, "file_too_large", f"The file is larger than {settings.BATCH_MAX_FILE_BYTES} bytes.", param="file"
        )
    # Stored as sent: what is in it is checked line by line when a batch uses it (batch `errors`).
    content = await sync_to_async(upload.read)()
    file = await sync_to_async(services.file_create)(
        tenant_id=key.tenant_id,
        key_id=key.key_id,
        filename=CONTROL_CHARACTERS.sub("", upload.name or "") or "upload.jsonl",
        content=content,
        purpose=purpose,
    )
    return json_response(selectors.file_object(file))


async def file_list(request: HttpRequest, key: KeyInfo) -> HttpResponse:
    limit = page_size(request, 100, 10_000)
    order = request.GET.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request("order must be asc or desc.", param="order", code="invalid_value")
    after = None
    if "after" in request.GET:
        after = await sync_to_async(selectors.file_for)(tenant_id=key.tenant_id, public_id=request.GET["after"])
        if after is None:
            raise not_found("file", request.GET["after"], param="after")
    purpose = request.GET.get("purpose")
    if purpose and purpose not in BatchFile.Purpose.values:
        return list_response([], False)  # no file of ours has it
    rows, more = await sync_to_async(selectors.files_page)(
        tenant_id=key.tenant_id,
        purpose=purpose,
        after=after,
        limit=limit,
        newest_first=order == "desc",
    )
    return list_response([selectors.file_object(row) for row in rows], more)


async def file(request: HttpRequest, file_id: str) -> HttpResponse:
    if request.method not in ("GET", "DELETE"):
        return method_not_allowed(request, "GET,DELETE")
    try:
        key = await caller(request)
        found = await sync_to_async(selectors.file_for)(tenant_id=key.tenant_id, public_id=file_id)
        if found is None:
            raise not_found("file", file_id)
        if request.method == "DELETE":
            await sync_to_async(services.file_delete)(file=found)
            return json_response({"id": found.public_id, "object": "file", "deleted": True})
        return json_response(selectors.file_object(found))
    except GatewayError as error:
        return error_response(error)


async def file_content(request: HttpRequest, file_id: str) -> HttpResponse:
    if request.method != "GET":
        return method_not_allowed(request, "GET")
    try:
        key = await caller(request)
        found = await sync_to_async(selectors.file_for)(tenant_id=key.tenant_id, public_id=file_id, with_content=True)
        if found is None:
            raise not_found("file", file_id)
    except GatewayError as error:
        return error_response(error)
    # Tenant bytes, never a page: a download, whose type a browser may not guess.
    return HttpResponse(
        bytes(found.content),
        content_type="application/octet-stream",
        headers={
            "content-disposition": content_disposition_header(as_attachment=True, filename=found.filename),
            "x-content-type-options": "nosniff",
        },
    )


# --- batches -----------------------------------------------------------------------------------


async def batches(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "POST"):
        return method_not_allowed(request, "GET,POST")
    try:
        key = await caller(request)
        if request.method == "POST":
            return await batch_create(request, key)
        return await batch_list(request, key)
    except GatewayError as error:
        return error_response(error)


async def batch_create(request: HttpRequest, key: KeyInfo) -> HttpResponse:
    params = parse_batch_create(request.body)
    input_file = await sync_to_async(selectors.file_for)(tenant_id=key.tenant_id, public_id=params.input_file_id)
    if input_file is None:
        raise not_found("file", params.input_file_id, param="input_file_id")
    if input_file.purpose != BatchFile.Purpose.BATCH:
        raise invalid_request(
            "The input file must be a file uploaded with purpose 'batch'.", param="input_file_id", code="invalid_value"
        )
    batch = await sync_to_async(services.batch_create)(
        tenant_id=key.tenant_id,
        key_id=key.key_id,
        input_file=input_file,
        completion_window=params.completion_window,
        metadata=params.metadata,
    )
    return await batch_response(key, batch.public_id)


async def batch_response(key: KeyInfo, public_id: str) -> HttpResponse:
    found = await sync_to_async(selectors.batch_for)(tenant_id=key.tenant_id, public_id=public_id)
    if found is None:
        raise not_found("batch", public_id)
    counts = await sync_to_async(selectors.request_counts)([found.pk])
    return json_response(selectors.batch_object(found, counts[found.pk]))


async def batch_list(request: HttpRequest, key: KeyInfo) -> HttpResponse:
    limit = page_size(request, 20, 100)
    after = None
    if "after" in request.GET:
        after = await sync_to_async(selectors.batch_for)(tenant_id=key.tenant_id, public_id=request.GET["after"])
        if after is None:
            raise not_found("batch", request.GET["after"], param="after")
    rows, more = await sync_to_async(selectors.batches_page)(tenant_id=key.tenant_id, after=after, limit=limit)
    counts = await sync_to_async(selectors.request_counts)([row.pk for row in rows])
    return list_response([selectors.batch_object(row, counts[row.pk]) for row in rows], more)


async def batch(request: HttpRequest, batch_id: str) -> HttpResponse:
    if request.method != "GET":
        return method_not_allowed(request, "GET")
    try:
        return await batch_response(await caller(request), batch_id)
    except GatewayError as error:
        return error_response(error)


async def batch_cancel(request: HttpRequest, batch_id: str) -> HttpResponse:
    if request.method != "POST":
        return method_not_allowed(request, "POST")
    try:
        key = await caller(request)
        found = await sync_to_async(selectors.batch_for)(tenant_id=key.tenant_id, public_id=batch_id)
        if found is None:
            raise not_found("batch", batch_id)
        if found.status in FINISHED:
            raise GatewayError(
                409, "batch_not_cancellable", f"The batch is {found.status}; only a running batch can be cancelled."
            )
        await sync_to_async(services.batch_cancel)(batch=found)
        return await batch_response(key, batch_id)
    except GatewayError as error:
        return error_response(error)
