"""The gateway's endpoints in the OpenAPI schema that drf-spectacular builds for the management API.

The OpenAI-compatible API and the probes are plain async Django views (DRF would cost the hot path a
thread hop), so drf-spectacular cannot see them; this postprocessing hook adds them. Their schemas
are not written by hand: the request body is the JSON Schema of the pydantic model that validates it
(gateway.schemas.ChatRequest) and the answer is the official OpenAI SDK's own model of a completion,
so the documentation cannot drift from what the gateway accepts and returns.
"""

from __future__ import annotations

import warnings
from typing import Any

from litellm.types.llms.anthropic_messages.anthropic_response import AnthropicMessagesResponse
from openai.types import (
    Batch,
    CreateEmbeddingResponse,
    FileDeleted,
    FileObject,
    ImagesResponse,
    VectorStore,
    VectorStoreDeleted,
    VectorStoreSearchResponse,
)
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.vector_stores import VectorStoreFile, VectorStoreFileDeleted
from pydantic import BaseModel, TypeAdapter

from gateway.batches.schemas import BatchCreate
from gateway.bodies import BATCH_CREATE_IDENTIFIERS, CHAT_IDENTIFIERS, NO_CONTROL, document_limits
from gateway.embeddings import EMBEDDING_IDENTIFIERS, EmbeddingRequest
from gateway.image_edits import MAX_INPUT_IMAGES, ImageEditRequest, ImageVariationRequest
from gateway.images import IMAGE_IDENTIFIERS, ImageRequest
from gateway.knowledge import schemas as knowledge
from gateway.messages import MESSAGES_IDENTIFIERS, CountTokensRequest, MessagesRequest
from gateway.responses.schemas import RESPONSES_IDENTIFIERS, ResponsesRequest
from gateway.schemas import ChatRequest

# What gateway.cache.engine.controls_from accepts in the body's `cache` object (it refuses any other member).
CACHE_CONTROLS = {
    "description": "Sentinel's per-request cache controls (never sent to a provider).",
    "anyOf": [
        {"type": "null"},
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "no-cache": {"type": "boolean", "description": "Do not read the cache."},
                "no-store": {"type": "boolean", "description": "Do not store the answer."},
                "ttl": {"type": "integer", "minimum": 1, "maximum": 30 * 86400, "description": "Seconds."},
                "namespace": {"type": "string", "maxLength": 100, "pattern": NO_CONTROL},
            },
        },
    ],
}


def _component(model: type[BaseModel], prefix: str, components: dict[str, Any]) -> dict[str, str]:
    """Add the model's JSON Schema (and its nested models) under prefixed names; returns a $ref."""
    template = "#/components/schemas/" + prefix + "{model}"
    schema = model.model_json_schema(ref_template=template, mode="validation")
    return _add(schema, model.__name__, prefix, components)


def _typed_component(kind: Any, name: str, prefix: str, components: dict[str, Any]) -> dict[str, str]:
    """The JSON Schema of a typed dict (litellm's answer types) as a component; returns a $ref."""
    template = "#/components/schemas/" + prefix + "{model}"
    with warnings.catch_warnings():  # litellm's typed dicts mark fields ReadOnly, which pydantic remarks on
        warnings.simplefilter("ignore", UserWarning)
        schema = TypeAdapter(kind).json_schema(ref_template=template, mode="serialization")
    return _add(schema, name, prefix, components)


def _add(schema: dict[str, Any], name: str, prefix: str, components: dict[str, Any]) -> dict[str, str]:
    for nested_name, nested in schema.pop("$defs", {}).items():
        components[prefix + nested_name] = nested
    components[prefix + name] = schema
    return _ref(prefix + name)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


ERROR = {
    "type": "object",
    "description": "OpenAI's error shape. `code` says precisely what went wrong; `param` names the field.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}

MODEL_LIST = {
    "type": "object",
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "object": {"const": "model"},
                    "created": {"type": "integer"},
                    "owned_by": {"type": "string"},
                },
                "required": ["id", "object", "created", "owned_by"],
            },
        },
    },
    "required": ["object", "data"],
}

HEALTH = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "degraded", "unavailable"]},
        "failing": {"type": "array", "items": {"type": "string", "enum": ["database", "redis"]}},
        "semantic_cache": {
            "type": "string",
            "enum": ["ready", "loading"],
            "description": "Readiness only: `loading` while this process loads its embedding model (a few "
            "seconds after start); until then the semantic tier is skipped, not waited for.",
        },
    },
    "required": ["status"],
}

