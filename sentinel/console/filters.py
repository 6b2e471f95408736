"""List filters whose choices come from more than one app: the request log (billing's ledger)
offers the gateway's model aliases and providers. They live in the console, which composes the
apps, so billing imports nothing of the gateway (tests/test_layout.py)."""

from __future__ import annotations

from django.contrib import admin


class ExactValueFilter(admin.SimpleListFilter):
    """`field` equal to the chosen value; the choices come from `values()`, any value may be given."""

    field: str

    def values(self) -> list[str]:
        raise NotImplementedError

    def has_output(self) -> bool:
        return True  # applied whatever the choices (a filter without output is not applied at all)

    def lookups(self, request, model_admin):
        values = self.values()
        chosen = self.value()
        return [(value, value) for value in (values if not chosen or chosen in values else [*values, chosen])]

    def queryset(self, request, queryset):
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class ModelRequestedFilter(ExactValueFilter):
    title = "model requested"
    parameter_name = field = "model_requested"

    def values(self) -> list[str]:
        from gateway.models import ModelAlias

        return list(ModelAlias.objects.order_by("name").values_list("name", flat=True))


class ProviderFilter(ExactValueFilter):
    title = "provider"
    parameter_name = field = "provider"

    def values(self) -> list[str]:
        from gateway.models import Provider

        return ["cache", *Provider.objects.order_by("name").values_list("name", flat=True)]
