"""POST /v1/images/edits and /v1/images/variations: images made from images the client uploads, as
the multipart form OpenAI takes, on the image generation path's stages (gateway.images):

    authenticate → read the form (its text fields validated as OpenAI's parameters, its files as
    PNG, JPEG or WebP images by their bytes) → allowlist → route → admit (n images at the dearest
    price the chain can charge) → screen the prompt (edits) → call the chain → screen the images
    made → respond → finish (ledger: the image count and their cost)

A deployment whose provider answers in OpenAI's format is sent the form as OpenAI takes it
(gateway.upstream.transport.image_form); an edit at any other deployment goes through
litellm.aimage_edit. Variations are made by OpenAI-format deployments only: litellm's
image_variation sends the provider the image alone (it drops `n`, `size` and `response_format`), so
the chain's other deployments are left out of a variation's chain, and a model with none is a 400.

The client's filenames and media types are not forwarded: each file goes as `image.png`,
`image-2.jpeg`, `mask.png`, named by the format its bytes show. Priced as generated images (per image
by size and quality, gateway.images.image_price); nothing is cached.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass
from typing import Annotated, Literal

import litellm
from pydantic import Field, ValidationError

from gateway import forms, images
from gateway.bodies import check_body
from gateway.call import Call, Reply, request_id_from
from gateway.chain import call_chain
from gateway.errors import invalid_request
from gateway.pipeline import answered, identify, route_and_admit
from gateway.schemas import _Strict, integer, validation_error
from gateway.upstream import transport
from gateway.upstream.providers import deployment_arguments, through_litellm
from gateway.upstream.routing import ModelRoute, Target

MAX_INPUT_IMAGES = 16  # OpenAI's limit for an edit (gpt-image-1); a variation takes one
SIGNATURES = {"png": (b"\x89PNG\r\n\x1a\n",), "jpeg": (b"\xff\xd8\xff",)}


class ImageEditRequest(images.ImagesAsked, _Strict):
    """OpenAI's image edit parameters (the official SDK's ImageEditParams) but the files, and without
    its streaming, video and vector ones, which Sentinel refuses by name (EDIT_UNSUPPORTED)."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    prompt: Annotated[str, Field(min_length=1, max_length=images.MAX_PROMPT_CHARS)]
    n: integer(ge=1, le=images.MAX_IMAGES) | None = None
    size: Annotated[str, Field(pattern=images.SIZE_PATTERN)] | None = None
    quality: images.Quality | None = None
    response_format: Literal["url", "b64_json"] | None = None
    background: Literal["transparent", "opaque", "auto"] | None = None
    input_fidelity: Literal["high", "low"] | None = None
    output_format: Literal["png", "webp", "jpeg"] | None = None
    output_compression: integer(ge=0, le=100) | None = None
    user: Annotated[str, Field(max_length=256)] | None = None


class ImageVariationRequest(images.ImagesAsked, _Strict):
    """OpenAI's image variation parameters (ImageCreateVariationParams) but the image."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    n: integer(ge=1, le=images.MAX_IMAGES) | None = None
    size: Annotated[str, Field(pattern=images.SIZE_PATTERN)] | None = None
    response_format: Literal["url", "b64_json"] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None

    @property
    def quality(self) -> None:
        return None  # a variation names none: priced at the dearest for its size


EDIT_PARAMETERS = frozenset(ImageEditRequest.model_fields)
VARIATION_PARAMETERS = frozenset(ImageVariationRequest.model_fields)
EDIT_UNSUPPORTED = frozenset(
    {"stream", "partial_images", "complexity", "frame_count", "frame_duration_ms", "svg", "markup", "safety_identifier"}
)
INTEGERS = ("n", "output_compression")


@dataclass(frozen=True)
class Upload:
    field: str  # image or mask
    format: str  # png, jpeg or webp
    content: bytes

    @property
    def media_type(self) -> str:
        return f"image/{self.format}"

    def filename(self, number: int) -> str:
        return f"{self.field}.{self.format}" if number == 1 else f"{self.field}-{number}.{self.format}"


@dataclass(frozen=True)
class Form:
    request: ImageEditRequest | ImageVariationRequest
    body: dict
    images: list[Upload]
    masks: list[Upload]

    def files(self) -> list[tuple[str, str, bytes, str]]:
        """(field, filename, content, media type) of each file, as OpenAI's form takes them."""
        many = len(self.images) > 1
        named = [
            ("image[]" if many else "image", upload.filename(number), upload.content, upload.media_type)
            for number, upload in enumerate(self.images, start=1)
        ]
        return named + [("mask", upload.filename(1), upload.content, upload.media_type) for upload in self.masks]