_ID_HEADER = {
    "x-sentinel-request-id": {
        "description": "The request's id: yours when you sent a valid one, else a new one.",
        "schema": {"type": "string"},
    }
}
_COMPLETION_HEADERS = {
    **_ID_HEADER,
    "x-sentinel-provider": {"description": "The provider that answered.", "schema": {"type": "string"}},
    "x-sentinel-deployment": {"description": "The deployment that answered.", "schema": {"type": "string"}},
    "x-sentinel-fallbacks": {"description": "Deployments tried before it.", "schema": {"type": "string"}},
    "x-sentinel-cache": {
        "description": "How the cache served the request.",
        "schema": {"type": "string", "enum": ["hit-exact", "hit-semantic", "miss", "bypass"]},
    },
    "x-sentinel-cost-usd": {
        "description": "The exact cost the ledger records (not streamed answers).",
        "schema": {"type": "string"},
    },
    "x-sentinel-route": {
        "description": 'With `model: "auto"`: the model class chosen and why, e.g. `smart; reason=math`.',
        "schema": {"type": "string"},
    },
    "x-sentinel-escalated": {
        "description": "`<deployment>-><deployment>` when a refusal was retried on the smart model.",
        "schema": {"type": "string"},
    },
}
_REQUEST_ID_PARAMETER = {
    "name": "x-sentinel-request-id",
    "in": "header",
    "required": False,
    "description": "Your id for this request (letters, digits and `._:-`, at most 128); replaced when invalid.",
    "schema": {"type": "string"},
}
_SESSION_PARAMETER = {
    "name": "x-sentinel-session",
    "in": "header",
    "required": False,
    "description": (
        "The session of your app this request belongs to (else `metadata.session_id`), held to the key's "
        "session limits; at most 256 characters, no control characters. The end user is OpenAI's `user`."
    ),
    "schema": {"type": "string", "maxLength": 256, "pattern": NO_CONTROL},
}
_KEY_SECURITY = [{"VirtualKey": []}, {"VirtualKeyHeader": []}]
# The refusals of an endpoint that calls a provider (chat, embeddings, responses: each changes some).
_CALL_ERRORS = {
    400: "Malformed body: `invalid_json`, `missing_required_parameter`, `unknown_parameter`, "
    "`invalid_type`, `invalid_value`; or a request the provider refused as invalid.",
    401: "`invalid_api_key`: missing, unknown, revoked or expired key.",
    402: "`budget_exceeded`: a budget that applies is spent.",
    403: "`model_not_allowed` or `tenant_suspended`.",
    404: "`model_not_found`: no such model.",
    405: "`method_not_allowed`.",
    413: "`request_too_large`: the body is over the configured limit.",
    429: "`rate_limit_exceeded`, or the provider's rate limit.",
    502: "The provider failed in a way no fallback could fix.",
    503: "`all_providers_unavailable`, or `overloaded` (with Retry-After).",
    504: "The provider did not answer in time.",
}


def _error_responses(statuses: dict[int, str], schema: str = "Error") -> dict[str, Any]:
    return {str(status): _json(_ref(schema), description) for status, description in statuses.items()}


def _stream_event(chunk: dict[str, str]) -> dict[str, Any]:
    """One server-sent event of a streamed answer (before OpenAPI 3.2, a text/event-stream's schema
    describes each event): a chunk as JSON, an error object if the stream broke off, or [DONE]."""
    return {
        "type": "object",
        "properties": {
            "event": {"const": "message"},
            "data": {
                "anyOf": [
                    {"type": "string", "contentMediaType": "application/json", "contentSchema": chunk},
                    {"type": "string", "contentMediaType": "application/json", "contentSchema": _ref("Error")},
                    {"const": "[DONE]"},
                ]
            },
        },
        "required": ["data"],
    }


