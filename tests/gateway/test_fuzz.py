"""Schemathesis against the served OpenAPI schema, on a real gateway process: every operation in the
schema (so endpoints added later are fuzzed too) gets valid and invalid requests, and must never
answer 5xx, nor anything its schema does not allow (bad chat bodies: a 4xx in OpenAI's error shape).
Examples are bounded so the whole run stays well under a minute."""

from __future__ import annotations

import copy
import io
import json
import secrets
from datetime import timedelta

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import negative_data_rejection

from sentinel.text import CONTROL
from tests.conftest import unique
from tests.servers import start_gateway

EXAMPLES_PER_OPERATION = 40
FUZZ_MODEL = unique("fuzz-model")
FUZZ_EMBEDDING_MODEL = unique("fuzz-embedding-model")
FUZZ_IMAGE_MODEL = unique("fuzz-image-model")
FUZZ_KEY = "sk-sen-" + secrets.token_urlsafe(32)
FUZZ_SESSION = secrets.token_hex(16)
FUZZ_CSRF = secrets.token_hex(16)  # Django accepts any 32 alphanumerics as cookie and header


@pytest.fixture(scope="module")
def gateway(test_database_name, mock_provider, embedding_model):
    """This module's own gateway. The fuzzer sends bad credentials by the hundred, which the
    brute-force guard rightly answers with 429 after a few (tests/sentinel/test_authentication.py);
    here it must let the fuzzer see the 401 each one deserves."""
    server = start_gateway(
        test_database_name,
        env={"SENTINEL_LOGIN_RATE_PER_IP": "100000/m", "SENTINEL_LOGIN_RATE_PER_USER": "100000/m"},
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fuzz_target(gateway, django_db_blocker, mock_provider):
    """The key, model and console session the fuzzed requests use. Set up once per worker: with
    `--dist worksteal` a worker can be handed this module's tests in two batches, and pytest then
    sets a module's fixture up again (its rows, named by this module's constants, are still there:
    a full run failed 33 cases at setup on the key's unique digest)."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
    from tenants.models import Tenant, VirtualKey
    from tenants.services import key_digest

    with django_db_blocker.unblock():
        if VirtualKey.objects.filter(digest=key_digest(FUZZ_KEY)).exists():
            return
        tenant = Tenant.objects.create(name=unique("fuzz"), slug=unique("fuzz"))
        VirtualKey.objects.create(tenant=tenant, name="fuzz", prefix=FUZZ_KEY[:12], digest=key_digest(FUZZ_KEY))
        alias = ModelAlias.objects.create(name=FUZZ_MODEL)
        name = unique("fuzz-prov")
        provider = Provider(name=name, kind="openai", api_base=mock_provider.api_base(name))
        provider.set_api_key("sk-test-fuzz")
        provider.save()
        deployment = Deployment.objects.create(name=name, provider=provider, litellm_model="openai/gpt-4o-mini")
        ChainEntry.objects.create(alias=alias, deployment=deployment, position=0)
        embedder = Deployment.objects.create(
            name=unique("fuzz-embed"), provider=provider, litellm_model="openai/text-embedding-3-small"
        )
        embeddings = ModelAlias.objects.create(name=FUZZ_EMBEDDING_MODEL)
        ChainEntry.objects.create(alias=embeddings, deployment=embedder, position=0)
        painter = Deployment.objects.create(
            name=unique("fuzz-image"), provider=provider, litellm_model="openai/gpt-image-1"
        )
        ChainEntry.objects.create(
            alias=ModelAlias.objects.create(name=FUZZ_IMAGE_MODEL), deployment=painter, position=0
        )
        user = get_user_model().objects.create_superuser(unique("fuzzer"), password=None)
        data = {
            SESSION_KEY: str(user.pk),
            BACKEND_SESSION_KEY: settings.AUTHENTICATION_BACKENDS[0],
            HASH_SESSION_KEY: user.get_session_auth_hash(),
        }
        expires = timezone.now() + timedelta(hours=1)
        Session.objects.create(session_key=FUZZ_SESSION, session_data=SessionStore().encode(data), expire_date=expires)
    assert httpx.get(f"{gateway.url}/admin/", cookies={"sessionid": FUZZ_SESSION}).status_code == 200


def served_schema() -> dict:
    """The schema /api/schema/ serves, built in this process (test_the_fuzzed_schema_is_the_served_one
    holds the two together): schemathesis needs it when tests are collected, before any server runs."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer

    return orjson.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))