# --- reading the form ----------------------------------------------------------------------------------


async def read_form(headers, raw: bytes, *, variation: bool) -> Form:
    """The validated request, its parameters as the provider gets them and the uploaded files.
    Raises GatewayError(400) naming the first field at fault."""
    content_type = headers.get("content-type") or ""
    if not content_type.lower().startswith("multipart/form-data"):
        what = "`image` and `model`" if variation else "`image`, `prompt` and `model`"
        raise invalid_request(f"Send the image as multipart/form-data with {what}.", code="invalid_value")
    try:
        # The parser is synchronous and reads every byte: off the event loop.
        received = await asyncio.to_thread(forms.parts, content_type, raw)
    except forms.FormError as exc:
        raise invalid_request(f"The multipart body could not be read: {exc}.", code="invalid_value") from None
    allowed = VARIATION_PARAMETERS if variation else EDIT_PARAMETERS
    body: dict = {}
    uploads: dict[str, list[Upload]] = {"image": [], "mask": []}
    for part in received:
        field = part.name.removesuffix("[]")
        if field in uploads and not (variation and field == "mask"):
            # A file, with a filename or without (some clients send none).
            uploads[field].append(_upload(field, part.content, variation=variation))
            continue
        _known(part.name, allowed, variation=variation)
        if part.filename is not None:
            raise invalid_request(f"'{part.name}' takes text, not a file.", param=part.name, code="invalid_type")
        if part.name in body:
            raise invalid_request(f"'{part.name}' was given more than once.", param=part.name, code="invalid_value")
        try:
            text = part.content.decode()
        except UnicodeDecodeError:
            raise invalid_request(f"'{part.name}' is not UTF-8 text.", param=part.name, code="invalid_value") from None
        body[part.name] = _integer(part.name, text) if part.name in INTEGERS else text
    _count(uploads, variation=variation)
    check_body(body, identifiers=images.IMAGE_IDENTIFIERS)
    size = body.get("size")
    if isinstance(size, str) and size != "auto":
        images.dimensions(size)
    try:
        model = ImageVariationRequest if variation else ImageEditRequest
        request = model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    return Form(request=request, body=body, images=uploads["image"], masks=uploads["mask"])


def _known(name: str, allowed: frozenset[str], *, variation: bool) -> None:
    if not variation and name in EDIT_UNSUPPORTED:
        raise invalid_request(
            f"'{name}' is not supported by this gateway's image edits.", param=name, code="unsupported_parameter"
        )
    if name not in allowed:  # connection settings (api_base, api_key, ...) included
        raise invalid_request(f"Unrecognized request argument supplied: {name}", param=name, code="unknown_parameter")


def _integer(name: str, value: str) -> int:
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 9:
        raise invalid_request(f"Invalid type for '{name}': expected an integer.", param=name, code="invalid_type")
    return int(text)


def _upload(field: str, content: bytes, *, variation: bool) -> Upload:
    kind = next(
        (name for name, starts in SIGNATURES.items() if content.startswith(starts)),
        "webp" if content[:4] == b"RIFF" and content[8:12] == b"WEBP" else None,
    )
    if kind is None:
        raise invalid_request(
            f"'{field}' must be a PNG, JPEG or WebP image; this file is none of them.",
            param=field,
            code="invalid_image_format",
        )
    if kind != "png" and (field == "mask" or variation):
        what = "The mask" if field == "mask" else "A variation's image"
        raise invalid_request(f"{what} must be a PNG image.", param=field, code="invalid_image_format")
    return Upload(field=field, format=kind, content=content)


