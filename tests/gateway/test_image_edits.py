"""POST /v1/images/edits and /v1/images/variations end to end: the official OpenAI SDK's multipart
uploads against a real gateway process, which sends the form on to the mock provider (OpenAI's
format) or through litellm.aimage_edit: the images made from the images uploaded, per-image prices in
the ledger, failover, allowlists, budgets, screening of the prompt, and hostile forms."""

from __future__ import annotations

import base64
import hashlib
import io
import random
from decimal import Decimal

import httpx
import openai
import pytest
from openai import OpenAI
from PIL import Image

from gateway.image_edits import EDIT_PARAMETERS, EDIT_UNSUPPORTED, VARIATION_PARAMETERS
from gateway.mock_dialects import edit_seed, image_of
from gateway.models import Deployment
from gateway.screening.models import ScreeningPolicy
from tenants.models import Budget
from tests.gateway import test_images
from tests.gateway.test_dialect_chains import ledger_rows
from tests.gateway.test_images import HIGH_1024X1024, IMAGE_MODEL, LOW_1024X1536

image_chain = test_images.image_chain  # the image models' fixture, shared


def picture(color: tuple[int, int, int], kind: str = "PNG", side: int = 4) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), color).save(buffer, format=kind)
    return buffer.getvalue()


RED, BLUE, MASK = picture((255, 0, 0)), picture((0, 0, 255), "JPEG"), picture((0, 0, 0))
WEBP = picture((0, 255, 0), "WEBP")


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def made(kind: str, prompt: str, images: list[bytes], masks: list[bytes], count: int) -> list[bytes]:
    """The mock provider's images for an edit or variation of these files (gateway.mock_dialects)."""
    return [image_of(f"{kind}:{edit_seed(prompt, images, masks)}", index) for index in range(count)]


def test_the_allowlists_are_openais_request_schemas_less_streaming_video_and_vectors():
    """The official SDK's ImageEditParams and ImageCreateVariationParams: each parameter is served
    or refused by name (a new SDK with a new parameter fails this test: decide which it is)."""
    from openai.types.image_create_variation_params import ImageCreateVariationParams
    from openai.types.image_edit_params import ImageEditParamsBase

    files = {"image", "mask"}
    assert set(ImageEditParamsBase.__annotations__) | {"stream"} == EDIT_PARAMETERS | EDIT_UNSUPPORTED | files
    assert not EDIT_PARAMETERS & EDIT_UNSUPPORTED
    assert set(ImageCreateVariationParams.__annotations__) == VARIATION_PARAMETERS | {"image"}


def test_the_sdk_edits_images_sent_on_as_openais_form_and_billed_per_image(
    gateway, tenant, make_key, image_chain, mock_provider
):
    model, (provider,) = image_chain()
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0, timeout=30)

    raw = client.images.with_raw_response.edit(
        model=model,
        image=[("../../etc/passwd\x07.png", RED, "image/gif"), ("b.jpg", BLUE)],
        mask=("mask.png", MASK),
        prompt="make the sky green",
        n=2,
        size="1024x1536",
        quality="low",
        input_fidelity="high",
        user="end-user-7",
    )
    answer = raw.parse()
    assert [base64.b64decode(item.b64_json) for item in answer.data] == made(
        "edit", "make the sky green", [RED, BLUE], [MASK], 2
    )
    assert (answer.size, answer.quality) == ("1024x1536", "low")
    assert Decimal(raw.headers["x-sentinel-cost-usd"]) == 2 * LOW_1024X1536
    # The provider got OpenAI's form: the deployment's model, the parameters asked for, and the files
    # named by the format their bytes show, never by the client.
    form = mock_provider.stats(provider)["last_form"]
    assert form == {
        "model": "gpt-image-1",
        "prompt": "make the sky green",
        "n": "2",
        "size": "1024x1536",
        "quality": "low",
        "input_fidelity": "high",
        "user": "end-user-7",
        "image": [["image.png", sha(RED), "image/png"], ["image-2.jpeg", sha(BLUE), "image/jpeg"]],
        "mask": [["mask.png", sha(MASK), "image/png"]],
    }
    request_id = raw.headers["x-sentinel-request-id"]
    assert mock_provider.stats(provider)["last_request_id"] == request_id
    row = ledger_rows([request_id])[request_id]
    assert (row.status_code, row.model_requested, row.model_served, row.provider, row.images, row.cost_usd) == (
        200,
        model,
        IMAGE_MODEL,
        provider,
        2,
        2 * LOW_1024X1536,
    )
    assert row.end_user == "end-user-7"

    # One WebP image, no mask, a URL back: billed at the dearest quality of the default size.
    one = client.images.with_raw_response.edit(
        model=model, image=("x.webp", WEBP), prompt="add a hat", response_format="url"
    )
    (image,) = one.parse().data
    expected = made("edit", "add a hat", [WEBP], [], 1)[0]
    assert image.url == "data:image/png;base64," + base64.b64encode(expected).decode()
    assert Decimal(one.headers["x-sentinel-cost-usd"]) == HIGH_1024X1024
    assert mock_provider.stats(provider)["last_form"]["image"] == [["image.webp", sha(WEBP), "image/webp"]]