def gateway_paths(components: dict[str, Any]) -> dict[str, Any]:
    chat_request = _component(ChatRequest, "Chat", components)
    completion = _component(ChatCompletion, "OpenAI", components)
    chunk = _component(ChatCompletionChunk, "OpenAIStream", components)
    components["Error"] = ERROR
    components["ModelList"] = MODEL_LIST
    components["Health"] = HEALTH
    return {
        "/v1/chat/completions": {
            "post": {
                "operationId": "chat_completions_create",
                "summary": "Create a chat completion (OpenAI-compatible)",
                "description": (
                    "OpenAI's chat completions API: the fields of OpenAI's request schema, plus Sentinel's "
                    "`cache` controls. Any other field is refused (400 `unknown_parameter`, naming it), as "
                    "OpenAI refuses it: a request cannot set where or with which credentials the provider "
                    "is called. With `stream: true` the answer is a `text/event-stream` of "
                    "`data:` lines, each a chat.completion.chunk, ending with `data: [DONE]` (or, if the "
                    "provider's stream broke off after it started, an error object)."
                ),
                "tags": ["gateway"],
                "security": _KEY_SECURITY,
                "parameters": [_REQUEST_ID_PARAMETER, _SESSION_PARAMETER],
                "requestBody": {"required": True, "content": {"application/json": {"schema": chat_request}}},
                "responses": {
                    "200": {
                        "description": "The completion, or its stream.",
                        "headers": _COMPLETION_HEADERS,
                        "content": {
                            "application/json": {"schema": completion},
                            "text/event-stream": {"schema": _stream_event(chunk)},
                        },
                    },
                    **_error_responses(
                        {
                            **_CALL_ERRORS,
                            400: "Malformed body: `invalid_json`, `missing_required_parameter`, `unknown_parameter`, "
                            "`invalid_type`, `invalid_value`; `unsupported_parameter`: an OpenAI parameter the "
                            "model's provider has no equivalent for; or a request the provider refused as invalid; "
                            "`content_policy_violation`: the tenant's screening policy blocked it.",
                            503: "`all_providers_unavailable`: every deployment in the chain failed; "
                            "`overloaded`: every deployment is at its concurrency limit (with Retry-After); "
                            "`screening_unavailable`: the tenant's moderation provider or guardrail could not "
                            "screen the request.",
                        }
                    ),
                },
            }
        },
        "/v1/models": {
            "get": {
                "operationId": "models_list",
                "summary": "List the models this key may use (OpenAI-compatible)",
                "tags": ["gateway"],
                "security": _KEY_SECURITY,
                "parameters": [_REQUEST_ID_PARAMETER],
                "responses": {
                    "200": {
                        "description": "The models.",
                        "headers": _ID_HEADER,
                        "content": {"application/json": {"schema": _ref("ModelList")}},
                    },
                    **_error_responses({401: "`invalid_api_key`.", 403: "`tenant_suspended`."}),
                },
            }
        },
        "/health/live": {
            "get": {
                "operationId": "health_live",
                "summary": "The process is up",
                "tags": ["operations"],
                "security": [{}],
                "responses": {
                    "200": {"description": "Up.", "content": {"application/json": {"schema": _ref("Health")}}}
                },
            }
        },
        "/health/ready": {
            "get": {
                "operationId": "health_ready",
                "summary": "The database and Redis answer",
                "tags": ["operations"],
                "security": [{}],
                "responses": {
                    "200": {"description": "Ready.", "content": {"application/json": {"schema": _ref("Health")}}},
                    "503": {
                        "description": "Not ready: `failing` names what does not answer.",
                        "content": {"application/json": {"schema": _ref("Health")}},
                    },
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics of every web worker of this process",
                "tags": ["operations"],
                "security": [{}],
                "responses": {
                    "200": {
                        "description": "Prometheus text exposition format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }


def embedding_paths(components: dict[str, Any]) -> dict[str, Any]:
    request = _component(EmbeddingRequest, "Embeddings", components)
    answer = _component(CreateEmbeddingResponse, "OpenAIEmbeddings", components)
    # The SDK's model has the float form only; with `encoding_format: "base64"` (the SDK's default
    # on the wire) each vector is a base64 string of little-endian float32s.
    # A token array's bound (8,192) is said in words: a fuzzer breaking the outer bound (2,048 items)
    # with arrays at the inner one sends a body over the size limit, which is a 413, not a 400.
    for member in components["EmbeddingsEmbeddingRequest"]["properties"]["input"]["anyOf"]:
        items = member.get("items", {})
        if member.get("type") == "array" and items.get("type") == "integer":
            member.pop("maxItems", None)
            member["description"] = "Token ids: at most 8,192 of them."
        elif items.get("type") == "array":
            items.pop("maxItems", None)
            items["description"] = "Token ids: at most 8,192 of them."
    vector = components["OpenAIEmbeddingsEmbedding"]["properties"]["embedding"]
    components["OpenAIEmbeddingsEmbedding"]["properties"]["embedding"] = {
        "anyOf": [vector, {"type": "string", "contentEncoding": "base64"}],
        "description": "Floats, or with `encoding_format: base64` their little-endian float32 bytes in base64.",
    }
    return {
        "/v1/embeddings": {
            "post": _operation(
                "embeddings_create",
                "Create embeddings (OpenAI-compatible)",
                _call_responses("One vector per input, in order.", answer),
                description=(
                    "OpenAI's embeddings API over any provider litellm embeds with: the fields of OpenAI's "
                    "request schema plus Sentinel's `cache` controls; any other field is refused (400 "
                    "`unknown_parameter`). `input` is a string, an array of strings, an array of token ids, "
                    "or an array of token id arrays (at most 2,048 items, none empty). The answer is "
                    "OpenAI's, in floats or base64 as asked, whichever provider served it. Budgets and "
                    "tokens-per-minute limits count the input's tokens; only the exact cache applies."
                ),
                parameters=[_SESSION_PARAMETER],
                requestBody={"required": True, "content": {"application/json": {"schema": request}}},
            )
        }
    }


def image_paths(components: dict[str, Any]) -> dict[str, Any]:
    request = _component(ImageRequest, "Images", components)
    answer = _component(ImagesResponse, "OpenAIImages", components)
    return {
        "/v1/images/generations": {
            "post": _operation(
                "images_generate",
                "Generate images (OpenAI-compatible)",
                _call_responses("The images, as URLs or base64 (`b64_json`), as the provider gave them.", answer),
                description=(
                    "OpenAI's image generation over the model's chain of image deployments, failing over as "
                    "chat does: the fields of OpenAI's request schema; its streaming and video fields are "
                    "refused (400 `unsupported_parameter`), any other field too (400 `unknown_parameter`). "
                    "`size` is `auto` or `<width>x<height>` (64 to 4,096 pixels a side). Billed per image by "
                    "size and quality (docs/billing.md); budgets reserve `n` images at the dearest price the "
                    "chain can charge. The tenant's input screening sees the prompt. Nothing is cached."
                ),
                parameters=[_SESSION_PARAMETER],
                requestBody={"required": True, "content": {"application/json": {"schema": request}}},
            )
        }
    }


_BINARY: dict[str, Any] = {"type": "string", "format": "binary"}


def _with_files(schema: dict[str, Any], *, images: int, mask: bool) -> None:
    """A form's schema: its text fields' and its files' (`image`, `mask`), as multipart sends them. A
    form has no null: a field left to its default is left out."""
    for name, node in schema["properties"].items():
        members = [member for member in node.get("anyOf", []) if member.get("type") != "null"]
        if len(members) == 1:
            extra = {key: value for key, value in node.items() if key not in ("anyOf", "default")}
            schema["properties"][name] = {**members[0], **extra}
    image: dict[str, Any] = (
        _BINARY if images == 1 else {"type": "array", "items": _BINARY, "minItems": 1, "maxItems": images}
    )
    schema["properties"]["image"] = {**image, "description": "PNG, JPEG or WebP (a variation's: PNG)."}
    if mask:
        schema["properties"]["mask"] = {**_BINARY, "description": "A PNG whose transparent areas are edited."}
    schema["required"] = ["image", *schema.get("required", [])]


def image_form_paths(components: dict[str, Any]) -> dict[str, Any]:
    edit = _component(ImageEditRequest, "ImageEdits", components)
    _with_files(components["ImageEditsImageEditRequest"], images=MAX_INPUT_IMAGES, mask=True)
    variation = _component(ImageVariationRequest, "ImageVariations", components)
    _with_files(components["ImageVariationsImageVariationRequest"], images=1, mask=False)
    answer = _ref("OpenAIImagesImagesResponse")
    common = (
        " Sent to an OpenAI-format deployment as OpenAI's form (the files named by the format their bytes "
        "show, never by the client); billed per image by size and quality like generated images "
        "(docs/billing.md); budgets reserve `n` images at the dearest price the chain can charge. "
        "Nothing is cached."
    )
    return {
        "/v1/images/edits": {
            "post": _operation(
                "images_edit",
                "Edit images (OpenAI-compatible)",
                _call_responses("The images, as URLs or base64 (`b64_json`), as the provider gave them.", answer),
                description=(
                    "OpenAI's image edits, as a multipart form: one to 16 images (`image`, or `image[]` for "
                    "several), an optional PNG `mask`, the `prompt` and OpenAI's other fields; its streaming, "
                    "video and vector fields are refused (400 `unsupported_parameter`), any other field too "
                    "(400 `unknown_parameter`); a file that is not a PNG, JPEG or WebP image is a 400 "
                    "`invalid_image_format`. The tenant's input screening sees the prompt." + common
                ),
                parameters=[_SESSION_PARAMETER],
                requestBody={
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": edit,
                            "encoding": {
                                "image": {"contentType": "image/png, image/jpeg, image/webp"},
                                "mask": {"contentType": "image/png"},
                            },
                        }
                    },
                },
            )
        },
        "/v1/images/variations": {
            "post": _operation(
                "images_create_variation",
                "Make variations of an image (OpenAI-compatible)",
                _call_responses("The images, as URLs or base64 (`b64_json`), as the provider gave them.", answer),
                description=(
                    "OpenAI's image variations, as a multipart form: one PNG `image` and OpenAI's fields; "
                    "made by the chain's OpenAI-format deployments only (litellm's variations drop `n` and "
                    "`size`): a model with none is a 400 `model_not_supported`." + common
                ),
                parameters=[_SESSION_PARAMETER],
                requestBody={
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": variation,
                            "encoding": {"image": {"contentType": "image/png"}},
                        }
                    },
                },
            )
        },
    }


def _call_responses(description: str, answer: dict) -> dict[str, Any]:
    """A non-chat call's answer (JSON, with the completion headers but the chat-only ones) and its errors."""
    return {
        "200": {
            "description": description,
            "headers": _CALL_HEADERS,
            "content": {"application/json": {"schema": answer}},
        },
        **_error_responses(_CALL_ERRORS),
    }


def responses_paths(components: dict[str, Any]) -> dict[str, Any]:
    """/v1/responses: OpenAI's Responses API (the SDK's own models of its objects and events)."""
    request = _component(ResponsesRequest, "Responses", components)
    components["ResponsesResponse"] = RESPONSE
    response = _ref("ResponsesResponse")
    items = _page(_ref("ResponsesItem"))
    components["ResponsesItem"] = {
        "type": "object",
        "description": "An input item as sent, typed and with its id (message, function_call, function_call_output).",
        "properties": {"id": {"type": "string"}, "type": {"type": "string"}},
        "required": ["id", "type"],
    }
    deleted = {
        "type": "object",
        "properties": {"id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}},
        "required": ["id", "object", "deleted"],
    }
    response_id = _path_id("response_id", "A response's id (resp_...).")
    not_found = {**_KEY_ERRORS, 404: "`response_not_found`: no such response in your tenant."}
    return {
        "/v1/responses": {
            "post": _operation(
                "responses_create",
                "Create a model response (OpenAI's Responses API)",
                {
                    "200": {
                        "description": "The Response, or its stream of typed events.",
                        "headers": {k: v for k, v in _COMPLETION_HEADERS.items() if k != "x-sentinel-route"},
                        "content": {
                            "application/json": {"schema": response},
                            "text/event-stream": {"schema": RESPONSES_EVENT},
                        },
                    },
                    **_error_responses(
                        {
                            **_CALL_ERRORS,
                            400: "Malformed body: `invalid_json`, `missing_required_parameter`, `unknown_parameter`, "
                            "`unsupported_parameter`, `invalid_type`, `invalid_value`; or a request the provider "
                            "refused as invalid.",
                            404: "`model_not_found`, or `response_not_found`: no such `previous_response_id` in "
                            "your tenant.",
                        }
                    ),
                },
                description=(
                    "OpenAI's Responses API over any deployment of the chain, whatever its format: the "
                    "request runs as a chat completion (same admission, limits, budgets, screening, cache, "
                    "failover and ledger) and is answered as a Response. Function tools only; "
                    "`previous_response_id` continues a stored response of your tenant; `store: false` "
                    "keeps nothing. OpenAI's `background`, `conversation`, `prompt` and "
                    "`context_management` are refused (400 `unsupported_parameter`), any other unknown "
                    "field too (400 `unknown_parameter`). With `stream: true`: server-sent events "
                    "`response.created` … `response.completed`, whose usage carries `cost_usd`."
                ),
                requestBody={"required": True, "content": {"application/json": {"schema": request}}},
            )
        },
        "/v1/responses/{response_id}": {
            "get": _operation(
                "responses_retrieve",
                "A stored response",
                {"200": _json(response, "The response."), **_error_responses(not_found)},
                parameters=[response_id],
            ),
            "delete": _operation(
                "responses_delete",
                "Delete a stored response (it can no longer be continued)",
                {"200": _json(deleted, "Deleted."), **_error_responses(not_found)},
                parameters=[response_id],
            ),
        },
        "/v1/responses/{response_id}/input_items": {
            "get": _operation(
                "responses_input_items",
                "The input items of a stored response",
                {
                    "200": _json(items, "A page of input items."),
                    **_error_responses({**not_found, 400: "A bad parameter."}),
                },
                parameters=[
                    response_id,
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}, "Page size (20)."),
                    _query("order", {"type": "string", "enum": ["asc", "desc"]}, "Input order (desc)."),
                    _query("after", {"type": "string"}, "The last id of the previous page."),
                ],
            ),
        },
    }


# The Response object as Sentinel answers it (the SDK's own model, openai.types.responses.Response,
# is a 150 KB schema of every hosted tool's items: too slow to serve and fuzz for fields never sent).
RESPONSE = {
    "type": "object",
    "description": "OpenAI's Response object (tests/gateway/test_responses.py parses it with the official SDK).",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "status": {"type": "string", "enum": ["completed", "incomplete", "in_progress", "failed"]},
        "model": {"type": "string"},
        "output": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "type": {"enum": ["message", "function_call"]}},
                "required": ["id", "type"],
            },
        },
        "usage": {
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": {
                        "input_tokens": {"type": "integer"},
                        "output_tokens": {"type": "integer"},
                        "total_tokens": {"type": "integer"},
                    },
                    "required": ["input_tokens", "output_tokens", "total_tokens"],
                },
            ]
        },
        "previous_response_id": {"type": ["string", "null"]},
        "store": {"type": "boolean"},
    },
    "required": ["id", "object", "created_at", "status", "model", "output"],
}

