"""Reading a batch's input file: one request a line, each checked as the chat endpoint would check
it, so that a batch fails at once, with every bad line named, rather than request by request. A line
is bounded as a chat request is (size, depth, NUL, control characters) before it is serialised, and
whatever else goes wrong reading one line is that line's error, never a crash of the whole file
(which would leave the batch validating, read again by every sweep)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import orjson
from django.conf import settings

from gateway.bodies import check_body
from gateway.errors import GatewayError
from gateway.schemas import parse_chat_request
from sentinel.text import control_character

log = logging.getLogger(__name__)

MAX_LISTED_ERRORS = 100
MAX_CUSTOM_ID = 512


@dataclass(frozen=True)
class Request:
    line: int
    custom_id: str
    body: dict


def line_error(code: str, message: str, *, line: int | None = None, param: str | None = None) -> dict:
    """One entry of a batch's `errors.data`, as OpenAI shapes it."""
    return {"code": code, "message": message, "param": param, "line": line}


def read_requests(content: bytes, *, endpoint: str, max_requests: int) -> tuple[list[Request], list[dict]]:
    """The requests of an input file, or the errors that make it unusable (at most
    MAX_LISTED_ERRORS are listed, the last one saying how many more there were)."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return [], [line_error("invalid_file", "The input file is not UTF-8 text.")]
    requests: list[Request] = []
    errors: list[dict] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            request, error = _read_line(raw, number, endpoint)
        except Exception:  # a bug must cost this line, not the file
            log.exception("batch input line %s could not be read", number)
            request, error = None, line_error("unreadable_line", "This line could not be read.", line=number)
        if error is None and request.custom_id in seen:
            error = line_error(
                "duplicate_custom_id",
                f"The custom_id '{request.custom_id}' is used by an earlier line; each request needs its own.",
                line=number,
                param="custom_id",
            )
        if error is not None:
            errors.append(error)
            continue
        seen.add(request.custom_id)
        requests.append(request)
    if not requests and not errors:
        errors.append(line_error("empty_file", "The input file holds no requests."))
    total = len(requests) + len(errors)
    if total > max_requests:
        errors.insert(
            0,
            line_error("too_many_requests", f"The input file holds {total} requests; a batch may hold {max_requests}."),
        )
    if len(errors) > MAX_LISTED_ERRORS:
        more = len(errors) - MAX_LISTED_ERRORS + 1
        errors = errors[: MAX_LISTED_ERRORS - 1] + [line_error("more_errors", f"... and {more} more errors.")]
    return requests, errors


def _read_line(raw: str, number: int, endpoint: str) -> tuple[Request | None, dict | None]:
    limit = settings.MAX_BODY_BYTES
    if len(raw) > limit or len(raw.encode()) > limit:  # as large as a chat request may be
        return None, line_error(
            "request_too_large", f"This line is larger than a request may be ({limit} bytes).", line=number
        )
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, line_error("invalid_json_line", f"This line is not valid JSON: {exc}.", line=number)
    if not isinstance(data, dict):
        return None, line_error("invalid_json_line", "Each line must be a JSON object.", line=number)
    custom_id = data.get("custom_id")
    if not (isinstance(custom_id, str) and 0 < len(custom_id) <= MAX_CUSTOM_ID) or control_character(custom_id):
        return None, line_error(
            "invalid_custom_id",
            f"custom_id must be a non-empty string of at most {MAX_CUSTOM_ID} characters, without control characters.",
            line=number,
            param="custom_id",
        )
    if data.get("method") != "POST":
        return None, line_error("invalid_method", "method must be POST.", line=number, param="method")
    if data.get("url") != endpoint:
        return None, line_error(
            "mismatched_endpoint", f"url must be the batch's endpoint, {endpoint}.", line=number, param="url"
        )
    body = data.get("body")
    if not isinstance(body, dict):
        return None, line_error("invalid_body", "body must be a JSON object.", line=number, param="body")
    try:
        check_body(body, raw=raw)  # before it is serialised below
        _, body = parse_chat_request(orjson.dumps(body))
    except GatewayError as error:
        param = f"body.{error.param}" if error.param else "body"
        return None, line_error(error.code, error.message, line=number, param=param)
    if body.get("stream"):
        return None, line_error("invalid_value", "Batch requests cannot be streamed.", line=number, param="body.stream")
    return Request(number, custom_id, body), None