def test_an_edit_fails_over_to_a_deployment_called_through_litellm(gateway, api_key, image_chain, mock_provider):
    model, (first, second) = image_chain("auto", "litellm")
    mock_provider.control(first, error_rate=1.0, error_status=503)
    Deployment.objects.filter(name=second).update(image_price_override=Decimal("0.05"))
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30)
    raw = client.images.with_raw_response.edit(
        model=model, image=[("a.png", RED), ("b.png", MASK)], mask=("m.png", MASK), prompt="a red fox", n=3
    )
    assert (raw.headers["x-sentinel-provider"], raw.headers["x-sentinel-fallbacks"]) == (second, "1")
    images = [base64.b64decode(item.b64_json) for item in raw.parse().data]
    assert images == made("edit", "a red fox", [RED, MASK], [MASK], 3)
    form = mock_provider.stats(second)["last_form"]
    assert [file[1] for file in form["image"]] == [sha(RED), sha(MASK)] and form["mask"][0][1] == sha(MASK)
    assert (form["model"], form["n"], form["prompt"]) == ("gpt-image-1", "3", "a red fox")
    request_id = raw.headers["x-sentinel-request-id"]
    row = ledger_rows([request_id])[request_id]
    assert (row.deployment, row.images, row.cost_usd, row.fallback_reasons) == (
        second,
        3,
        Decimal("0.15"),
        f"{first}=server_error",
    )


def test_the_sdk_makes_variations_at_openai_format_deployments_only(gateway, api_key, image_chain, mock_provider):
    # The chain's first deployment goes through litellm, whose variations drop n and size: left out.
    model, (through_litellm, direct) = image_chain("litellm", "auto")
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30)
    raw = client.images.with_raw_response.create_variation(model=model, image=("photo.png", RED), n=2, size="1024x1024")
    assert [base64.b64decode(item.b64_json) for item in raw.parse().data] == made("variation", "", [RED], [], 2)
    assert raw.headers["x-sentinel-provider"] == direct
    assert Decimal(raw.headers["x-sentinel-cost-usd"]) == 2 * HIGH_1024X1024  # no quality: the dearest
    assert mock_provider.stats(direct)["last_form"] == {
        "model": "gpt-image-1",
        "n": "2",
        "size": "1024x1024",
        "image": [["image.png", sha(RED), "image/png"]],
    }
    assert mock_provider.stats(through_litellm)["calls"] == 0
    request_id = raw.headers["x-sentinel-request-id"]
    row = ledger_rows([request_id])[request_id]
    assert (row.images, row.cost_usd, row.provider) == (2, 2 * HIGH_1024X1024, direct)

    only_litellm, (alone,) = image_chain("litellm")
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.create_variation(model=only_litellm, image=("p.png", RED))
    assert (refused.value.body["code"], refused.value.body["param"]) == ("model_not_supported", "model")
    assert mock_provider.stats(alone)["calls"] == 0


