"""Grounded chat: a chat completion naming vector stores (Sentinel's `file_search` field, shaped as
the Responses API's file_search tool) is answered from the tenant's documents. Before the request is
admitted, its last user message is searched for in those stores (gateway.knowledge.services.search),
and the best passages go into the conversation as a user turn just before that message, numbered,
with the instruction to cite them; the `x-sentinel-file-search` header (gateway.call.response_headers)
names the files and scores, in that order. So the reservation counts the passages' tokens, screening
reads them (injection and moderation too), and the provider bills them as prompt tokens. A grounded
request neither reads nor fills the cache (the documents may change under it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from asgiref.sync import sync_to_async
from pydantic import Field, ValidationError

from gateway.cache import engine
from gateway.call import Call
from gateway.errors import GatewayError, invalid_request
from gateway.knowledge import filters, services
from gateway.knowledge.filters import Comparison, Compound
from gateway.knowledge.models import VectorStore
from gateway.schemas import ChatRequest, _Strict, integer, validation_error

MAX_STORES = 5
MAX_QUERY_CHARS = 4_096
INSTRUCTION = (
    "Answer from the passages below, taken from the user's organisation's documents. Cite the passages "
    "you use by their number in brackets, like [1]. If they do not hold the answer, say so."
)


class FileSearch(_Strict):
    vector_store_ids: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]], Field(min_length=1, max_length=MAX_STORES)
    ]
    max_num_results: integer(ge=1, le=20) | None = None
    filters: Comparison | Compound | None = None


@dataclass(frozen=True)
class Grounded:
    """What a grounded request was given: the text searched for and the passages, best first."""

    query: str
    hits: list[services.Hit]


def parse(spec: object, param: str) -> FileSearch:
    """`spec` validated; a GatewayError(400) names the field under `param`."""
    try:
        asked = FileSearch.model_validate(spec)
        if asked.filters is not None:
            filters.to_sql(asked.filters)
        return asked
    except ValidationError as exc:
        error = validation_error(exc)
        name = f"{param}.{error.param}" if error.param else param
        raise GatewayError(
            error.status, error.code, error.message.replace(f"'{error.param}'", f"'{name}'"), param=name
        ) from None
    except filters.FilterError as exc:
        raise invalid_request(f"Invalid filters: {exc}.", param=f"{param}.filters", code="invalid_value") from None


async def ground(call: Call, asked: FileSearch | None = None, param: str = "file_search") -> Grounded | None:
    """Search the stores `file_search` names (or `asked`: the Responses API's file_search tool) and
    put the passages into call.body (see above)."""
    spec = call.body.pop("file_search", None)
    if asked is None:
        if spec is None:
            return None
        asked = parse(spec, param)
    stores = await sync_to_async(_stores)(call.key.tenant_id, asked.vector_store_ids, param)
    where = filters.to_sql(asked.filters) if asked.filters is not None else None
    query = _last_user_text(call.body["messages"])[:MAX_QUERY_CHARS]
    limit = asked.max_num_results or 5
    hits = []
    if query:  # no user text: nothing to search for
        vector = await engine.embed(query)
        hits = await sync_to_async(services.search)(stores=stores, query=query, vector=vector, limit=limit, where=where)
        call.retrieval = services.retrieval_used(query)
    call.file_search = [(hit.file_id, hit.score) for hit in hits]
    call.cache_controls = engine.Controls(
        no_cache=True, no_store=True, ttl=call.cache_controls.ttl, namespace=call.cache_controls.namespace
    )
    if hits:
        passages = "\n\n".join(f"[{n}] ({hit.filename})\n{hit.text}" for n, hit in enumerate(hits, start=1))
        messages = call.body["messages"]
        # A user turn just before the question, not a system message: the passages are documents,
        # not the app's instructions, so the tenant's injection and moderation checks read them as
        # they read tool results (an instruction planted in a document is an indirect injection).
        last_user = max(i for i, message in enumerate(messages) if message.get("role") == "user")
        messages.insert(last_user, {"role": "user", "content": f"{INSTRUCTION}\n\n{passages}"})
    call.request = ChatRequest.model_validate(call.body)
    return Grounded(query=query, hits=hits)


def _stores(tenant_id: int, ids: list[str], param: str) -> list[VectorStore]:
    found = {store.public_id: store for store in VectorStore.objects.filter(tenant_id=tenant_id, public_id__in=ids)}
    for public_id in ids:
        if public_id not in found:
            raise GatewayError(
                404,
                "vector_store_not_found",
                f"No vector_store with id '{public_id}'.",
                param=f"{param}.vector_store_ids",
            )
    return [found[public_id] for public_id in dict.fromkeys(ids)]


def _last_user_text(messages: list[dict]) -> str:
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content.strip()
        if isinstance(content, list):
            return " ".join(
                part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
            ).strip()
    return ""
