"""POST /v1/embeddings, top to bottom, on the chat path's stages (gateway.pipeline):

    authenticate → validate → allowlist → route → admit (limits, budgets: the input's tokens)
    → exact cache → call the chain (failing over as chat does) → respond → finish (settle, ledger)
    → store the answer in the cache

A deployment whose provider answers in OpenAI's format is called directly (gateway.upstream.transport,
as chat's fast path), every other through litellm.aembedding, so any provider litellm embeds with
serves (Gemini, Bedrock, ...), and the answer is always OpenAI's. Sentinel always asks the
provider for floats and encodes base64 itself when the client asks for it (the official SDK's
default): every provider then answers alike, and the cache keeps one copy for both formats.

Only the exact cache applies: an embedding is a function of its exact input, and the semantic tier
answers a prompt with what a *similar* prompt got, which for embeddings would return another text's
vector (wrong by construction, not an approximation a client could accept).
"""

from __future__ import annotations

import base64
import hashlib
import struct
from decimal import Decimal
from typing import Annotated, Any, Literal

import litellm
import orjson
from pydantic import Field, ValidationError

from billing.money import ZERO
from gateway.bodies import check_body
from gateway.cache import engine as cache
from gateway.cache.keys import CacheKey
from gateway.call import Call, Reply, request_id_from, response_headers
from gateway.chain import call_chain
from gateway.errors import GatewayError, invalid_request
from gateway.limits import admission
from gateway.limits import tokens as prompt_tokens
from gateway.limits.admission import Ticket
from gateway.pipeline import admit_at, answered, identify, route_and_admit
from gateway.schemas import _Strict, integer, json_object, validation_error
from gateway.settlement import charge, finish, ledger_record, store_answer
from gateway.upstream import transport
from gateway.upstream.failures import UpstreamError
from gateway.upstream.providers import deployment_arguments, through_litellm
from gateway.upstream.routing import ModelRoute, Target

# Retries are the chain's (gateway.chain.call_chain), never litellm's: its OpenAI and Azure
# embedding handlers read `max_retries or DEFAULT_MAX_RETRIES`, so a 0 passed in became 2 and a
# failing deployment was called three times per attempt before the chain could fail over.
litellm.DEFAULT_MAX_RETRIES = 0

MAX_INPUTS = 2048  # OpenAI's limit on the items of one request
MAX_INPUT_TOKENS = 8192  # OpenAI's limit on one input's tokens (a token array's length)
MAX_TOKEN_ID = 2**31 - 1
MAX_DIMENSIONS = 4096  # the largest output size of the models that take `dimensions` (OpenAI, Gemini: 3,072)
MAX_CACHED_BYTES = 1024 * 1024  # answers larger than this (many long vectors) are not cached
EMBEDDING_IDENTIFIERS = (("model",), ("user",), ("cache", "namespace"))

TokenIds = Annotated[
    list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]], Field(min_length=1, max_length=MAX_INPUT_TOKENS)
]