def test_allowlists_budgets_and_screening_hold_for_edits(gateway, make_tenant, make_key, image_chain, mock_provider):
    model, (provider,) = image_chain()
    other, _ = image_chain()
    tenant = make_tenant()
    limited = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant, allowed_models=[other]), max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        limited.images.edit(model=model, image=("a.png", RED), prompt="x")
    assert (refused.value.body["code"], refused.value.body["param"]) == ("model_not_allowed", "model")
    with pytest.raises(openai.PermissionDeniedError):
        limited.images.create_variation(model=model, image=("a.png", RED))
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=gateway.base_url, api_key="sk-sen-wrong", max_retries=0).images.edit(
            model=model, image=("a.png", RED), prompt="x"
        )

    # Four variations could cost 0.668: more than the tenant's daily budget of 0.5 covers.
    Budget.objects.create(tenant=tenant, period="daily", limit_usd=Decimal("0.5"))
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        client.images.create_variation(model=model, image=("a.png", RED), n=4)
    assert (refused.value.status_code, refused.value.body["code"]) == (402, "budget_exceeded")

    screened = make_tenant()
    ScreeningPolicy.objects.create(tenant=screened, email="block")
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(screened), max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.edit(model=model, image=("a.png", RED), prompt="put ann.meyer@example.com on the sign")
    error = refused.value.response.json()["error"]
    assert (error["code"], error["param"]) == ("content_policy_violation", "prompt")
    assert "ann.meyer" not in error["message"]
    assert mock_provider.stats(provider)["calls"] == 0


