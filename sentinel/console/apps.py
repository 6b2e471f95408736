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
        headers_once_per_list()


def headers_once_per_list() -> None:
    """Unfold 0.91 builds a list's column headers (three query strings each) again for every row, to
    label its cells: 40% of a 100-row list's CPU (bench/console.py). The headers are the same for every
    row of one list, so each ChangeList (one per request) keeps the first ones built. The output is
    unchanged: the same headers, built once."""
    from unfold.templatetags import unfold_list

    built = unfold_list.result_headers
    if getattr(built, "once_per_list", False):
        return

    def result_headers(cl):
        if "_console_headers" not in cl.__dict__:
            cl.__dict__["_console_headers"] = list(built(cl))
        return iter(cl.__dict__["_console_headers"])

    result_headers.once_per_list = True
    unfold_list.result_headers = result_headers


class ConsoleAdminConfig(admin_apps.AdminConfig):
    """Django's admin app, serving the console's site (console.sites.ConsoleSite) as admin.site."""

    default = False
    default_site = "sentinel.console.sites.ConsoleSite"
