from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from gateway import views as gateway_views


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
