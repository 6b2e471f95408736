"""POST /v1/images/generations, top to bottom, on the chat path's stages (gateway.pipeline):

    authenticate → validate → allowlist → route → admit (limits, budgets: n images at the dearest
    price the chain can charge) → screen the prompt → call the chain (failing over as chat does)
    → screen the images (revised prompts, the tenant's guardrail) → respond → finish (settle,
    ledger: the image count and their cost, also when screening withholds them)

A deployment whose provider answers in OpenAI's format is called directly (gateway.upstream.transport,
as embeddings are), every other through litellm.aimage_generation, and the answer is always OpenAI's.

Images are priced per image, by size and quality: the deployment's own price per image when it
has one (Deployment.image_price_override), else litellm's bundled price map, which names prices
`<quality>/<W>-x-<H>/<model>` or `<W>-x-<H>/<model>`, per image or per pixel. A model the map has
no image price for is served unpriced (cost 0), as chat's unpriced models are. A request that leaves
the quality to the provider ("auto", or none) is billed at the quality the answer names, else at the
dearest quality the map lists for its size, which is also what admission reserves.

Nothing is cached: the same prompt is meant to give a new image.
"""

from __future__ import annotations

import re
from dataclasses import replace
from decimal import Decimal
from functools import lru_cache
from typing import Annotated, Literal, get_args

import litellm
import orjson
from pydantic import Field, ValidationError

from billing.money import ZERO, Bill, quantize_cost, to_price
from billing.prices import price_key
from gateway.bodies import check_body
from gateway.call import Call, Reply, request_id_from, response_headers
from gateway.chain import call_chain
from gateway.errors import GatewayError, invalid_request
from gateway.limits.admission import Ticket
from gateway.pipeline import admit_at, answered, identify, route_and_admit
from gateway.schemas import _Strict, integer, json_object, validation_error
from gateway.screening import engine as screening
from gateway.settlement import finish, ledger_record
from gateway.upstream import transport
from gateway.upstream.failures import UpstreamError
from gateway.upstream.providers import deployment_arguments, through_litellm
from gateway.upstream.routing import ModelRoute, Target

MAX_IMAGES = 10  # OpenAI's limit on `n`
MAX_PROMPT_CHARS = 32_000  # OpenAI's longest prompt (gpt-image-1)
DEFAULT_SIZE = "1024x1024"  # what OpenAI's image models make when no size is asked for
_SIDE = "(6[4-9]|[7-9][0-9]|[1-9][0-9]{2}|[1-3][0-9]{3}|40[0-8][0-9]|409[0-6])"  # 64 to 4,096
SIZE_PATTERN = f"^(auto|{_SIDE}x{_SIDE})$"  # in the schema, so clients and the fuzzer know the bounds
SIZE = re.compile(f"^{_SIDE}x{_SIDE}$")
Quality = Literal["low", "medium", "high", "xhigh", "max", "auto", "standard", "hd"]
QUALITIES: tuple[str, ...] = get_args(Quality)
IMAGE_IDENTIFIERS = (("model",), ("user",))
ANSWER_VALUES = {
    "quality": frozenset({"low", "medium", "high", "xhigh", "max"}),
    "background": frozenset({"transparent", "opaque"}),
    "output_format": frozenset({"png", "webp", "jpeg"}),
}


class ImagesAsked:
    """What the image path reads of a request, whichever endpoint made it: images are never streamed
    (the ledger's `stream` column) and `n` defaults to one."""

    n: int | None

    @property
    def stream(self) -> bool:
        return False

    @property
    def count(self) -> int:
        return self.n or 1


