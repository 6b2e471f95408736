"""Middleware of the pages Django serves (the console and the management API; the gateway's /v1
routes bypass it, sentinel.asgi)."""

from __future__ import annotations

import json

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpResponse, HttpResponseBadRequest, JsonResponse

from sentinel.text import StorableJSONDecoder, row_id

NUL_MESSAGE = "NUL (U+0000) is not allowed in a query string."
SELECTION_MESSAGE = "Selected rows are named by their ids."


def _refusal(request) -> HttpResponse | None:
    """A 400 for a query string with NUL in a name or value (no filter, search or parameter of ours
    takes one, and PostgreSQL's text cannot hold one: a console list filtered by `?role__exact=%00`
    failed its count query with a 500), the management API's in its own shape, a parameter's errors
    under its name (DRF's), the console's in plain text; then for a list action's selection and a
    JSON body (below)."""
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            if request.path.startswith("/api/"):
                return JsonResponse({"detail" if "\x00" in name else name: [NUL_MESSAGE]}, status=400)
            return HttpResponseBadRequest(NUL_MESSAGE, content_type="text/plain; charset=utf-8")
    if _selection_not_ids(request):
        return HttpResponseBadRequest(SELECTION_MESSAGE, content_type="text/plain; charset=utf-8")
    problem = _json_body_problem(request)
    if problem is not None:
        return JsonResponse({"detail": problem}, status=400)
    return None


def _json_body_problem(request) -> str | None:
    """What is wrong with a JSON body sent to a page Django serves (the security keys' ceremonies are
    JSON), read before its view: an integer of 5,000 digits made Python's decoder raise a plain
    ValueError in django-otp-webauthn's views (a 500, signed in or not); NaN, Infinity and nesting
    past the interpreter's stack are refused alike."""
    if request.method not in ("POST", "PUT", "PATCH") or request.content_type != "application/json":
        return None
    try:
        json.loads(request.body or b"null", cls=StorableJSONDecoder)
    except (ValueError, RecursionError) as error:
        return f"The body is not JSON this page takes: {str(error)[:200]}"
    return None


def _selection_not_ids(request) -> bool:
    """A console list action's rows are given by id, and Django's admin filters by them as given:
    anything but an id ("abc", 5,000 digits) raised ValueError in every list's actions (a 500). The
    form is read as the CSRF check that follows reads it anyway."""
    if request.method != "POST" or not request.path.startswith("/admin/"):
        return False
    if request.content_type not in ("application/x-www-form-urlencoded", "multipart/form-data"):
        return False
    return any(row_id(value) is None for value in request.POST.getlist("_selected_action"))


class RefuseMalformedInput:
    """Answers a query string holding NUL, a console list action's selection that is not ids, or a JSON
    body Python cannot decode, with a 400 before any view reads the database with it."""

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