# One server-sent event of a streamed Response: `event:` names its type, `data:` is the event as
# JSON (the SDK's ResponseStreamEvent, a union of some fifty types, is not repeated here).
RESPONSES_EVENT = {
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string", "contentMediaType": "application/json"}},
    "required": ["data"],
}


_CHAT_ONLY_HEADERS = frozenset({"x-sentinel-route"})
_CALL_HEADERS = {k: v for k, v in _COMPLETION_HEADERS.items() if k not in _CHAT_ONLY_HEADERS}

ANTHROPIC_ERROR = {
    "type": "object",
    "description": "Anthropic's error shape: `error.type` is Anthropic's name for the status.",
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            "required": ["type", "message"],
        },
    },
    "required": ["type", "error"],
}
_ANTHROPIC_HEADERS = [
    {
        "name": "anthropic-version",
        "in": "header",
        "required": False,
        "description": "Anthropic's API version, as the SDKs send it (2023-06-01 or later); optional, not checked.",
        "schema": {"type": "string"},
    }
]


def messages_paths(components: dict[str, Any]) -> dict[str, Any]:
    """/v1/messages and its count_tokens: Anthropic's Messages API (gateway.messages)."""
    request = _component(MessagesRequest, "Messages", components)
    count_request = _component(CountTokensRequest, "Messages", components)
    answer = _typed_component(AnthropicMessagesResponse, "Message", "Anthropic", components)
    components["AnthropicError"] = ANTHROPIC_ERROR
    errors = {
        400: "`invalid_request_error`: a malformed body, an unknown field, a server tool; "
        "or a request the provider refused as invalid or the tenant's screening blocked.",
        401: "`authentication_error`: missing, unknown, revoked or expired key.",
        402: "`billing_error`: a budget that applies is spent.",
        403: "`permission_error`: the key may not use the model, or its tenant is suspended.",
        404: "`not_found_error`: no such model.",
        405: "`invalid_request_error`: use POST.",
        413: "`request_too_large`: the body is over the configured limit.",
        429: "`rate_limit_error`: a limit of the key, tenant or model, or the provider's.",
        502: "`api_error`: the provider failed in a way no fallback could fix.",
        503: "`overloaded_error`: every deployment failed or is at its concurrency limit (with Retry-After).",
        504: "`timeout_error`: the provider did not answer in time.",
    }
    event = {
        "type": "object",
        "properties": {
            "event": {
                "enum": [
                    "message_start",
                    "content_block_start",
                    "content_block_delta",
                    "content_block_stop",
                    "message_delta",
                    "message_stop",
                    "ping",
                    "error",
                ]
            },
            "data": {"type": "string", "contentMediaType": "application/json"},
        },
        "required": ["event", "data"],
    }
    return {
        "/v1/messages": {
            "post": {
                "operationId": "messages_create",
                "summary": "Create a message (Anthropic-compatible)",
                "description": (
                    "Anthropic's Messages API over any deployment of the model's chain (OpenAI-, Anthropic- or "
                    "Gemini-format), through the chat path's admission, budgets, screening, cache, failover and "
                    "ledger. The key goes in `x-api-key` or `Authorization: Bearer`. Client tools only (server "
                    "tools are refused); `cache_control` reaches Anthropic-format deployments as sent; `top_k` "
                    "and `service_tier` are accepted and not sent on. With `stream: true` the answer is "
                    "Anthropic's event sequence (message_start … message_stop), ending with an `error` event "
                    "if the provider's stream broke off after it started."
                ),
                "tags": ["gateway"],
                "security": _KEY_SECURITY,
                "parameters": [_REQUEST_ID_PARAMETER, *_ANTHROPIC_HEADERS],
                "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
                "responses": {
                    "200": {
                        "description": "The message, or its event stream.",
                        "headers": _CALL_HEADERS,
                        "content": {
                            "application/json": {"schema": answer},
                            "text/event-stream": {"schema": event},
                        },
                    },
                    **_error_responses(errors, "AnthropicError"),
                },
            }
        },
        "/v1/messages/count_tokens": {
            "post": {
                "operationId": "messages_count_tokens",
                "summary": "Count a message request's input tokens (Anthropic-compatible)",
                "description": (
                    "The input's tokens as litellm's token counter counts them for the model's first deployment. "
                    "No provider is called: not admitted, not billed."
                ),
                "tags": ["gateway"],
                "security": _KEY_SECURITY,
                "parameters": [_REQUEST_ID_PARAMETER, *_ANTHROPIC_HEADERS],
                "requestBody": {"required": True, "content": {"application/json": {"schema": count_request}}},
                "responses": {
                    "200": {
                        "description": "The count.",
                        "headers": _ID_HEADER,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"input_tokens": {"type": "integer", "minimum": 0}},
                                    "required": ["input_tokens"],
                                }
                            }
                        },
                    },
                    **_error_responses(
                        {k: v for k, v in errors.items() if k not in (402, 429, 502, 503, 504)}, "AnthropicError"
                    ),
                },
            }
        },
    }


