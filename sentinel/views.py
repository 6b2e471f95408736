"""Project-level views."""

from django.http import HttpResponse


def too_many_sign_ins(wait: int) -> HttpResponse:
    """The console's answer to a sign-in the brute-force guard refused (sentinel.authentication)."""
    return HttpResponse(
        "Too many failed sign-ins. Wait and try again.",
        status=429,
        content_type="text/plain",
        headers={"Retry-After": str(wait)},
    )
