"""HTTP Basic for the management API, behind the same brute-force guard as the console's login:
failed attempts count per account name and per client address (django-ratelimit, in the shared Redis
cache), and a caller over either limit is refused before its password is even checked. Successful
requests count against nothing, so scripts may call the API as often as they like."""

from __future__ import annotations

from django.conf import settings
from django_ratelimit.core import get_usage
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BasicAuthentication
from rest_framework.exceptions import AuthenticationFailed, Throttled

GROUP = "api-basic-auth"


def _guards(userid: str) -> list[tuple]:
    return [
        (lambda group, request: userid.lower(), settings.LOGIN_RATE_PER_USER),
        ("ip", settings.LOGIN_RATE_PER_IP),
    ]


class GuardedBasicAuthentication(BasicAuthentication):
    def authenticate_credentials(self, userid, password, request=None):
        for key, rate in _guards(userid):
            usage = get_usage(request, group=GROUP, key=key, rate=rate)
            if usage is not None and usage["count"] >= usage["limit"]:  # the limit is the failures allowed
                raise Throttled(wait=max(usage["time_left"], 1), detail="Too many failed sign-ins. Wait and try again.")
        try:
            return super().authenticate_credentials(userid, password, request)
        except AuthenticationFailed:
            for key, rate in _guards(userid):
                get_usage(request, group=GROUP, key=key, rate=rate, increment=True)
            raise


class GuardedBasicScheme(OpenApiAuthenticationExtension):
    """Describes GuardedBasicAuthentication in the OpenAPI schema: plain HTTP Basic to a client."""

    target_class = GuardedBasicAuthentication
    name = "basicAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "basic"}
