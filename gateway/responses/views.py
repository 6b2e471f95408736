"""GET /v1/responses/{id}, DELETE /v1/responses/{id} and GET /v1/responses/{id}/input_items:
async views on the API handler, authenticated with a virtual key and scoped to its tenant (another
tenant's id is a 404, as one that never existed)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from gateway.batches.views import caller, error_response, json_response, list_response, method_not_allowed, page_size
from gateway.errors import GatewayError, invalid_request
from gateway.responses import store

MAX_PAGE = 100


async def response(request: HttpRequest, response_id: str) -> HttpResponse:
    if request.method not in ("GET", "DELETE"):
        return method_not_allowed(request, "GET,DELETE")
    try:
        key = await caller(request)
        if request.method == "DELETE":
            await store.response_delete(tenant_id=key.tenant_id, response_id=response_id)
            return json_response({"id": response_id, "object": "response", "deleted": True})
        found = await store.response_get(tenant_id=key.tenant_id, response_id=response_id)
        return json_response(found.response)
    except GatewayError as error:
        return error_response(error)


async def response_input_items(request: HttpRequest, response_id: str) -> HttpResponse:
    """This turn's input items, newest first unless `order=asc`, paged by `after` and `limit`."""
    if request.method != "GET":
        return method_not_allowed(request, "GET")
    try:
        key = await caller(request)
        limit = page_size(request, 20, MAX_PAGE)
        order = request.GET.get("order", "desc")
        if order not in ("asc", "desc"):
            raise invalid_request("order must be 'asc' or 'desc'.", param="order", code="invalid_value")
        found = await store.response_get(tenant_id=key.tenant_id, response_id=response_id)
        items = found.input_items if order == "asc" else found.input_items[::-1]
        after = request.GET.get("after")
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise invalid_request(f"No input item with id '{after}'.", param="after", code="invalid_value")
            items = items[ids.index(after) + 1 :]
        return list_response(items[:limit], has_more=len(items) > limit)
    except GatewayError as error:
        return error_response(error)
