"""Formatting for the console's pages."""

from decimal import Decimal

from django import template

from billing.money import format_usd

register = template.Library()


@register.filter
def percent(value: float | None, places: int = 1) -> str:
    """0.1234 → "12.3 %" (or with more `places`); no value (nothing to divide) → "—"."""
    if value is None:
        return "—"
    return f"{value * 100:.{places}f} %"


@register.filter
def usd(value: Decimal | None, places: int = 4) -> str:
    """Money for reading: `places` decimals, except that an amount too small to show at that many is
    written exactly ($0.0000255, not $0.0000: a request's cost is often a few millionths)."""
    if value is None:
        return "—"
    exact = Decimal(format_usd(value))
    rounded = round(exact, int(places))
    if exact and not rounded:
        return f"${exact.normalize():f}" if exact > 0 else f"-${-exact.normalize():f}"
    return f"${rounded:,.{int(places)}f}"
