"""Money is Decimal. Every cost the gateway computes is rounded here, in one place."""

from decimal import ROUND_HALF_EVEN, Decimal

# Ledger costs keep 10 places: a cent is 1e-2, a cheap token costs ~1e-8, so a single short request
# still has significant digits, and sums reconcile to the cent with room to spare.
COST_PLACES = Decimal("1e-10")
# Per-token prices are stored with 15 places (the cheapest litellm prices are ~1e-9 per token).
PRICE_PLACES = Decimal("1e-15")

ZERO = Decimal(0)


def quantize_cost(value: Decimal) -> Decimal:
    return value.quantize(COST_PLACES, rounding=ROUND_HALF_EVEN)


def to_price(value: float | str | Decimal) -> Decimal:
    """A per-token price from litellm's map (floats in JSON) as an exact Decimal."""
    return Decimal(str(value)).quantize(PRICE_PLACES, rounding=ROUND_HALF_EVEN)


def request_cost(prompt_tokens: int, completion_tokens: int, input_price: Decimal, output_price: Decimal) -> Decimal:
    return quantize_cost(prompt_tokens * input_price + completion_tokens * output_price)


def format_usd(value: Decimal) -> str:
    """The `x-sentinel-cost-usd` header value: the ledger's exact figure, no exponent."""
    return format(quantize_cost(value), "f")
