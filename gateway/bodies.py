"""What every JSON body the API accepts must be, checked as soon as it is parsed and before anything
reads, keys on, stores or serialises it (sentinel.text has the rules): nested at most
MAX_JSON_DEPTH levels, no NUL anywhere (values and keys, message content included: PostgreSQL cannot
store it in the ledger, the cache or a batch, and prompt logging would carry it), and the fields the
gateway keys on or stores without control characters. Each refusal is a 400 naming the field.
Sizes are bounded before parsing, on the raw body (gateway.http, sentinel.asgi; batch lines in
gateway.batches.validation)."""

from __future__ import annotations

from gateway.errors import GatewayError, invalid_request
from sentinel.text import MAX_JSON_DEPTH, Problem, identifier_problem, json_problem

# Strings of a chat request that are keyed on, stored or passed on as ids (OpenAI's `user`,
# `safety_identifier` and `prompt_cache_key` identify end users and cache partitions upstream).
CHAT_IDENTIFIERS = (
    ("model",),
    ("user",),
    ("safety_identifier",),
    ("prompt_cache_key",),
    ("metadata", "*key"),
    ("metadata", "*"),
    ("cache", "namespace"),
)
BATCH_CREATE_IDENTIFIERS = (("input_file_id",), ("metadata", "*key"), ("metadata", "*"))


def _error(problem: Problem, prefix: str) -> GatewayError:
    param = ".".join(part for part in (prefix, problem.path) if part) or None
    message = f"Invalid value for '{param}': {problem.message}" if param else problem.message
    return invalid_request(message, param=param, code=problem.code)


def _may_be_too_deep(raw: bytes | str | None) -> bool:
    # Every level opens with a bracket, so a body with few of them cannot nest deep: most chat
    # requests skip the walk.
    if raw is None:
        return True
    opening = (b"{", b"[") if isinstance(raw, bytes) else ("{", "[")
    return raw.count(opening[0]) + raw.count(opening[1]) > MAX_JSON_DEPTH


def _may_hold_nul(raw: bytes | str | None) -> bool:
    # JSON can carry NUL only escaped (a raw one is invalid JSON).
    if raw is None:
        return True
    return (b"\\u0000" if isinstance(raw, bytes) else "\\u0000") in raw


def check_body(
    body: dict,
    *,
    identifiers: tuple[tuple, ...] = CHAT_IDENTIFIERS,
    raw: bytes | str | None = None,
    prefix: str = "",
) -> None:
    """Raise GatewayError(400) naming the first field at fault. `raw`, the body as received, lets a
    body that cannot nest deep or hold a NUL skip the walk; `prefix` names where the body sits (a
    batch line's `body`)."""
    deep, nul = _may_be_too_deep(raw), _may_hold_nul(raw)
    if deep or nul:
        problem = json_problem(body, max_depth=MAX_JSON_DEPTH if deep else 1 << 30, nul=nul)
        if problem is not None:
            raise _error(problem, prefix)
    problem = identifier_problem(body, identifiers)
    if problem is not None:
        raise _error(problem, prefix)