class EmbeddingRequest(_Strict):
    """OpenAI's embeddings request (the official SDK's EmbeddingCreateParams, which
    tests/gateway/test_embeddings.py holds this to) plus Sentinel's `cache`."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    input: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_INPUTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    dimensions: integer(ge=1, le=MAX_DIMENSIONS) | None = None
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None
    # Sentinel's: read by gateway.cache.engine.controls_from, never sent to a provider.
    cache: dict[str, Any] | None = None

    @property
    def stream(self) -> bool:
        return False  # the ledger's `stream` column: embeddings are never streamed


EMBEDDING_PARAMETERS = frozenset(EmbeddingRequest.model_fields)
# What reaches a provider besides the input: `encoding_format` is Sentinel's to apply.
FORWARDED_EMBEDDING_PARAMETERS = frozenset({"dimensions", "user"})


def parse_embedding_request(raw: bytes) -> tuple[EmbeddingRequest, dict]:
    """The validated request and the body as sent. Raises GatewayError(400) on anything wrong."""
    body = json_object(raw)
    check_body(body, identifiers=EMBEDDING_IDENTIFIERS, raw=raw)
    unknown = [name for name in body if name not in EMBEDDING_PARAMETERS]
    if unknown:  # before anything else, as OpenAI (and the chat path) refuses them
        message = f"Unrecognized request argument supplied: {unknown[0]}"
        raise invalid_request(message, param=unknown[0], code="unknown_parameter")
    if "input" in body:
        check_input(body["input"])
        if not isinstance(body["input"], str):
            body["input"] = _integers(body["input"])
    try:
        request = EmbeddingRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if isinstance(body.get("dimensions"), float):
        body["dimensions"] = request.dimensions
    return request, body


def _token_id(value: Any) -> bool:
    # JSON has one number type: 205.0 is the token 205 (gateway.schemas._integral), as it is to OpenAI.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def _integers(value: Any) -> Any:
    """Token ids sent as integral floats, as integers (what providers want)."""
    if isinstance(value, float):
        return int(value)
    if isinstance(value, list):
        return [_integers(item) for item in value]
    return value


def check_input(value: Any) -> None:
    """OpenAI's four shapes of `input`, each refused with what is wrong with it: pydantic's error
    for a union names whichever member it tried last ("input[0] should be a valid string" for a
    negative token id)."""

    def bad(message: str, param: str = "input", code: str = "invalid_value") -> GatewayError:
        return invalid_request(f"Invalid value for '{param}': {message}", param=param, code=code)

    shapes = "a string, an array of strings, an array of token ids or an array of token id arrays"
    if isinstance(value, str):
        if not value:
            raise bad("it must not be an empty string.")
        return
    if not isinstance(value, list):
        raise bad(f"expected {shapes}.", code="invalid_type")
    if not value:
        raise bad("it must not be an empty array.")
    first = value[0]
    if _token_id(first):
        if len(value) > MAX_INPUT_TOKENS:
            raise bad(f"an input is at most {MAX_INPUT_TOKENS} tokens ({len(value)} were sent).")
    elif len(value) > MAX_INPUTS:
        raise bad(f"at most {MAX_INPUTS} inputs may be sent at once ({len(value)} were).")
    for index, item in enumerate(value):
        param = f"input[{index}]"
        if isinstance(first, str):
            if not isinstance(item, str):
                raise bad("every item of an array of strings must be a string.", param, "invalid_type")
            if not item:
                raise bad("it must not be an empty string.", param)
        elif isinstance(first, list):
            if not isinstance(item, list) or not item:
                raise bad("every item of an array of token arrays must be a non-empty array.", param, "invalid_type")
            if len(item) > MAX_INPUT_TOKENS:
                raise bad(f"an input is at most {MAX_INPUT_TOKENS} tokens ({len(item)} were sent).", param)
            if not all(_token_id(token) for token in item):
                raise bad(f"token ids are integers from 0 to {MAX_TOKEN_ID}.", param)
        elif not _token_id(item):
            raise bad(f"token ids are integers from 0 to {MAX_TOKEN_ID} (or send {shapes}).", param)


# --- the request path ----------------------------------------------------------------------------


async def create(headers, raw_body: bytes) -> Reply:
    call = Call(request_id=request_id_from(headers.get("x-sentinel-request-id")))
    return await answered(call, lambda: _create(call, headers, raw_body))


async def _create(call: Call, headers, raw_body: bytes) -> Reply:
    call.key = await identify(headers, None)
    call.request, call.body = parse_embedding_request(raw_body)
    call.cache_controls = cache.controls_from(call.body, headers)
    route, chain = await route_and_admit(
        call, headers, None, model_of=lambda c: c.request.model, admit_with=admit, budget_fallback=False
    )
    hit = await consult_cache(call, route)
    if hit is not None:
        return await serve_from_cache(call, hit)
    response = await call_chain(call, chain, stream=False, complete=embed)
    charged = await charge(call, response["usage"])
    await finish(call, ledger_record(call, 200, charged=charged))
    remember(call, response, charged.cost)
    body = orjson.dumps(encoded(response, call.request.encoding_format))
    return Reply(200, response_headers(call, charged.cost), body)


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [item for item in value if isinstance(item, str)]


def _token_ids(value: Any) -> int:
    """The tokens of the input's token arrays: exactly their length."""
    if isinstance(value, list) and value and isinstance(value[0], int):
        return len(value)
    return sum(len(item) for item in value if isinstance(item, list)) if isinstance(value, list) else 0


async def input_token_bound(call: Call, route: ModelRoute) -> int:
    """Tokens the input can at most be billed as by any deployment of the chain: its texts counted
    as gateway.limits.tokens counts prompts (each as a user message: the framing errs high), its token
    arrays exactly."""
    texts = _texts(call.request.input)
    bound = _token_ids(call.request.input)
    if texts:
        exact = admission.counts_tokens(call.key, dict(route.limits))
        body = {"messages": [{"role": "user", "content": text} for text in texts]}
        bound += await prompt_tokens.aprompt_bound(body, [t.litellm_model for t in route.targets], exact=exact)
    return bound


async def admit(call: Call, route: ModelRoute, chain: list[Target]) -> Ticket:
    tokens = await input_token_bound(call, route)
    return await admit_at(call, route, chain, tokens=tokens, worst_cost=tokens * route.input_price)