class ImageRequest(ImagesAsked, _Strict):
    """OpenAI's image generation request (the official SDK's ImageGenerateParams) without its
    streaming and video parameters, which Sentinel refuses by name (UNSUPPORTED_PARAMETERS)."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    prompt: Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
    n: integer(ge=1, le=MAX_IMAGES) | None = None
    size: Annotated[str, Field(pattern=SIZE_PATTERN)] | None = None
    quality: Quality | None = None
    response_format: Literal["url", "b64_json"] | None = None
    style: Literal["vivid", "natural"] | None = None
    background: Literal["transparent", "opaque", "auto"] | None = None
    moderation: Literal["low", "auto"] | None = None
    output_format: Literal["png", "webp", "jpeg"] | None = None
    output_compression: integer(ge=0, le=100) | None = None
    user: Annotated[str, Field(max_length=256)] | None = None


IMAGE_PARAMETERS = frozenset(ImageRequest.model_fields)
# The SDK's parameters Sentinel does not serve: streamed partial images, and video and SVG output.
UNSUPPORTED_PARAMETERS = frozenset(
    {"stream", "partial_images", "complexity", "frame_count", "frame_duration_ms", "svg", "safety_identifier"}
)


def parse_image_request(raw: bytes) -> tuple[ImageRequest, dict]:
    """The validated request and the body as sent. Raises GatewayError(400) on anything wrong."""
    body = json_object(raw)
    check_body(body, identifiers=IMAGE_IDENTIFIERS, raw=raw)
    for name in body:
        if name in UNSUPPORTED_PARAMETERS:
            message = f"'{name}' is not supported by this gateway's image generation."
            raise invalid_request(message, param=name, code="unsupported_parameter")
        if name not in IMAGE_PARAMETERS:  # connection settings (api_base, api_key, ...) included
            raise invalid_request(
                f"Unrecognized request argument supplied: {name}", param=name, code="unknown_parameter"
            )
    size = body.get("size")
    if isinstance(size, str) and size != "auto":
        dimensions(size)  # its own message: pydantic's would recite the pattern
    try:
        request = ImageRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    for name in ("n", "output_compression"):  # 2.0 is 2 (gateway.schemas.integer): providers want integers
        if isinstance(body.get(name), float):
            body[name] = getattr(request, name)
    return request, body


def dimensions(size: str) -> tuple[int, int]:
    """(width, height) of a `size` such as "1024x1536". Raises GatewayError(400) on anything else."""
    match = SIZE.match(size)
    if match is None:
        message = "Invalid value for 'size': expected 'auto' or '<width>x<height>', each 64 to 4096 pixels."
        raise invalid_request(message, param="size", code="invalid_value")
    return int(match[1]), int(match[2])


# --- prices --------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def map_image_price(litellm_model: str, size: str, quality: str | None) -> Decimal | None:
    """litellm's price of one image of this size and quality, or None where its map has none."""
    width, height = dimensions(size)
    for name in price_key(litellm_model):
        keys = [f"{quality}/{width}-x-{height}/{name}"] if quality else []
        for key in [*keys, f"{width}-x-{height}/{name}", name]:
            entry = litellm.model_cost.get(key) or {}
            per_image = entry.get("output_cost_per_image") or entry.get("input_cost_per_image")
            if per_image:
                return to_price(per_image)
            per_pixel = (entry.get("input_cost_per_pixel") or 0) + (entry.get("output_cost_per_pixel") or 0)
            if per_pixel:
                return to_price(per_pixel) * width * height
    return None


def image_price(target: Target, size: str | None, quality: str | None) -> Decimal:
    """What one image costs at this deployment: its own price, else litellm's for the size and
    quality; a quality left to the provider at the dearest the map lists for the size."""
    if target.image_price_override is not None:
        return target.image_price_override
    size = size if size and size != "auto" else DEFAULT_SIZE
    if quality and quality != "auto":
        return map_image_price(target.litellm_model, size, quality) or ZERO
    prices = [map_image_price(target.litellm_model, size, q) for q in (None, *QUALITIES)]
    return max((price for price in prices if price is not None), default=ZERO)


# --- the request path ----------------------------------------------------------------------------


async def create(headers, raw_body: bytes) -> Reply:
    call = Call(request_id=request_id_from(headers.get("x-sentinel-request-id")))
    return await answered(call, lambda: _create(call, headers, raw_body))


async def _create(call: Call, headers, raw_body: bytes) -> Reply:
    call.key = await identify(headers, None)
    call.request, call.body = parse_image_request(raw_body)
    _, chain = await route_and_admit(call, headers, None, model_of=lambda c: c.request.model, admit_with=admit)
    await screen_prompt(call)
    response = await call_chain(call, chain, stream=False, complete=generate)
    return await deliver(call, response)


