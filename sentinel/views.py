"""Project-level views."""

from django.http import HttpRequest, HttpResponse


def ratelimited(request: HttpRequest, exception: Exception) -> HttpResponse:
    """What django-ratelimit answers once a caller is over a limit (e.g. repeated failed logins)."""
    return HttpResponse(
        "Too many attempts. Wait a minute and try again.",
        status=429,
        content_type="text/plain",
        headers={"Retry-After": "60"},
    )
