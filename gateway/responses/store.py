"""Stored responses: written and read by tenant (another tenant's id is not found)."""

from __future__ import annotations

from gateway.errors import GatewayError
from gateway.responses.models import StoredResponse


def not_found(response_id: str, param: str | None = None) -> GatewayError:
    return GatewayError(404, "response_not_found", f"Response with id '{response_id}' not found.", param=param)


async def response_get(*, tenant_id: int, response_id: str, param: str | None = None) -> StoredResponse:
    found = await StoredResponse.objects.filter(tenant_id=tenant_id, public_id=response_id).afirst()
    if found is None:
        raise not_found(response_id, param)
    return found


async def response_save(
    *,
    tenant_id: int,
    key_id: int,
    response_id: str,
    request_id: str,
    response: dict,
    input_items: list[dict],
    conversation: list[dict],
) -> None:
    await StoredResponse.objects.acreate(
        public_id=response_id,
        tenant_id=tenant_id,
        key_id=key_id,
        request_id=request_id,
        response=response,
        input_items=input_items,
        conversation=conversation,
    )


async def response_delete(*, tenant_id: int, response_id: str) -> None:
    deleted, _ = await StoredResponse.objects.filter(tenant_id=tenant_id, public_id=response_id).adelete()
    if not deleted:
        raise not_found(response_id)
