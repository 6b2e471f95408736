"""What the batch endpoints accept, validated with pydantic (as the chat endpoint is), so the
OpenAPI schema documents exactly what is checked."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.bodies import BATCH_CREATE_IDENTIFIERS, check_body
from gateway.schemas import integer, json_object, validation_error

ENDPOINT = "/v1/chat/completions"
MAX_METADATA_PAIRS = 16
NO_CONTROL = r"^[^\x00-\x1f\x7f-\x9f]*$"  # as gateway.bodies checks metadata (sentinel.text)


class OutputExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    anchor: Literal["created_at"]
    seconds: integer(ge=3600, le=2592000)


class BatchCreate(BaseModel):
    # OpenAI's fields, and no others (400 unknown_parameter, as for chat requests).
    model_config = ConfigDict(extra="forbid", strict=True)

    input_file_id: Annotated[str, Field(min_length=1, max_length=64)]
    endpoint: Literal["/v1/chat/completions"]  # Sentinel runs batches of chat completions only
    completion_window: Literal["24h"]
    metadata: (
        Annotated[
            dict[
                Annotated[str, Field(max_length=64, pattern=NO_CONTROL)],
                Annotated[str, Field(max_length=512, pattern=NO_CONTROL)],
            ],
            Field(max_length=MAX_METADATA_PAIRS),
        ]
        | None
    ) = None
    output_expires_after: OutputExpiresAfter | None = None  # accepted: Sentinel keeps files until deleted


def parse_batch_create(raw: bytes) -> BatchCreate:
    body = json_object(raw)
    check_body(body, identifiers=BATCH_CREATE_IDENTIFIERS, raw=raw)
    try:
        return BatchCreate.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