def _page(item: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": item},
            "first_id": {"type": ["string", "null"]},
            "last_id": {"type": ["string", "null"]},
            "has_more": {"type": "boolean"},
        },
        "required": ["object", "data", "has_more"],
    }


FILE_SEARCH = {
    "anyOf": [
        {
            "type": "object",
            "description": "Sentinel's: ground the answer in these vector stores of the tenant (docs/knowledge.md): "
            "the last user message is searched for and the best passages are put before the conversation; "
            "`x-sentinel-file-search` names them. Such a request neither reads nor fills the cache.",
            "properties": {
                "vector_store_ids": {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1, "maxLength": 64},
                    "minItems": 1,
                    "maxItems": 5,
                },
                "max_num_results": {"type": "integer", "minimum": 1, "maximum": 20},
            },
            "required": ["vector_store_ids"],
            "additionalProperties": False,
        },
        {"type": "null"},
    ]
}


# An id in a path and a string in a query hold no control character (sentinel.asgi refuses the URL).


def _path_id(name: str, what: str) -> dict[str, Any]:
    schema = {"type": "string", "pattern": NO_CONTROL}
    return {"name": name, "in": "path", "required": True, "description": what, "schema": schema}


def _query(name: str, schema: dict, description: str) -> dict[str, Any]:
    if schema.get("type") == "string" and "enum" not in schema:
        schema = {**schema, "pattern": NO_CONTROL}
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def _json(schema: dict, description: str) -> dict[str, Any]:
    return {"description": description, "headers": _ID_HEADER, "content": {"application/json": {"schema": schema}}}


