from django.conf import settings
from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from django_ratelimit.decorators import ratelimit
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from gateway import views as gateway_views

# Brute force on the console's login: limited per address and per account name, across processes
# (django-ratelimit counts in the shared Redis cache).
admin.site.login = ratelimit(key="ip", rate=settings.LOGIN_RATE_PER_IP, method="POST")(
    ratelimit(key="post:username", rate=settings.LOGIN_RATE_PER_USER, method="POST")(admin.site.login)
)


def api_not_found(request, path: str = "") -> JsonResponse:
    """The management API answers in JSON, unknown URLs included."""
    return JsonResponse({"detail": f"Unknown API URL: {request.method} {request.path}."}, status=404)


urlpatterns = [
    path("", include("gateway.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("billing.urls")),
    # One scrape adds up every web worker's samples, django-prometheus's and the gateway's.
    path("metrics", gateway_views.metrics_export, name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    re_path(r"^api/(?P<path>(?s:.*))$", api_not_found),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
