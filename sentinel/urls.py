from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

admin.site.site_header = "Sentinel console"
admin.site.site_title = "Sentinel console"
admin.site.index_title = "Tenants, keys, models and spend"

urlpatterns = [
    path("", include("gateway.urls")),
    path("admin/", admin.site.urls),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
