"""The console: Django's admin as the product tenant admins, finance and operators use, with a
dashboard and a live circuit view (updated over a Channels websocket)."""

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class ConsoleConfig(AppConfig):
    default = True
    name = "sentinel.console"
    label = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        from sentinel.console import audit

        audit.connect()


class ConsoleAdminConfig(admin_apps.AdminConfig):
    """Django's admin app, serving the console's site (console.sites.ConsoleSite) as admin.site."""

    default = False
    default_site = "sentinel.console.sites.ConsoleSite"
