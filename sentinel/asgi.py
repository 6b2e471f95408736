"""The web process: Django over ASGI for HTTP, Channels for websockets.

HTTP is split in three. The hot endpoints (chat completions, models) are served by gateway.http
without Django's handler, which cost more than the request path itself. The rest of the API (/v1/...)
and the health probes run through a Django handler without the console's middleware: they
authenticate with virtual keys, not sessions, and each synchronous middleware would cost a thread
hop per request. Everything else (admin, console, management API, metrics, static files) gets
Django's full stack.
"""

import os
import threading
from urllib.parse import unquote

from sentinel.embedded import ensure_environment

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sentinel.settings")
ensure_environment()  # served by another ASGI server with nothing set: the embedded servers, as sentinel.web does

from django.core.asgi import get_asgi_application  # noqa: E402 - after the servers it needs are up

console_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.exceptions import RequestAborted  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402

from gateway import http as gateway_http  # noqa: E402
from gateway.cache.engine import warm_up  # noqa: E402
from gateway.call import request_id_from  # noqa: E402
from gateway.errors import GatewayError  # noqa: E402
from gateway.limits import tokens  # noqa: E402
from gateway.screening.engine import compile_prefilters  # noqa: E402
from sentinel import logs  # noqa: E402
from sentinel.routing import websocket_urlpatterns  # noqa: E402
from sentinel.startup import settle_web_process  # noqa: E402
from sentinel.text import control_character  # noqa: E402

API_PREFIXES = ("/v1/", "/health/")
REQUEST_ID_HEADER = b"x-sentinel-request-id"
NOSNIFF = (b"x-content-type-options", b"nosniff")
MULTIPART_ALLOWANCE = 64 * 1024


class APIHandler(ASGIHandler):
    """Django's ASGI handler with no middleware, and a body limit enforced while reading."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)

    async def handle(self, scope, receive, send) -> None:
        found = _control_in_target(scope)
        if found is not None:
            message = f"Control characters are not allowed in the URL ({found} found)."
            await _send_error(send, GatewayError(400, "invalid_url", message))
            return
        limit = settings.MAX_BODY_BYTES
        if scope["path"] == "/v1/files":  # batch input files: their own limit, plus the multipart framing
            limit = settings.BATCH_MAX_FILE_BYTES + MULTIPART_ALLOWANCE
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_too_large(send, limit)
            return
        received = 0
        too_large = False

        async def limited_receive():
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    too_large = True
                    raise RequestAborted
            return message

        await super().handle(scope, limited_receive, send)
        if too_large:
            await _send_too_large(send, limit)


def _control_in_target(scope) -> str | None:
    """A control character in the URL's path or decoded query string: no id, name or parameter of the
    API holds one, and NUL in an id reached PostgreSQL (GET /v1/responses/a%00b was a 500)."""
    found = control_character(scope["path"])
    if found is None and scope.get("query_string"):
        found = control_character(unquote(scope["query_string"].decode("latin-1"), errors="replace"))
    return found


async def _send_too_large(send, limit: int) -> None:
    error = GatewayError(
        413,
        "request_too_large",
        f"Request body is larger than {limit} bytes.",
        kind="invalid_request_error",
    )
    await _send_error(send, error)


async def _send_error(send, error: GatewayError) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
        }
    )
    await send({"type": "http.response.body", "body": error.body()})


def _preload_routes() -> None:
    """The routes and prices this process serves by, read before its first request: with the
    database away later, the last copies read are served (sentinel.localstate)."""
    import logging

    from django.db import DatabaseError, connection

    from gateway.upstream import routing
    from sentinel.localstate import DatabaseUnavailable

    try:
        routing.preload()
    except (DatabaseUnavailable, DatabaseError) as exc:
        # No database now (readiness says so), or one not migrated yet: routes are read on first use.
        logging.getLogger(__name__).warning("routes not preloaded: %s: %s", type(exc).__name__, exc)
    finally:
        connection.close()  # read on the main thread; requests read on their own


api_application = APIHandler()
# On a thread of its own: uvicorn imports this module inside its event loop, where Django refuses
# database access. The server starts after it.
_preloading = threading.Thread(target=_preload_routes, name="route-preload")
_preloading.start()
_preloading.join()
# Load the cache's embedding model now, in the background, rather than on the first request.
threading.Thread(target=warm_up, name="embedder-warm-up", daemon=True).start()
# And the tokenizers admission counts prompts with (about a second for o200k_base).
threading.Thread(target=tokens.warm_up, name="tokenizer-warm-up", daemon=True).start()
# And the screening checks' Hyperscan prefilters (about 2 s of CPU, each in a thread of its own that
# leaves the GIL): every screened text is prefiltered once they are ready.
threading.Thread(target=compile_prefilters, name="prefilter-warm-up", daemon=True).start()
static_application = ASGIStaticFilesHandler(console_application)


async def http_application(scope, receive, send) -> None:
    """Every HTTP request gets its id here: the client's when it is a sane token, else a new one.
    The id goes into the logging context, replaces the request's header (so the pipeline, the
    ledger and the provider see the same one) and is returned on every response. Every response
    also gets `X-Content-Type-Options: nosniff` here (Django's SecurityMiddleware adds it to the
    console's, but the API is served without middleware): a browser never guesses a type, and so
    never renders tenant bytes or an error echoing input as HTML."""
    headers = scope["headers"]
    sent = next((value for name, value in headers if name == REQUEST_ID_HEADER), None)
    request_id = request_id_from(sent.decode("latin-1") if sent is not None else None)
    logs.request_id.set(request_id)
    encoded = request_id.encode()
    if sent != encoded:
        scope = {**scope, "headers": [*(h for h in headers if h[0] != REQUEST_ID_HEADER), (REQUEST_ID_HEADER, encoded)]}

    async def send_with_id(message) -> None:
        if message["type"] == "http.response.start":
            response_headers = list(message.get("headers") or ())
            names = {name.lower() for name, _ in response_headers}
            added = [(REQUEST_ID_HEADER, encoded)] if REQUEST_ID_HEADER not in names else []
            if NOSNIFF[0] not in names:
                added.append(NOSNIFF)
            if added:
                message = {**message, "headers": [*response_headers, *added]}
        await send(message)

    if scope["path"] in gateway_http.ROUTES:
        await gateway_http.serve(scope, receive, send_with_id)
    elif scope["path"].startswith(API_PREFIXES):
        await api_application(scope, receive, send_with_id)
    else:
        await static_application(scope, receive, send_with_id)


application = ProtocolTypeRouter(
    {
        "http": http_application,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)


settle_web_process()  # the collector and numpy's BLAS threads (sentinel/startup.py)
