"""The gateway's endpoints in the OpenAPI schema that drf-spectacular builds for the management API.

The OpenAI-compatible API and the probes are plain async Django views (DRF would cost the hot path a
thread hop), so drf-spectacular cannot see them; this postprocessing hook adds them. Their schemas
are not written by hand: the request body is the JSON Schema of the pydantic model that validates it
(gateway.schemas.ChatRequest) and the answer is the official OpenAI SDK's own model of a completion,
so the documentation cannot drift from what the gateway accepts and returns.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel

from gateway.schemas import ChatRequest

REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:\-]{1,128}$"


def _component(model: type[BaseModel], prefix: str, components: dict[str, Any]) -> dict[str, str]:
    """Add the model's JSON Schema (and its nested models) under prefixed names; returns a $ref."""
    template = "#/components/schemas/" + prefix + "{model}"
    schema = model.model_json_schema(ref_template=template, mode="validation")
    for name, nested in schema.pop("$defs", {}).items():
        components[prefix + name] = nested
    components[prefix + model.__name__] = schema
    return {"$ref": template.format(model=model.__name__)}


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
        "status": {"type": "string", "enum": ["ok", "unavailable"]},
        "failing": {"type": "array", "items": {"type": "string", "enum": ["database", "redis"]}},
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
}
_REQUEST_ID_PARAMETER = {
    "name": "x-sentinel-request-id",
    "in": "header",
    "required": False,
    "description": "Your id for this request (letters, digits and `._:-`, at most 128); replaced when invalid.",
    "schema": {"type": "string"},
}
_KEY_SECURITY = [{"VirtualKey": []}, {"VirtualKeyHeader": []}]


def _error_responses(statuses: dict[int, str]) -> dict[str, Any]:
    return {
        str(status): {
            "description": description,
            "headers": _ID_HEADER,
            "content": {"application/json": {"schema": _ref("Error")}},
        }
        for status, description in statuses.items()
    }


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
                    "OpenAI's chat completions API. Fields this schema does not name are passed to the "
                    "provider as sent. With `stream: true` the answer is a `text/event-stream` of "
                    "`data:` lines, each a chat.completion.chunk, ending with `data: [DONE]` (or, if the "
                    "provider's stream broke off after it started, an error object)."
                ),
                "tags": ["gateway"],
                "security": _KEY_SECURITY,
                "parameters": [_REQUEST_ID_PARAMETER],
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
                            400: "Malformed body: `invalid_json`, `missing_required_parameter`, `invalid_type`, "
                            "`invalid_value`, or a request the provider refused as invalid; "
                            "`content_policy_violation`: the tenant's screening policy blocked it.",
                            401: "`invalid_api_key`: missing, unknown, revoked or expired key.",
                            402: "`budget_exceeded`: a budget that applies is spent.",
                            403: "`model_not_allowed` or `tenant_suspended`.",
                            404: "`model_not_found`: no such model.",
                            405: "`method_not_allowed`.",
                            413: "`request_too_large`: the body is over the configured limit.",
                            429: "`rate_limit_exceeded`, or the provider's rate limit.",
                            502: "The provider failed in a way no fallback could fix.",
                            503: "`all_providers_unavailable`: every deployment in the chain failed; "
                            "`screening_unavailable`: the tenant's moderation provider or guardrail could not "
                            "screen the request.",
                            504: "The provider did not answer in time.",
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


def add_gateway_endpoints(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"])."""
    components = result.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    result["paths"] = {**gateway_paths(schemas), **result.get("paths", {})}
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
