"""Pricing by kind of token, without servers: usage as providers report it (and misreport it), and
which rate each kind falls back to when the price table has none of its own."""

from __future__ import annotations

from decimal import Decimal as D

import pytest

from billing.money import Rates, Tokens, bill
from billing.prices import PriceOverrides, PriceVersion


@pytest.mark.parametrize(
    ("usage", "tokens"),
    [
        # litellm's Anthropic usage: cache writes in prompt_tokens_details, reads as cached_tokens.
        (
            {
                "prompt_tokens": 50,
                "completion_tokens": 9,
                "prompt_tokens_details": {"cached_tokens": 20, "cache_creation_tokens": 10},
                "cache_creation_input_tokens": 10,
                "cache_read_input_tokens": 20,
            },
            Tokens(50, 9, 20, 10, 0),
        ),
        # More cached or reasoning tokens than tokens: believed up to the total, never below zero.
        (
            {
                "prompt_tokens": 8,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 6, "cache_creation_tokens": 6},
                "completion_tokens_details": {"reasoning_tokens": 5},
            },
            Tokens(8, 3, 6, 2, 3),
        ),
        # Not numbers, negative, null details: nothing of that kind.
        (
            {
                "prompt_tokens": "12",
                "completion_tokens": -1,
                "prompt_tokens_details": None,
                "completion_tokens_details": {"reasoning_tokens": True},
            },
            Tokens(0, 0, 0, 0, 0),
        ),
    ],
    ids=["anthropic-through-litellm", "overreported", "garbage"],
)
def test_usage_is_read_by_kind(usage, tokens):
    assert Tokens.from_usage(usage) == tokens


def test_each_kind_falls_back_as_litellm_does():
    bare = PriceVersion(1, D("0.000002"), D("0.000008"))
    assert bare.rates() == Rates(D("0.000002"), D("0.000008"), D("0.000002"), D("0.000002"), D("0.000008"))
    assert bare.rates(batch=True) == bare.rates()  # no batch prices: no discount
    cached = PriceVersion(
        1,
        D("0.000002"),
        D("0.000008"),
        cache_read_per_token=D("0.0000005"),
        batch_input_per_token=D("0.000001"),
        batch_output_per_token=D("0.000004"),
    )
    # In a batch, a cache read without a batch price of its own keeps its price; a cache write
    # without any price is a batch input token; reasoning is a batch output token.
    assert cached.rates(batch=True) == Rates(D("0.000001"), D("0.000004"), D("0.0000005"), D("0.000001"), D("0.000004"))


def test_a_deployment_with_its_own_prices_never_takes_the_tables_kinds():
    table = PriceVersion(7, D("0.000002"), D("0.000008"), cache_read_per_token=D("0.0000001"))
    own = PriceOverrides(input_per_token=D("0.000003"), output_per_token=D("0.000009")).over(table)
    assert (own.id, own.rates().cache_read) == (None, D("0.000003"))
    one_kind = PriceOverrides(cache_write_per_token=D("0.000004")).over(table)
    assert (one_kind.id, one_kind.rates().cache_read, one_kind.rates().cache_write) == (
        7,
        D("0.0000001"),
        D("0.000004"),
    )


def test_the_total_is_rounded_once_from_the_exact_sum():
    """Three parts of 1.5e-10 each round to 2e-10 (half to even), but the total is 4.5e-10 → 4e-10."""
    rates = Rates(D("0.00000000015"), D(0), D("0.00000000015"), D("0.00000000015"), D(0))
    billed = bill(Tokens(prompt=3, cache_read=1, cache_write=1), rates)
    assert (billed.cost, billed.cache_read_cost, billed.cache_write_cost) == (D("4E-10"), D("2E-10"), D("2E-10"))