def _operation(operation_id: str, summary: str, responses: dict, **more) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "summary": summary,
        "tags": ["gateway"],
        "security": _KEY_SECURITY,
        "parameters": [_REQUEST_ID_PARAMETER, *more.pop("parameters", [])],
        "responses": responses,
        **more,
    }


_KEY_ERRORS = {401: "`invalid_api_key`.", 403: "`tenant_suspended`."}


def batch_paths(components: dict[str, Any]) -> dict[str, Any]:
    """/v1/files and /v1/batches: OpenAI's Batch API (the SDK's own models of its objects)."""
    file = _component(FileObject, "OpenAI", components)
    deleted = _component(FileDeleted, "OpenAI", components)
    batch = _component(Batch, "OpenAI", components)
    create = _component(BatchCreate, "Sentinel", components)
    file_id = _path_id("file_id", "A file's id (file-...).")
    batch_id = _path_id("batch_id", "A batch's id (batch_...).")
    after = _query("after", {"type": "string"}, "The last id of the previous page.")
    return {
        "/v1/files": {
            "post": _operation(
                "files_create",
                "Upload a batch input file (JSONL, purpose `batch`) or a document for vector stores (`assistants`)",
                {
                    "200": _json(file, "The stored file."),
                    **_error_responses(
                        {
                            400: "`missing_required_parameter`, `invalid_value` (purpose other than batch or "
                            "assistants, not multipart). The content is checked when a batch or a vector store uses "
                            "the file (the batch's `errors`, the vector store file's `last_error`).",
                            **_KEY_ERRORS,
                            413: "`file_too_large` or `request_too_large`: over SENTINEL_BATCH_MAX_FILE_BYTES.",
                        }
                    ),
                },
                requestBody={
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "file": {"type": "string", "format": "binary"},
                                    "purpose": {"type": "string", "enum": ["batch", "assistants"]},
                                },
                                "required": ["file", "purpose"],
                            }
                        }
                    },
                },
            ),
            "get": _operation(
                "files_list",
                "List your tenant's files",
                {
                    "200": _json(_page(file), "A page of files."),
                    **_error_responses(
                        {400: "A bad parameter.", **_KEY_ERRORS, 404: "`file_not_found`: no such file as `after`."}
                    ),
                },
                parameters=[
                    _query("purpose", {"type": "string"}, "Only files of this purpose."),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 10000}, "Page size (100)."),
                    _query("order", {"type": "string", "enum": ["asc", "desc"]}, "By creation time (desc)."),
                    after,
                ],
            ),
        },
        "/v1/files/{file_id}": {
            "get": _operation(
                "files_retrieve",
                "A file",
                {"200": _json(file, "The file."), **_error_responses({**_KEY_ERRORS, 404: "`file_not_found`."})},
                parameters=[file_id],
            ),
            "delete": _operation(
                "files_delete",
                "Delete a file (batches that used it keep its id)",
                {"200": _json(deleted, "Deleted."), **_error_responses({**_KEY_ERRORS, 404: "`file_not_found`."})},
                parameters=[file_id],
            ),
        },
        "/v1/files/{file_id}/content": {
            "get": _operation(
                "files_content",
                "A file's content (a batch's output or error file: JSONL, one line per request)",
                {
                    "200": {
                        "description": "The content.",
                        "headers": _ID_HEADER,
                        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                    },
                    **_error_responses({**_KEY_ERRORS, 404: "`file_not_found`."}),
                },
                parameters=[file_id],
            )
        },
        "/v1/batches": {
            "post": _operation(
                "batches_create",
                "Create a batch of chat completions (OpenAI-compatible)",
                {
                    "200": _json(batch, "The batch, validating."),
                    **_error_responses(
                        {
                            400: "Malformed body, an endpoint other than /v1/chat/completions, a window other than "
                            "24h, or an input file not uploaded for batches.",
                            **_KEY_ERRORS,
                            404: "`file_not_found`: no such input file.",
                        }
                    ),
                },
                description=(
                    "Each line of the input file is run through the same path as /v1/chat/completions (cache, "
                    "admission, budgets, routing, ledger) with the key that created the batch, at the tenant's "
                    "batch pace. Statuses: validating → in_progress → finalizing → completed, or failed "
                    "(`errors` names each bad line), cancelling → cancelled, expired."
                ),
                requestBody={"required": True, "content": {"application/json": {"schema": create}}},
            ),
            "get": _operation(
                "batches_list",
                "List your tenant's batches, newest first",
                {
                    "200": _json(_page(batch), "A page of batches."),
                    **_error_responses(
                        {400: "A bad parameter.", **_KEY_ERRORS, 404: "`batch_not_found`: no such batch as `after`."}
                    ),
                },
                parameters=[
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}, "Page size (20)."),
                    after,
                ],
            ),
        },
        "/v1/batches/{batch_id}": {
            "get": _operation(
                "batches_retrieve",
                "A batch",
                {"200": _json(batch, "The batch."), **_error_responses({**_KEY_ERRORS, 404: "`batch_not_found`."})},
                parameters=[batch_id],
            )
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": _operation(
                "batches_cancel",
                "Cancel a batch: nothing new starts; requests in flight finish",
                {
                    "200": _json(batch, "The batch, cancelling (or already cancelled)."),
                    **_error_responses(
                        {
                            **_KEY_ERRORS,
                            404: "`batch_not_found`.",
                            409: "`batch_not_cancellable`: completed, failed or expired.",
                        }
                    ),
                },
                parameters=[batch_id],
            )
        },
    }


