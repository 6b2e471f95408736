"""Who a request is for inside the app that holds the key: the end user (OpenAI's `user` field) and
the session (the `x-sentinel-session` header, else `metadata.session_id`). The key's end-user limits
(tenants.EndUserLimit) hold each of them to a budget and a token cap (gateway.limits.admission); the
ledger records both. Both are the client's strings: bounded and free of control characters, refused
with a 400 naming the field otherwise; Redis keys carry a digest of them, never the text
(sentinel.redis_keys.audience_period)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.errors import invalid_request
from sentinel.text import control_character

MAX_LENGTH = 256  # the ledger's columns; OpenAI publishes no bound for `user`
SESSION_HEADER = "x-sentinel-session"


@dataclass(frozen=True)
class Audience:
    end_user: str = ""  # "": the request names none
    session: str = ""


def audience_of(body: dict, headers: Mapping[str, str] | None) -> Audience:
    """The end user and session a request names (empty where it names none); GatewayError(400) for
    one that is not a short printable string."""
    session = (headers or {}).get(SESSION_HEADER)
    if session is not None:
        return Audience(_checked(body.get("user"), "user"), _checked(session, SESSION_HEADER))
    metadata = body.get("metadata")
    session = metadata.get("session_id") if isinstance(metadata, dict) else None
    return Audience(_checked(body.get("user"), "user"), _checked(session, "metadata.session_id"))


def _checked(value: object, param: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid_request(f"Invalid type for '{param}': expected a string.", param=param, code="invalid_type")
    if len(value) > MAX_LENGTH:
        raise invalid_request(
            f"Invalid '{param}': string too long. Expected a string with maximum length {MAX_LENGTH}, "
            f"but got a string with length {len(value)} instead.",
            param=param,
            code="string_above_max_length",
        )
    char = control_character(value)
    if char is not None:
        raise invalid_request(
            f"Invalid value for '{param}': control characters are not allowed in it ({char} found).",
            param=param,
            code="invalid_value",
        )
    return value
