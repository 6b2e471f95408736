"""Errors the API returns, in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import orjson

from sentinel.localstate import DatabaseUnavailable

# OpenAI's error `type` for each HTTP status a client can receive from us.
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class GatewayError(Exception):
    """A request the gateway answers with an error instead of a completion."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        kind: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.kind = kind or _TYPE_BY_STATUS.get(status, "api_error")
        self.param = param
        self.headers = dict(headers or {})

    def payload(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self) -> bytes:
        return orjson.dumps(self.payload())

    def __repr__(self) -> str:
        return f"GatewayError({self.status}, {self.code!r}, {self.message!r})"


def invalid_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> GatewayError:
    return GatewayError(400, code, message, param=param)


# What only PostgreSQL knows is needed and it is away (a key no process has seen, a price never
# read): a clear 503 the client may retry. Everything the processes have read stays served.
DATABASE_UNAVAILABLE = GatewayError(
    503,
    "database_unavailable",
    "Sentinel's database is unreachable and this request needs it; retry shortly.",
    headers={"retry-after": "5"},
)


@contextmanager
def database_required() -> Iterator[None]:
    """DatabaseUnavailable inside becomes the API's 503."""
    try:
        yield
    except DatabaseUnavailable:
        raise DATABASE_UNAVAILABLE from None
