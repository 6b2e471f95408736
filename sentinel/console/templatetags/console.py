"""Formatting for the console's pages."""

from decimal import Decimal

from django import template

from billing.money import format_usd

register = template.Library()


@register.filter
def percent(value: float | None) -> str:
    """0.1234 → "12.3 %"; no value (nothing to divide) → "—"."""
    if value is None:
        return "—"
    return f"{value * 100:.1f} %"


@register.filter
def usd(value: Decimal | None, places: int = 4) -> str:
    """Money for reading, rounded for the page only (exports and the API carry the exact figure)."""
    if value is None:
        return "—"
    return f"${Decimal(format_usd(value)):,.{int(places)}f}"
