"""Middleware of the pages Django serves (the console and the management API; the gateway's /v1
routes bypass it, sentinel.asgi)."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpResponse, HttpResponseBadRequest, JsonResponse

NUL_MESSAGE = "NUL (U+0000) is not allowed in a query string."


def _refusal(request) -> HttpResponse | None:
    """A 400 for a query string with NUL in a name or value: no filter, search or parameter of ours
    takes one, and PostgreSQL's text cannot hold one (a console list filtered by `?role__exact=%00`
    failed its count query with a 500). The management API's in its own shape, a parameter's errors
    under its name (DRF's), the console's in plain text."""
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            if request.path.startswith("/api/"):
                return JsonResponse({"detail" if "\x00" in name else name: [NUL_MESSAGE]}, status=400)
            return HttpResponseBadRequest(NUL_MESSAGE, content_type="text/plain; charset=utf-8")
    return None


class RefuseNulInQueryString:
    """Answers a query string holding NUL with a 400 before any view reads the database with it."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._async_call(request)
        return _refusal(request) or self.get_response(request)

    async def _async_call(self, request):
        return _refusal(request) or await self.get_response(request)