# --- the exact cache -----------------------------------------------------------------------------


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def embedding_cache_key(*, tenant_id: int, namespace: str, model_identity: tuple, body: dict) -> CacheKey:
    """Filed apart from chat answers (the endpoint is in the partition), by everything that changes
    the vectors: the model and its deployments, `dimensions`, and the input exactly as sent. Not the
    encoding, which Sentinel applies. No prompt: the semantic tier never sees embeddings."""
    params = {name: body[name] for name in FORWARDED_EMBEDDING_PARAMETERS - {"user"} if name in body}
    partition = _digest(
        {"endpoint": "embeddings", "tenant": tenant_id, "namespace": namespace, "model": model_identity, **params}
    )
    return CacheKey(partition=partition, exact=_digest({"partition": partition, "input": body["input"]}), prompt="")


async def consult_cache(call: Call, route: ModelRoute) -> cache.Hit | None:
    key = call.key
    if not key.cache_enabled:
        return None
    call.cache_key = embedding_cache_key(
        tenant_id=key.tenant_id, namespace=call.cache_controls.namespace, model_identity=route.identity, body=call.body
    )
    if call.cache_controls.no_cache:
        return None
    found = await cache.lookup(
        call.cache_key,
        tenant_id=key.tenant_id,
        semantic=False,
        threshold=None,
        lead=None if call.cache_controls.no_store else call.request_id,  # identical ones in flight wait
    )
    call.cache_tier = "miss"
    call.cache_lookup = found
    return found.hit


async def serve_from_cache(call: Call, hit: cache.Hit) -> Reply:
    call.cache_tier = hit.tier
    cache.note_hit(hit.entry_id)
    headers = response_headers(call, ZERO)
    headers["x-sentinel-provider"] = "cache"
    await finish(call, ledger_record(call, 200, usage=hit.answer.get("usage") or {}, saved=hit.cost_usd))
    return Reply(200, headers, orjson.dumps(encoded(hit.answer, call.request.encoding_format)))


def remember(call: Call, response: dict, cost: Decimal) -> None:
    if call.cache_key is None or call.cache_controls.no_store or len(orjson.dumps(response)) > MAX_CACHED_BYTES:
        cache.release(call.cache_key, call.cache_lookup)  # identical requests waiting for it ask themselves
        return
    store_answer(call, response, cost, semantic=False)  # exact only: the lookup computed no vector


# --- the provider call and the answer ------------------------------------------------------------


async def embed(target: Target, body: dict, *, timeout: float, request_id: str) -> dict:
    """One deployment's embeddings, as OpenAI's answer with float vectors: straight to a provider
    that answers in OpenAI's format (as chat's fast path: litellm's response machinery cost ~4 ms of
    CPU a call), through litellm.aembedding for every other."""
    args = {name: body[name] for name in FORWARDED_EMBEDDING_PARAMETERS if name in body}
    expected = len(_texts(body["input"])) or _count(body)
    if target.fast is not None and target.fast.embeddings_url is not None:
        payload = await transport.embed(
            target.fast,
            {**args, "input": body["input"]},  # floats: OpenAI's default, as litellm asks
            timeout=timeout,
            request_id=request_id,
        )
        return _openai_answer(payload, expected)
    args.update(deployment_arguments(target, request_id=request_id, input=body["input"], num_retries=0))
    response = await through_litellm(litellm.aembedding, args, timeout=timeout)
    return _openai_answer(response.model_dump(exclude_none=True), expected)


def _count(body: dict) -> int:
    value = body["input"]
    return len(value) if value and isinstance(value[0], list) else 1


def _openai_answer(payload: dict, expected: int) -> dict:
    """OpenAI's shape, checked: one float vector per input, in order, and the usage."""
    data = sorted(payload.get("data") or (), key=lambda item: item.get("index", 0))
    vectors = [item.get("embedding") for item in data]
    if len(vectors) != expected or not all(
        isinstance(v, list) and v and all(isinstance(x, int | float) for x in v) for v in vectors
    ):
        message = "The provider's embeddings did not match the input."
        raise UpstreamError(502, "provider_bad_response", message, True, False)
    usage = payload.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
        "model": payload.get("model") or "",
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def encoded(answer: dict, encoding_format: str | None) -> dict:
    """The answer in the client's encoding: base64 is the vector's little-endian float32 bytes, as
    OpenAI sends it (the SDK decodes it with numpy or struct)."""
    if encoding_format != "base64":
        return answer
    data = [
        {**item, "embedding": base64.b64encode(struct.pack(f"<{len(item['embedding'])}f", *item["embedding"])).decode()}
        for item in answer["data"]
    ]
    return {**answer, "data": data}