def _count(uploads: dict[str, list[Upload]], *, variation: bool) -> None:
    found = len(uploads["image"])
    most = 1 if variation else MAX_INPUT_IMAGES
    if not found:
        raise invalid_request("Missing required parameter: 'image'.", param="image", code="missing_required_parameter")
    if found > most:
        message = f"Too many images: {found}; at most {most}."
        raise invalid_request(message, param="image", code="too_many_images")
    if len(uploads["mask"]) > 1:
        raise invalid_request("One mask at most.", param="mask", code="invalid_value")


# --- the request path ---------------------------------------------------------------------------------


async def edit(headers, raw_body: bytes) -> Reply:
    call = Call(request_id=request_id_from(headers.get("x-sentinel-request-id")))
    return await answered(call, lambda: _serve(call, headers, raw_body, variation=False))


async def variation(headers, raw_body: bytes) -> Reply:
    call = Call(request_id=request_id_from(headers.get("x-sentinel-request-id")))
    return await answered(call, lambda: _serve(call, headers, raw_body, variation=True))


async def _serve(call: Call, headers, raw_body: bytes, *, variation: bool) -> Reply:
    call.key = await identify(headers, None)
    form = await read_form(headers, raw_body, variation=variation)
    call.request, call.body = form.request, form.body
    admit_with = _admit_variation if variation else images.admit
    _, chain = await route_and_admit(call, headers, None, model_of=lambda c: c.request.model, admit_with=admit_with)
    if variation:
        chain = variation_chain(call.request.model, chain)
    else:
        await images.screen_prompt(call)

    async def make(target: Target, body: dict, *, timeout: float, request_id: str) -> dict:
        return await _make(target, body, form, variation=variation, timeout=timeout, request_id=request_id)

    response = await call_chain(call, chain, stream=False, complete=make)
    return await images.deliver(call, response)


def variation_chain(model: str, chain: list[Target]) -> list[Target]:
    """The deployments of the chain that make variations: those called in OpenAI's format."""
    able = [target for target in chain if target.fast is not None and target.fast.images_url is not None]
    if not able:
        raise invalid_request(
            f"The model '{model}' has no deployment that makes image variations (an OpenAI-format provider).",
            param="model",
            code="model_not_supported",
        )
    return able


async def _admit_variation(call: Call, route: ModelRoute, chain: list[Target]):
    return await images.admit(call, route, variation_chain(call.request.model, chain))


async def _make(target: Target, body: dict, form: Form, *, variation: bool, timeout: float, request_id: str) -> dict:
    """One deployment's images, as OpenAI's answer."""
    allowed = VARIATION_PARAMETERS if variation else EDIT_PARAMETERS
    # A null is the parameter's default: left out, as the SDK leaves it out.
    args = {name: body[name] for name in allowed - {"model"} if body.get(name) is not None}
    expected = body.get("n") or 1
    if target.fast is not None and target.fast.images_url is not None:
        endpoint = "variations" if variation else "edits"
        payload = await transport.image_form(
            target.fast, endpoint, args, form.files(), timeout=timeout, request_id=request_id
        )
        return images.openai_answer(payload, expected)
    files = form.files()
    pictures = [_named(filename, content) for field, filename, content, _ in files if field != "mask"]
    masks = [_named(filename, content) for field, filename, content, _ in files if field == "mask"]
    args.update(deployment_arguments(target, request_id=request_id, image=pictures, mask=masks[0] if masks else None))
    response = await through_litellm(litellm.aimage_edit, args, timeout=timeout)
    return images.openai_answer(response.model_dump(exclude_none=True), expected)


def _named(filename: str, content: bytes) -> io.BytesIO:
    """A file litellm's edit call reads (it takes no (name, bytes) pairs for the mask)."""
    file = io.BytesIO(content)
    file.name = filename
    return file