def knowledge_paths(components: dict[str, Any]) -> dict[str, Any]:
    """/v1/vector_stores: OpenAI's Vector Stores API (gateway/knowledge; docs/knowledge.md)."""
    store = _component(VectorStore, "OpenAI", components)
    entry = _component(VectorStoreFile, "OpenAI", components)
    store_deleted = _component(VectorStoreDeleted, "OpenAI", components)
    entry_deleted = _component(VectorStoreFileDeleted, "OpenAI", components)
    hit = _component(VectorStoreSearchResponse, "OpenAI", components)
    create = _component(knowledge.StoreCreate, "Knowledge", components)
    update = _component(knowledge.StoreUpdate, "Knowledge", components)
    add = _component(knowledge.FileAdd, "Knowledge", components)
    search = _component(knowledge.Search, "Knowledge", components)
    results = {
        "type": "object",
        "properties": {
            "object": {"const": "vector_store.search_results.page"},
            "search_query": {"type": "array", "items": {"type": "string"}},
            "data": {"type": "array", "items": hit},
            "has_more": {"type": "boolean"},
            "next_page": {"type": ["string", "null"]},
        },
        "required": ["object", "data", "has_more"],
    }
    store_id = _path_id("vector_store_id", "A vector store's id (vs_...).")
    file_id = _path_id("file_id", "A file's id (file-...).")
    after = _query("after", {"type": "string"}, "The last id of the previous page.")
    limit = _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}, "Page size (20).")
    bad = {400: "A bad body or parameter, named (`unsupported_parameter` for what is not served yet).", **_KEY_ERRORS}
    missing = {**_KEY_ERRORS, 404: "`vector_store_not_found` (another tenant's too) or `file_not_found`."}

    def body(schema: dict) -> dict:
        return {"required": True, "content": {"application/json": {"schema": schema}}}

    return {
        "/v1/vector_stores": {
            "post": _operation(
                "vector_stores_create",
                "Create a vector store (OpenAI-compatible), with files to ingest",
                {"200": _json(store, "The store."), **_error_responses({**bad, 404: "`file_not_found`."})},
                requestBody=body(create),
            ),
            "get": _operation(
                "vector_stores_list",
                "Your tenant's vector stores, newest first",
                {"200": _json(_page(store), "A page of stores."), **_error_responses({**bad, **missing})},
                parameters=[limit, after],
            ),
        },
        "/v1/vector_stores/{vector_store_id}": {
            "get": _operation(
                "vector_stores_retrieve",
                "A vector store",
                {"200": _json(store, "The store."), **_error_responses(missing)},
                parameters=[store_id],
            ),
            "post": _operation(
                "vector_stores_update",
                "Rename a vector store or set its metadata",
                {"200": _json(store, "The store."), **_error_responses({**bad, **missing})},
                parameters=[store_id],
                requestBody=body(update),
            ),
            "delete": _operation(
                "vector_stores_delete",
                "Delete a vector store with its chunks (the uploaded files stay)",
                {"200": _json(store_deleted, "Deleted."), **_error_responses(missing)},
                parameters=[store_id],
            ),
        },
        "/v1/vector_stores/{vector_store_id}/files": {
            "post": _operation(
                "vector_stores_files_create",
                "Add a file (purpose `assistants`) to a store: a worker reads, chunks and embeds it",
                {"200": _json(entry, "The store's file, in progress."), **_error_responses({**bad, **missing})},
                parameters=[store_id],
                requestBody=body(add),
            ),
            "get": _operation(
                "vector_stores_files_list",
                "A store's files",
                {"200": _json(_page(entry), "A page of files."), **_error_responses({**bad, **missing})},
                parameters=[
                    store_id,
                    limit,
                    _query("filter", {"type": "string", "enum": ["in_progress", "completed", "failed"]}, "By status."),
                ],
            ),
        },
        "/v1/vector_stores/{vector_store_id}/files/{file_id}": {
            "get": _operation(
                "vector_stores_files_retrieve",
                "A store's file: its status and last error",
                {"200": _json(entry, "The store's file."), **_error_responses(missing)},
                parameters=[store_id, file_id],
            ),
            "delete": _operation(
                "vector_stores_files_delete",
                "Take a file out of a store, every chunk of it (the upload stays)",
                {"200": _json(entry_deleted, "Removed."), **_error_responses(missing)},
                parameters=[store_id, file_id],
            ),
        },
        "/v1/vector_stores/{vector_store_id}/search": {
            "post": _operation(
                "vector_stores_search",
                "Search a store: nearest embeddings and full-text matches, fused by reciprocal rank",
                {"200": _json(results, "The best chunks, best first."), **_error_responses({**bad, **missing})},
                parameters=[store_id],
                requestBody=body(search),
            )
        },
    }