async def deliver(call: Call, response: dict) -> Reply:
    """The images made (generated, edited or varied: gateway.image_edits too), billed, screened and
    sent, or withheld when screening says so (made, so billed all the same)."""
    images = len(response["data"])
    charged = charge_images(call, response, images)
    refusal = await screening.screen_images(call, response)
    status = refusal.status if refusal else 200
    record = ledger_record(call, status, charged=charged, error_code=refusal.code if refusal else "")
    record.images = images
    await finish(call, record)
    if refusal:  # made, so billed, but not delivered
        return Reply(status, {**response_headers(call, charged.cost), **refusal.headers}, refusal.body())
    return Reply(200, response_headers(call, charged.cost), orjson.dumps(response))


async def admit(call: Call, route: ModelRoute, chain: list[Target]) -> Ticket:
    """Reserve n images at the dearest price any deployment of the chain would charge for them."""
    request = call.request
    worst = max((image_price(target, request.size, request.quality) for target in chain), default=ZERO)
    return await admit_at(call, route, chain, tokens=0, worst_cost=worst * request.count)


async def screen_prompt(call: Call) -> None:
    """The tenant's input screening sees the prompt as a user message; a redaction is what the provider gets."""
    if call.key.screening is None:
        return
    as_chat = replace(call, body={"messages": [{"role": "user", "content": call.body["prompt"]}]})
    try:
        await screening.screen_input(as_chat)
    except GatewayError as blocked:
        if not (blocked.param or "").startswith("messages[0]"):
            raise
        raise GatewayError(
            blocked.status, blocked.code, blocked.message, kind=blocked.kind, param="prompt", headers=blocked.headers
        ) from None
    finally:
        call.screening = as_chat.screening
    call.body["prompt"] = as_chat.body["messages"][0]["content"]


def charge_images(call: Call, response: dict, images: int) -> Bill:
    """The images the deployment returned, at its price for the size and quality it says it made
    (else those asked for), counted against its provider's daily spend cap too (at settle)."""
    request = call.request
    size = response.get("size") if isinstance(response.get("size"), str) else request.size
    quality = response.get("quality") if response.get("quality") in QUALITIES else request.quality
    try:
        price = image_price(call.target, size, quality)
    except GatewayError:  # a size the provider reports in a form Sentinel does not read
        price = image_price(call.target, request.size, quality)
    cost = quantize_cost(price * images)
    if cost:
        provider = call.target.provider_id
        call.paid[provider] = call.paid.get(provider, ZERO) + cost
    return Bill(cost=cost)


# --- the provider call and the answer ------------------------------------------------------------


async def generate(target: Target, body: dict, *, timeout: float, request_id: str) -> dict:
    """One deployment's images, as OpenAI's answer: straight to a provider that answers in OpenAI's
    format, through litellm.aimage_generation for every other."""
    # A null is the parameter's default: left out, as the SDK leaves it out (litellm and providers may not take it).
    args = {name: body[name] for name in IMAGE_PARAMETERS - {"model"} if body.get(name) is not None}
    expected = body.get("n") or 1
    if target.fast is not None and target.fast.images_url is not None:
        payload = await transport.generate_images(target.fast, args, timeout=timeout, request_id=request_id)
        return openai_answer(payload, expected)
    args.update(deployment_arguments(target, request_id=request_id))
    response = await through_litellm(litellm.aimage_generation, args, timeout=timeout)
    return openai_answer(response.model_dump(exclude_none=True), expected)


def openai_answer(payload: dict, expected: int) -> dict:
    """OpenAI's shape, checked: between one and n images, each a URL or base64."""
    data = payload.get("data")
    if (
        not isinstance(data, list)
        or not 1 <= len(data) <= expected
        or not all(isinstance(item, dict) and (item.get("url") or item.get("b64_json")) for item in data)
    ):
        message = "The provider's answer held no images, or more than were asked for."
        raise UpstreamError(502, "provider_bad_response", message, True, False)
    fields = ("url", "b64_json", "revised_prompt")
    answer = {
        "created": int(payload.get("created") or 0),
        "data": [{name: item[name] for name in fields if isinstance(item.get(name), str)} for item in data],
    }
    if isinstance(payload.get("size"), str):
        answer["size"] = payload["size"]
    for name, values in ANSWER_VALUES.items():  # what OpenAI's answer may say (the SDK's ImagesResponse)
        if payload.get(name) in values:
            answer[name] = payload[name]
    return answer
