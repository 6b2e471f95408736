"""The OpenAPI schema at /api/schema/ documents the gateway's own endpoints (from the code that
validates them), and the docs pages run on Sentinel's static files alone, with no CDN."""

from __future__ import annotations

import re

import httpx
import pytest

from gateway.schemas import ChatRequest


@pytest.fixture(scope="module")
def schema(gateway) -> dict:
    response = httpx.get(f"{gateway.url}/api/schema/", params={"format": "json"})
    assert response.status_code == 200
    return response.json()


def test_the_gateway_endpoints_are_documented(schema):
    assert schema["openapi"] == "3.1.0"
    paths = schema["paths"]
    assert set(paths["/v1/chat/completions"]) == {"post"}
    assert set(paths["/v1/models"]) == {"get"}
    assert set(paths["/v1/embeddings"]) == {"post"}
    assert {"/health/live", "/health/ready", "/metrics"} <= set(paths)
    # The management API (DRF views, described by drf-spectacular): finance's spend report and a
    # tenant's request log.
    assert set(paths["/api/v1/reports/spend"]) == {"get"}
    assert set(paths["/api/v1/tenants/{slug}/requests"]) == {"get"}
    report = paths["/api/v1/reports/spend"]["get"]
    assert {"start", "end"} <= {p["name"] for p in report.get("parameters", [])}
    chat = paths["/v1/chat/completions"]["post"]
    assert chat["security"] == [{"VirtualKey": []}, {"VirtualKeyHeader": []}]
    assert {"application/json", "text/event-stream"} == set(chat["responses"]["200"]["content"])
    for status in ("400", "401", "403", "404", "413", "429", "503"):
        assert chat["responses"][status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }
    assert schema["components"]["securitySchemes"]["VirtualKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A Sentinel virtual key.",
    }


def test_the_chat_request_schema_is_the_one_the_gateway_validates_with(schema):
    documented = schema["components"]["schemas"]["ChatChatRequest"]
    assert set(documented["properties"]) == set(ChatRequest.model_fields)
    assert documented["required"] == ["model", "messages"]
    assert documented["properties"]["max_tokens"]["anyOf"][0] == {
        "maximum": 2147483647,
        "minimum": 1,
        "type": "integer",
    }


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_the_docs_pages_load_everything_from_sentinel(gateway, page):
    response = httpx.get(gateway.url + page)
    assert response.status_code == 200
    assert "text/html" in response.headers["content-type"]
    assets = re.findall(r'(?:src|href)="([^"]+)"', response.text)
    assert any(a.endswith(".js") for a in assets), assets
    for asset in assets:
        assert asset.startswith("/"), f"{page} loads {asset} from elsewhere"
        assert httpx.get(gateway.url + asset).status_code == 200, asset
    assert "/api/schema/" in response.text


def test_the_embeddings_request_schema_is_the_one_the_gateway_validates_with(schema):
    from gateway.embeddings import EMBEDDING_PARAMETERS

    documented = schema["components"]["schemas"]["EmbeddingsEmbeddingRequest"]
    assert set(documented["properties"]) == EMBEDDING_PARAMETERS
    assert documented["required"] == ["model", "input"]
    assert documented["additionalProperties"] is False
    vector = schema["components"]["schemas"]["OpenAIEmbeddingsEmbedding"]["properties"]["embedding"]
    assert [member["type"] for member in vector["anyOf"]] == ["array", "string"]  # floats or base64


def test_the_images_request_schema_is_the_one_the_gateway_validates_with(schema):
    from gateway.images import IMAGE_PARAMETERS

    assert set(schema["paths"]["/v1/images/generations"]) == {"post"}
    documented = schema["components"]["schemas"]["ImagesImageRequest"]
    assert set(documented["properties"]) == IMAGE_PARAMETERS
    assert documented["required"] == ["model", "prompt"]
    assert documented["additionalProperties"] is False


def test_the_responses_endpoints_are_documented_from_the_request_model(schema):
    from gateway.responses.schemas import RESPONSES_PARAMETERS

    paths = schema["paths"]
    assert set(paths["/v1/responses"]) == {"post"}
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
    assert set(paths["/v1/responses/{response_id}/input_items"]) == {"get"}
    documented = schema["components"]["schemas"]["ResponsesResponsesRequest"]
    assert set(documented["properties"]) == RESPONSES_PARAMETERS
    assert documented["required"] == ["model", "input"]
    assert documented["additionalProperties"] is False
