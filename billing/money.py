"""Money is Decimal. Every cost the gateway computes is rounded here, in one place, and priced here
by kind of token, by the providers' own rules."""

from __future__ import annotations

from dataclasses import dataclass
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


def format_usd(value: Decimal) -> str:
    """The `x-sentinel-cost-usd` header value: the ledger's exact figure, no exponent."""
    return format(quantize_cost(value), "f")


def _count(value: object) -> int:
    """A token count as a provider reports it; anything but a positive number is none."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return 0
    return int(value)


@dataclass(frozen=True)
class Tokens:
    """What one answer used, by kind, in OpenAI's terms (litellm puts every provider's usage in
    them): `prompt` counts every input token, the cached ones included, and `completion` every
    output token, the reasoning ones included. Of the prompt, `cache_read` tokens were read from the
    provider's prompt cache and `cache_write` tokens written to it; of the completion, `reasoning`
    tokens were the model's hidden reasoning."""

    prompt: int = 0
    completion: int = 0
    cache_read: int = 0
    cache_write: int = 0
    reasoning: int = 0

    @classmethod
    def from_usage(cls, usage: dict) -> Tokens:
        """OpenAI's `usage`: `prompt_tokens_details.cached_tokens` and
        `completion_tokens_details.reasoning_tokens`; litellm adds Anthropic's cache writes as
        `prompt_tokens_details.cache_creation_tokens` (and `cache_creation_input_tokens`), having
        counted Anthropic's cache reads and writes into `prompt_tokens` as OpenAI does. A provider
        that reports more cached or reasoning tokens than tokens is believed up to the total."""
        prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details") or {}
        output_details = usage.get("completion_tokens_details") or {}
        if not isinstance(details, dict):
            details = {}
        if not isinstance(output_details, dict):
            output_details = {}
        read = _count(details.get("cached_tokens")) or _count(usage.get("cache_read_input_tokens"))
        write = _count(details.get("cache_creation_tokens")) or _count(usage.get("cache_creation_input_tokens"))
        read = min(read, prompt)
        write = min(write, prompt - read)
        reasoning = min(_count(output_details.get("reasoning_tokens")), completion)
        return cls(prompt, completion, read, write, reasoning)

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            self.prompt + other.prompt,
            self.completion + other.completion,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
            self.reasoning + other.reasoning,
        )


@dataclass(frozen=True)
class Rates:
    """USD per token of each kind, as one request is billed (the batch rates already chosen)."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    reasoning: Decimal


@dataclass(frozen=True)
class Bill:
    """What an answer cost: its tokens, the total, and the part of it each special kind of token
    made (the rest is uncached input and visible output). The total is rounded once, from the exact
    sum; each part is rounded on its own."""

    tokens: Tokens = Tokens()
    cost: Decimal = ZERO
    cache_read_cost: Decimal = ZERO
    cache_write_cost: Decimal = ZERO
    reasoning_cost: Decimal = ZERO
    price_id: int | None = None

    def __add__(self, other: Bill) -> Bill:
        """Two calls billed as one request (an escalated refusal): the later call's price version."""
        return Bill(
            self.tokens + other.tokens,
            self.cost + other.cost,
            self.cache_read_cost + other.cache_read_cost,
            self.cache_write_cost + other.cache_write_cost,
            self.reasoning_cost + other.reasoning_cost,
            other.price_id,
        )


def bill(tokens: Tokens, rates: Rates, price_id: int | None = None) -> Bill:
    """The providers' rule: cached and reasoning tokens are part of the prompt and completion
    counts, billed at their own rates instead of the input and output rates."""
    read = tokens.cache_read * rates.cache_read
    write = tokens.cache_write * rates.cache_write
    reasoning = tokens.reasoning * rates.reasoning
    plain_input = (tokens.prompt - tokens.cache_read - tokens.cache_write) * rates.input
    plain_output = (tokens.completion - tokens.reasoning) * rates.output
    return Bill(
        tokens,
        quantize_cost(plain_input + read + write + plain_output + reasoning),
        quantize_cost(read),
        quantize_cost(write),
        quantize_cost(reasoning),
        price_id,
    )
