from django.urls import path, re_path

from gateway import views

urlpatterns = [
    path("health/live", views.live),
    path("health/ready", views.ready),
    re_path(r"^v1/(?P<path>(?s:.*))$", views.not_found),
]
