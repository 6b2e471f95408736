from django.contrib import admin
from django.http import HttpResponse, JsonResponse
from django.urls import include, path, re_path
from django.views import defaults
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from gateway import views as gateway_views


def api_not_found(request, path: str = "") -> JsonResponse:
    """The management API answers in JSON, unknown URLs included."""
    return JsonResponse({"detail": f"Unknown API URL: {request.method} {request.path}."}, status=404)


def server_error(request) -> HttpResponse:
    """An unexpected error (logged with its traceback by Django): the API answers in its own shape,
    OpenAI's on /v1 and /health, the management API's on /api; the console with Django's page."""
    from gateway.pipeline import INTERNAL_ERROR

    if request.path.startswith(("/v1/", "/health/")):
        return JsonResponse(INTERNAL_ERROR.payload(), status=500)
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Server error; it has been logged."}, status=500)
    return defaults.server_error(request)


handler500 = server_error


# A shield in the console's blue: browsers ask for /favicon.ico on every page (a 404 each time).
FAVICON = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    b'<path d="M16 2 4 7v8c0 7.5 5.1 13.4 12 15 6.9-1.6 12-7.5 12-15V7z" fill="#417690"/>'
    b'<path d="m10 16 4 4 8-9" stroke="#fff" stroke-width="3" fill="none"/></svg>'
)


def favicon(request) -> HttpResponse:
    response = HttpResponse(FAVICON, content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response


urlpatterns = [
    path("favicon.ico", favicon),
    path("", include("gateway.urls")),
    path("admin/", admin.site.urls),
    path("oidc/", include("mozilla_django_oidc.urls")),  # single sign-on (sentinel.console.sso)
    # security keys' ceremonies (sentinel.console.securitykeys), named as django-otp-webauthn's scripts expect
    path("webauthn/", include(("sentinel.console.securitykeys", "otp_webauthn"))),
    path("api/v1/", include("billing.urls")),
    # One scrape adds up every web worker's samples, django-prometheus's and the gateway's.
    path("metrics", gateway_views.metrics_export, name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    re_path(r"^api/(?P<path>(?s:.*))$", api_not_found),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