def fuzzable(raw: dict) -> dict:
    # Generated chat, embeddings, images, responses and messages requests name the models the fixture
    # serves (invalid ones still name anything).
    raw = copy.deepcopy(raw)
    raw["components"]["schemas"]["ChatChatRequest"]["properties"]["model"]["enum"] = [FUZZ_MODEL]
    raw["components"]["schemas"]["EmbeddingsEmbeddingRequest"]["properties"]["model"]["enum"] = [FUZZ_EMBEDDING_MODEL]
    raw["components"]["schemas"]["ResponsesResponsesRequest"]["properties"]["model"]["enum"] = [FUZZ_MODEL]
    for name in ("ImagesImageRequest", "ImageEditsImageEditRequest", "ImageVariationsImageVariationRequest"):
        raw["components"]["schemas"][name]["properties"]["model"]["enum"] = [FUZZ_IMAGE_MODEL]
    for name in ("MessagesMessagesRequest", "MessagesCountTokensRequest"):
        raw["components"]["schemas"][name]["properties"]["model"]["enum"] = [FUZZ_MODEL]
    return raw


def _pictures(kind: str) -> list[bytes]:
    """A few small images of one format, for the image forms' files (schema-valid data: any bytes
    would be refused as no image, which the schema cannot say)."""
    from PIL import Image

    made = []
    for side, color in [(1, (0, 0, 0)), (4, (255, 0, 0)), (16, (10, 200, 30))]:
        buffer = io.BytesIO()
        Image.new("RGB", (side, side), color).save(buffer, format=kind)
        made.append(buffer.getvalue())
    return made


for _kind in ("png", "jpeg", "webp"):
    schemathesis.openapi.media_type(f"image/{_kind}", st.sampled_from(_pictures(_kind.upper())))

fuzzed = schemathesis.openapi.from_dict(fuzzable(served_schema()))


def test_the_fuzzed_schema_is_the_served_one(gateway):
    served = httpx.get(f"{gateway.url}/api/schema/", params={"format": "json"})
    assert served.status_code == 200
    assert served.json() == served_schema()


# The auth providers hand these to each case, so schemathesis knows them for what they are (it also
# checks that requests without them are refused). Known before collection, because schemathesis
# builds some cases then; the fuzz_target fixture creates the rows behind them.


@fuzzed.auth(refresh_interval=None, retry_on=[]).apply_to(tag="gateway")
class VirtualKeyAuth:
    def get(self, case, context):
        return FUZZ_KEY

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@fuzzed.auth(refresh_interval=None, retry_on=[]).skip_for(tag="gateway")
class ConsoleSessionAuth:
    def get(self, case, context):
        return {"sessionid": FUZZ_SESSION, "csrftoken": FUZZ_CSRF}

    def set(self, case, data, context):
        case.cookies = {**(case.cookies or {}), **data}
        case.headers = {**(case.headers or {}), "x-csrftoken": data["csrftoken"]}


@fuzzed.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=True,
)
def test_no_server_error_and_every_answer_fits_the_schema(case, gateway, fuzz_target):
    if _positive_but_off_its_enum(case):
        # Schemathesis's coverage phase sends the image forms' `model` empty in a case it calls
        # schema-valid (the schema's enum names one model): a 400 is right, so check only that the
        # answer is no 5xx and in OpenAI's error shape.
        response = case.call(base_url=gateway.url, timeout=30)
        assert response.status_code == 400, response.text
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        return
    if case.operation.path in MULTIPART_FORMS:
        # On a form's wire every value is text: an array or a number generated as "schema-violating"
        # arrives as a string the field may take (`user` "[0]"). Bad forms have their own test
        # (tests/gateway/test_image_edits.py); here, still no 5xx and every answer in its schema.
        case.call_and_validate(base_url=gateway.url, timeout=30, excluded_checks=[negative_data_rejection])
        return
    case.call_and_validate(base_url=gateway.url, timeout=30)


MULTIPART_FORMS = ("/v1/images/edits", "/v1/images/variations")


def _positive_but_off_its_enum(case) -> bool:
    return (
        case.meta is not None
        and case.meta.phase.name == "coverage"
        and case.meta.generation.mode.name == "POSITIVE"
        and case.operation.path in MULTIPART_FORMS
        and isinstance(case.body, dict)
        and case.body.get("model") != FUZZ_IMAGE_MODEL
    )


# --- hypothesis at each field: control characters, deep nesting, huge strings, unknown types ---------
# Through the real gateway process: no 500, and every batch made of such lines leaves `validating`
# (read here with the batch service a worker runs: this module has no worker).