def form(*parts: tuple[str, object], boundary: str = "b0undary") -> tuple[bytes, str]:
    """A multipart body of (name, text) and (name, (filename, bytes)) parts."""
    out = io.BytesIO()
    for name, value in parts:
        out.write(f"--{boundary}\r\n".encode())
        if isinstance(value, tuple):
            filename, content = value
            out.write(f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'.encode())
            out.write(b"Content-Type: application/octet-stream\r\n\r\n" + content + b"\r\n")
        else:
            out.write(f'Content-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + str(value).encode())
            out.write(b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


def post(gateway, api_key: str, endpoint: str, body: bytes, content_type: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/images/{endpoint}",
        headers={"authorization": f"Bearer {api_key}", "content-type": content_type},
        content=body,
        timeout=30,
    )


IMAGE = ("image", ("a.png", RED))
EDIT_BAD_INPUT = [
    ([("prompt", "x")], "missing_required_parameter", "image"),
    ([("image", "not a file"), ("prompt", "x")], "invalid_image_format", "image"),  # a file without a filename
    ([("image", ("a.png", b"GIF89a not an image")), ("prompt", "x")], "invalid_image_format", "image"),
    ([("image", ("a.png", b"")), ("prompt", "x")], "invalid_image_format", "image"),
    ([IMAGE, ("mask", ("m.jpg", BLUE)), ("prompt", "x")], "invalid_image_format", "mask"),
    ([IMAGE, ("mask", ("m.png", MASK)), ("mask", ("n.png", MASK)), ("prompt", "x")], "invalid_value", "mask"),
    ([*[("image[]", (f"{i}.png", RED)) for i in range(17)], ("prompt", "x")], "too_many_images", "image"),
    ([IMAGE], "missing_required_parameter", "prompt"),
    ([IMAGE, ("prompt", "")], "invalid_value", "prompt"),
    ([IMAGE, ("prompt", "a\x00b")], "invalid_value", "prompt"),
    ([IMAGE, ("prompt", "x"), ("n", "two")], "invalid_type", "n"),
    ([IMAGE, ("prompt", "x"), ("n", "0")], "invalid_value", "n"),
    ([IMAGE, ("prompt", "x"), ("n", "١")], "invalid_type", "n"),  # an Arabic-Indic one: a digit, not ASCII
    ([IMAGE, ("prompt", "x"), ("n", "99999999999999999999")], "invalid_type", "n"),
    ([IMAGE, ("prompt", "x"), ("n", "1"), ("n", "2")], "invalid_value", "n"),
    ([IMAGE, ("prompt", "x"), ("size", "10x10")], "invalid_value", "size"),
    ([IMAGE, ("prompt", "x"), ("quality", "ultra")], "invalid_value", "quality"),
    ([IMAGE, ("prompt", "x"), ("user", "me\x07")], "invalid_value", "user"),
    ([IMAGE, ("prompt", "x"), ("api_base", "http://127.0.0.1:9")], "unknown_parameter", "api_base"),
    ([IMAGE, ("prompt", "x"), ("api_key", ("key.txt", b"sk-mine"))], "unknown_parameter", "api_key"),
    ([IMAGE, ("prompt", ("p.txt", b"x"))], "invalid_type", "prompt"),
    ([IMAGE, ("prompt", "x"), ("stream", "true")], "unsupported_parameter", "stream"),
    ([IMAGE, ("prompt", "x"), ("svg", "true")], "unsupported_parameter", "svg"),
]
VARIATION_BAD_INPUT = [
    ([("n", "1")], "missing_required_parameter", "image"),
    ([("image", ("a.jpg", BLUE))], "invalid_image_format", "image"),
    ([IMAGE, ("image", ("b.png", RED))], "too_many_images", "image"),
    ([IMAGE, ("prompt", "x")], "unknown_parameter", "prompt"),
    ([IMAGE, ("mask", ("m.png", MASK))], "unknown_parameter", "mask"),
    ([IMAGE, ("size", "1x1")], "invalid_value", "size"),
    ([IMAGE, ("n", "11")], "invalid_value", "n"),
]


@pytest.mark.parametrize(("endpoint", "cases"), [("edits", EDIT_BAD_INPUT), ("variations", VARIATION_BAD_INPUT)])
def test_bad_forms_are_a_400_in_openais_shape_and_reach_no_provider(
    gateway, api_key, image_chain, mock_provider, endpoint, cases
):
    model, (provider,) = image_chain()
    for parts, code, param in cases:
        body, content_type = form(("model", model), *parts)
        response = post(gateway, api_key, endpoint, body, content_type)
        assert response.status_code == 400, (parts, response.text)
        error = response.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param), parts
        assert set(error) == {"message", "type", "param", "code"}
    assert mock_provider.stats(provider)["calls"] == 0


def test_what_is_no_form_is_refused_whole_and_mangled_forms_never_fail_the_gateway(
    gateway, api_key, image_chain, mock_provider
):
    model, _ = image_chain()
    refused = [
        (b'{"model": "m", "prompt": "x"}', "application/json"),
        (b"--x\r\nnonsense", "multipart/form-data"),  # no boundary
        (b"no parts at all", "multipart/form-data; boundary=zzz"),
        (b"", "multipart/form-data; boundary=zzz"),
    ]
    for body, content_type in refused:
        response = post(gateway, api_key, "edits", body, content_type)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["type"] == "invalid_request_error"
    # Parts by the ten thousand (3.9 MiB of them, once seconds of parsing) and one over the 64 allowed.
    for count in (65, 60_000):
        body, content_type = form(("model", model), IMAGE, *[("x", "v")] * (count - 2))
        response = post(gateway, api_key, "edits", body, content_type)
        assert response.status_code == 400, response.text
        assert "more than 64 parts" in response.json()["error"]["message"]
    # A valid form cut and flipped at random places: a 400 or an answer, never a 500 or a traceback.
    valid, content_type = form(("model", model), IMAGE, ("prompt", "a cat"))
    rng = random.Random(25)
    statuses = set()
    for _ in range(60):
        mangled = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(mangled))
            mangled[at] = rng.randrange(256)
        mangled = mangled[: rng.randint(len(mangled) // 2, len(mangled))] if rng.random() < 0.3 else mangled
        response = post(gateway, api_key, "edits", bytes(mangled), content_type)
        statuses.add(response.status_code)
        assert response.status_code in (200, 400, 404), response.text  # 404: a model name changed
        assert "Traceback" not in response.text and 'File "' not in response.text
        if response.status_code != 200:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert 400 in statuses
    # Larger than the body limit: a 413 before anything is read.
    big, content_type = form(("model", model), ("image", ("big.png", RED + b"\x00" * (5 * 1024 * 1024))))
    response = post(gateway, api_key, "edits", big, content_type)
    assert (response.status_code, response.json()["error"]["code"]) == (413, "request_too_large")
