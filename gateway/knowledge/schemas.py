"""What the vector store endpoints accept, validated with pydantic as every endpoint is: OpenAI's
fields, their bounds, and 400 `unsupported_parameter` for the ones Sentinel does not serve yet."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationError

from gateway.batches.schemas import MAX_METADATA_PAIRS, NO_CONTROL
from gateway.bodies import check_body
from gateway.errors import invalid_request
from gateway.knowledge.filters import Comparison, Compound
from gateway.schemas import _Strict, integer, json_object, validation_error

MAX_FILES_AT_CREATE = 500
MAX_QUERY_CHARS = 4_096
MAX_RESULTS = 50

Metadata = Annotated[
    dict[
        Annotated[str, Field(max_length=64, pattern=NO_CONTROL)],
        Annotated[str, Field(max_length=512, pattern=NO_CONTROL)],
    ],
    Field(max_length=MAX_METADATA_PAIRS),
]
Attributes = Annotated[
    dict[
        Annotated[str, Field(max_length=64, pattern=NO_CONTROL)],
        Annotated[str, Field(max_length=512, pattern=NO_CONTROL)] | bool | int | float,
    ],
    Field(max_length=MAX_METADATA_PAIRS),
]
FileId = Annotated[str, Field(min_length=1, max_length=64)]
# Strings that must hold no control character (gateway.bodies.check_body and the schema say so).
STORE_IDENTIFIERS = (("name",), ("description",), ("metadata", "*key"), ("metadata", "*"))
FILE_IDENTIFIERS = (("file_id",), ("attributes", "*key"), ("attributes", "*"))


class AutoChunking(_Strict):
    type: Literal["auto"]


class StoreCreate(_Strict):
    name: Annotated[str, Field(max_length=256, pattern=NO_CONTROL)] | None = None
    description: Annotated[str, Field(max_length=512, pattern=NO_CONTROL)] | None = None
    metadata: Metadata | None = None
    file_ids: Annotated[list[FileId], Field(max_length=MAX_FILES_AT_CREATE)] | None = None
    chunking_strategy: AutoChunking | None = None  # Sentinel chunks by structure (docs/knowledge.md)
    expires_after: None = None  # stores are kept until deleted


class StoreUpdate(_Strict):
    name: Annotated[str, Field(max_length=256, pattern=NO_CONTROL)] | None = None
    metadata: Metadata | None = None
    expires_after: None = None


class FileAdd(_Strict):
    file_id: FileId
    attributes: Attributes | None = None
    chunking_strategy: AutoChunking | None = None


class RankingOptions(_Strict):
    ranker: Literal["auto", "default-2024-11-15", "none"] | None = None
    score_threshold: Annotated[float, Field(ge=0, le=1)] | int | None = None


class Search(_Strict):
    query: (
        Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS)]
        | Annotated[
            list[Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS)]], Field(min_length=1, max_length=10)
        ]
    )
    max_num_results: integer(ge=1, le=MAX_RESULTS) | None = None
    ranking_options: RankingOptions | None = None
    rewrite_query: Literal[False] | None = None  # no model rewrites queries here
    filters: Comparison | Compound | None = None  # on the files' attributes (gateway.knowledge.filters)
    # Sentinel's own: one side of the hybrid search alone (as the quality table compares them).
    search_mode: Literal["hybrid", "semantic", "keyword"] | None = None


UNSUPPORTED = {
    "expires_after": "Vector stores are kept until deleted: 'expires_after' is not supported.",
    "rewrite_query": "Query rewriting is not supported by this gateway.",
}


def parse(model: type[_Strict], raw: bytes, identifiers: tuple[tuple, ...] = ()):
    body = json_object(raw)
    check_body(body, identifiers=identifiers, raw=raw)
    for name, message in UNSUPPORTED.items():
        if body.get(name) not in (None, False):
            raise invalid_request(message, param=name, code="unsupported_parameter")
    chunking = body.get("chunking_strategy")
    if isinstance(chunking, dict) and chunking.get("type") not in (None, "auto"):
        raise invalid_request(
            "Chunking is by the document's structure (docs/knowledge.md): only {'type': 'auto'} is accepted.",
            param="chunking_strategy",
            code="unsupported_parameter",
        )
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