def _document_url_refusal(paths: dict[str, Any]) -> None:
    """Every /v1 operation taking an id in its path or a parameter in its query may answer 400
    `invalid_url`: a control character in the URL (sentinel.asgi), whatever else it may refuse."""
    for path, operations in paths.items():
        if not path.startswith("/v1/"):
            continue
        for operation in operations.values():
            parameters = operation.get("parameters", [])
            if any(p["in"] in ("path", "query") for p in parameters):
                operation["responses"].setdefault(
                    "400", _json(_ref("Error"), "`invalid_url`: a control character in the URL's path or query.")
                )


def add_gateway_endpoints(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"])."""
    components = result.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    result["paths"] = {
        **gateway_paths(schemas),
        **embedding_paths(schemas),
        **image_paths(schemas),
        **image_form_paths(schemas),
        **knowledge_paths(schemas),
        **responses_paths(schemas),
        **messages_paths(schemas),
        **batch_paths(schemas),
        **result.get("paths", {}),
    }
    _document_url_refusal(result["paths"])
    document_limits(schemas, prefix="Chat", component="ChatChatRequest", identifiers=CHAT_IDENTIFIERS)
    schemas["ChatChatRequest"]["properties"]["cache"] = CACHE_CONTROLS
    schemas["ChatChatRequest"]["properties"]["file_search"] = FILE_SEARCH
    document_limits(
        schemas, prefix="Embeddings", component="EmbeddingsEmbeddingRequest", identifiers=EMBEDDING_IDENTIFIERS
    )
    schemas["EmbeddingsEmbeddingRequest"]["properties"]["cache"] = CACHE_CONTROLS
    document_limits(schemas, prefix="Images", component="ImagesImageRequest", identifiers=IMAGE_IDENTIFIERS)
    for name, identifiers in (
        ("KnowledgeStoreCreate", knowledge.STORE_IDENTIFIERS),
        ("KnowledgeStoreUpdate", knowledge.STORE_IDENTIFIERS),
        ("KnowledgeFileAdd", knowledge.FILE_IDENTIFIERS),
        ("KnowledgeSearch", ()),
    ):
        document_limits(schemas, prefix="Knowledge", component=name, identifiers=identifiers)
    for prefix, name in (("ImageEdits", "ImageEditRequest"), ("ImageVariations", "ImageVariationRequest")):
        document_limits(schemas, prefix=prefix, component=prefix + name, identifiers=IMAGE_IDENTIFIERS)
    # One call covers both requests' nested models (the count's shares them).
    document_limits(schemas, prefix="Messages", component="MessagesMessagesRequest", identifiers=MESSAGES_IDENTIFIERS)
    schemas["MessagesMessagesRequest"]["properties"]["cache"] = CACHE_CONTROLS
    # metadata.user_id is an identifier too (MESSAGES_IDENTIFIERS), in a nested model document_limits does not follow.
    for member in schemas["MessagesMetadata"]["properties"]["user_id"]["anyOf"]:
        if member.get("type") == "string":
            member["pattern"] = NO_CONTROL
    document_limits(
        schemas, prefix="Responses", component="ResponsesResponsesRequest", identifiers=RESPONSES_IDENTIFIERS
    )
    schemas["ResponsesResponsesRequest"]["properties"]["cache"] = CACHE_CONTROLS
    document_limits(
        schemas, prefix="SentinelBatchCreate", component="SentinelBatchCreate", identifiers=BATCH_CREATE_IDENTIFIERS
    )
    components.setdefault("securitySchemes", {}).update(
        {
            "VirtualKey": {"type": "http", "scheme": "bearer", "description": "A Sentinel virtual key."},
            "VirtualKeyHeader": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        }
    )
    result.setdefault("tags", [])
    result["tags"] = [
        {"name": "gateway", "description": "The OpenAI-compatible API, authenticated with a virtual key."},
        {"name": "operations", "description": "Health probes and metrics."},
        *result["tags"],
    ]
    return result
