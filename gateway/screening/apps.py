from django.apps import AppConfig


class ScreeningConfig(AppConfig):
    name = "gateway.screening"
    label = "screening"
    verbose_name = "Safety screening"
