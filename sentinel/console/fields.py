"""Form fields the console's admins share: an allowlist picked from the models that exist (the
installation's model aliases live in the gateway, above the tenants app whose fields name them)."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError


def model_choices() -> list[tuple[str, str]]:
    """What an allowlist may name: the installation's model aliases, and `auto` (the local router)."""
    from gateway.models import ModelAlias
    from gateway.upstream.autoroute import AUTO_MODEL

    aliases = [(a.name, f"{a.name}: {a.description}" if a.description else a.name) for a in ModelAlias.objects.all()]
    return [*aliases, (AUTO_MODEL, f"{AUTO_MODEL}: the fast or smart model, by the prompt")]


class ModelNames(forms.MultipleChoiceField):
    """An allowlist picked from the models that exist (a typed name could be a typo that locks every
    key out); a name that no longer exists is named in the error."""

    def __init__(self, **kwargs):
        kwargs.pop("max_length", None)
        kwargs.pop("base_field", None)
        super().__init__(choices=model_choices, required=False, **kwargs)

    def validate(self, value):
        known = {name for name, _ in model_choices()}
        unknown = [name for name in value if name not in known]
        if unknown:
            raise ValidationError(f"No such model: {', '.join(unknown)}. Choose from the list.", code="invalid_choice")


class ModelNamesAdmin:
    """Admins whose `allowed_models` is chosen from the models that exist, in a filterable list."""

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "allowed_models":
            from django.contrib.admin.widgets import FilteredSelectMultiple

            widget = FilteredSelectMultiple("models", is_stacked=False)
            return ModelNames(label="Allowed models", help_text=db_field.help_text, widget=widget)
        return super().formfield_for_dbfield(db_field, request, **kwargs)