CONTROL_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x9F), min_size=1, max_size=6)
HUGE_TEXT = st.builds(lambda c, n: c * n, st.characters(), st.integers(10_000, 300_000))
TEXT = st.text(max_size=20) | CONTROL_TEXT | HUGE_TEXT
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8
)
DEEP = st.builds(lambda n: json.loads("[" * n + "]" * n), st.integers(60, 300))
CHAT_FIELDS = ["model", "messages", "user", "metadata", "cache", "tools", "stop", "max_tokens", "stream", "x_extra"]
HYPOTHESIS_SETTINGS = settings(
    max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


@st.composite
def fuzzed_chat_body(draw) -> dict:
    body = {"model": FUZZ_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    body[draw(st.sampled_from(CHAT_FIELDS))] = draw(VALUES | DEEP)
    return body


def assert_answered_without_500(gateway, path: str, body: dict) -> None:
    """A status under 500, and a refusal in OpenAI's error shape."""
    response = httpx.post(
        f"{gateway.url}{path}",
        headers={"authorization": f"Bearer {FUZZ_KEY}", "content-type": "application/json"},
        content=json.dumps(body).encode(),
        timeout=30,
    )
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@HYPOTHESIS_SETTINGS
@given(body=fuzzed_chat_body())
def test_chat_fields_never_answer_500(gateway, fuzz_target, body):
    assert_answered_without_500(gateway, "/v1/chat/completions", body)


RESPONSES_FIELDS = ["input", "instructions", "previous_response_id", "tools", "text", "metadata", "user", "api_base"]
INPUT_ITEM_FIELDS = ["type", "role", "content", "call_id", "output", "name", "arguments", "server_url"]


@st.composite
def fuzzed_responses_body(draw) -> dict:
    body: dict = {"model": FUZZ_MODEL, "input": [{"role": "user", "content": "hi"}]}
    if draw(st.booleans()):
        body[draw(st.sampled_from(RESPONSES_FIELDS))] = draw(VALUES | DEEP)
    else:  # an input item's field
        body["input"][0][draw(st.sampled_from(INPUT_ITEM_FIELDS))] = draw(VALUES | DEEP)
    return body


@HYPOTHESIS_SETTINGS
@given(body=fuzzed_responses_body())
def test_responses_fields_never_answer_500(gateway, fuzz_target, body):
    assert_answered_without_500(gateway, "/v1/responses", body)


@st.composite
def fuzzed_batch_line(draw) -> bytes:
    line = {"custom_id": draw(TEXT), "method": "POST", "url": "/v1/chat/completions", "body": draw(fuzzed_chat_body())}
    if draw(st.booleans()):
        line[draw(st.sampled_from(["custom_id", "method", "url", "body"]))] = draw(VALUES | DEEP)
    return json.dumps(line).encode()


@HYPOTHESIS_SETTINGS
@given(
    lines=st.lists(fuzzed_batch_line(), min_size=1, max_size=3),
    filename=TEXT.filter(lambda name: len(name) < 1000),
    metadata=VALUES,
)
def test_files_and_batches_never_answer_500_and_no_batch_stays_validating(
    gateway, fuzz_target, django_db_blocker, lines, filename, metadata
):
    from gateway.batches import services
    from gateway.batches.models import Batch

    headers = {"authorization": f"Bearer {FUZZ_KEY}"}
    uploaded = httpx.post(
        f"{gateway.url}/v1/files",
        headers=headers,
        data={"purpose": "batch"},
        files={"file": (filename, b"\n".join(lines))},
        timeout=30,
    )
    assert uploaded.status_code < 500, uploaded.text
    if uploaded.status_code != 200:
        return
    assert not CONTROL.search(uploaded.json()["filename"])
    created = httpx.post(
        f"{gateway.url}/v1/batches",
        headers=headers,
        json={
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": metadata,
        },
        timeout=30,
    )
    assert created.status_code < 500, created.text
    if created.status_code != 200:
        return
    with django_db_blocker.unblock():
        batch = Batch.objects.get(public_id=created.json()["id"])
        services.batch_start(batch_id=batch.pk)
        batch.refresh_from_db()
        assert batch.status in (Batch.Status.IN_PROGRESS, Batch.Status.FAILED, Batch.Status.CANCELLED)
        if batch.status == Batch.Status.FAILED:
            assert batch.errors["data"] and all(e["code"] != "unreadable_line" for e in batch.errors["data"])
        services.batch_cancel(batch=batch)  # nothing of the fuzz runs on a worker of another test
