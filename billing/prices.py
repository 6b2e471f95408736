"""The price table: seeded from litellm's bundled price map (read from disk, never fetched) and
looked up on the request path from a small in-process cache, which every gateway process drops as
soon as a price changes anywhere (sentinel.localstate)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from django.utils import timezone

from billing.models import Price
from billing.money import Rates, to_price
from sentinel.localstate import TTLCache

# The moment bundled prices take effect: before any request this installation can have served.
SEED_EFFECTIVE_FROM = datetime(2000, 1, 1, tzinfo=UTC)
CACHE_SECONDS = 60.0


def litellm_price_map() -> dict:
    """litellm's bundled map, read as a file so importing litellm (seconds) is not needed."""
    import importlib.util

    spec = importlib.util.find_spec("litellm")
    path = Path(spec.origin).parent / "model_prices_and_context_window_backup.json"
    return json.loads(path.read_text())


# Price columns and the keys of litellm's map they are read from.
MAP_KEYS = {
    "input_per_token": "input_cost_per_token",
    "output_per_token": "output_cost_per_token",
    "cache_read_per_token": "cache_read_input_token_cost",
    "cache_write_per_token": "cache_creation_input_token_cost",
    "reasoning_per_token": "output_cost_per_reasoning_token",
    "batch_input_per_token": "input_cost_per_token_batches",
    "batch_output_per_token": "output_cost_per_token_batches",
    "batch_cache_read_per_token": "cache_read_input_token_cost_batches",
    "batch_cache_write_per_token": "cache_creation_input_token_cost_batches",
}
# The columns for kinds of token other than plain input and output: empty falls back (PriceVersion.rates).
KIND_COLUMNS = tuple(MAP_KEYS)[2:]


def seeded_prices(price_map: dict) -> list[tuple[str, dict[str, Decimal]]]:
    """(model, {column: price}) for every chat/completion model that has both token prices, and
    every embedding model with an input price (an embedding has no output tokens: 0 when the map has
    none); the other kinds' prices where the map has them."""
    rows = []
    for model, entry in price_map.items():
        if not isinstance(entry, dict) or entry.get("mode") not in ("chat", "completion", "embedding"):
            continue
        inp, out = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
        if entry["mode"] == "embedding" and out is None:
            out = 0
        if inp is None or out is None:
            continue
        columns = {"input_per_token": to_price(inp), "output_per_token": to_price(out)}
        for column in KIND_COLUMNS:
            value = entry.get(MAP_KEYS[column])
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                columns[column] = to_price(value)
        rows.append((model, columns))
    return rows


def seed_from_litellm(price_model=Price) -> int:
    """Insert the bundled prices that are not in the table yet; returns how many were added. Only
    the columns `price_model` has are filled (a migration's historical model may lack later ones)."""
    known = {field.name for field in price_model._meta.get_fields()}
    rows = [
        price_model(
            model=model,
            effective_from=SEED_EFFECTIVE_FROM,
            source="litellm",
            **{column: value for column, value in columns.items() if column in known},
        )
        for model, columns in seeded_prices(litellm_price_map())
    ]
    before = price_model.objects.count()
    price_model.objects.bulk_create(rows, ignore_conflicts=True, batch_size=1000)
    return price_model.objects.count() - before


def price_key(litellm_model: str) -> list[str]:
    """Names to look a deployment's model up under: as given, then without the provider prefix."""
    names = [litellm_model]
    if "/" in litellm_model:
        names.append(litellm_model.split("/", 1)[1])
    return names


@dataclass(frozen=True)
class PriceVersion:
    """One price version as the request path uses it (or a deployment's own prices: id None)."""

    id: int | None
    input_per_token: Decimal
    output_per_token: Decimal
    cache_read_per_token: Decimal | None = None
    cache_write_per_token: Decimal | None = None
    reasoning_per_token: Decimal | None = None
    batch_input_per_token: Decimal | None = None
    batch_output_per_token: Decimal | None = None
    batch_cache_read_per_token: Decimal | None = None
    batch_cache_write_per_token: Decimal | None = None

    def rates(self, *, batch: bool = False) -> Rates:
        """The rate of each kind of token, an empty kind falling back as litellm's cost calculator
        falls back: cache reads and writes to the input rate, reasoning to the output rate; in a
        batch, input and output to their batch rates, cache reads and writes to their batch rates,
        else their ordinary ones, else the batch input rate, and reasoning to the batch output rate."""
        cache_read, cache_write = self.cache_read_per_token, self.cache_write_per_token
        if not batch:
            return Rates(
                input=self.input_per_token,
                output=self.output_per_token,
                cache_read=_first(cache_read, self.input_per_token),
                cache_write=_first(cache_write, self.input_per_token),
                reasoning=_first(self.reasoning_per_token, self.output_per_token),
            )
        batch_input = _first(self.batch_input_per_token, self.input_per_token)
        batch_output = self.batch_output_per_token
        return Rates(
            input=batch_input,
            output=_first(batch_output, self.output_per_token),
            cache_read=_first(self.batch_cache_read_per_token, cache_read, batch_input),
            cache_write=_first(self.batch_cache_write_per_token, cache_write, batch_input),
            reasoning=_first(batch_output, self.reasoning_per_token, self.output_per_token),
        )

    def highest(self) -> tuple[Decimal, Decimal]:
        """The most a prompt token and a completion token can cost (admission's worst case)."""
        rates = self.rates()
        return max(rates.input, rates.cache_write, rates.cache_read), max(rates.output, rates.reasoning)


def _first(*values: Decimal | None) -> Decimal:
    return next(value for value in values if value is not None)


UNPRICED = PriceVersion(None, Decimal(0), Decimal(0))
_COLUMNS = ("id", *MAP_KEYS)


@dataclass(frozen=True)
class PriceOverrides:
    """A deployment's own prices. With both the input and the output price it is off the price
    table altogether: its other kinds fall back to its own input and output prices, never to the
    table's (whose cache and batch rates go with the table's base rates). A kind price alone
    replaces that kind's price from the table and keeps the rest."""

    input_per_token: Decimal | None = None
    output_per_token: Decimal | None = None
    cache_read_per_token: Decimal | None = None
    cache_write_per_token: Decimal | None = None
    reasoning_per_token: Decimal | None = None
    batch_input_per_token: Decimal | None = None
    batch_output_per_token: Decimal | None = None
    batch_cache_read_per_token: Decimal | None = None
    batch_cache_write_per_token: Decimal | None = None

    @property
    def complete(self) -> bool:
        """Enough to bill without the price table."""
        return self.input_per_token is not None and self.output_per_token is not None

    def over(self, version: PriceVersion) -> PriceVersion:
        """The prices a request to the deployment is billed at: these over the table's `version`."""
        if self.complete:
            version = PriceVersion(None, self.input_per_token, self.output_per_token)
        kinds = {column: getattr(self, column) for column in KIND_COLUMNS if getattr(self, column) is not None}
        return replace(version, **kinds) if kinds else version


NO_OVERRIDES = PriceOverrides()


# litellm model -> [(effective_from, version)], newest first.
_cache = TTLCache(ttl=CACHE_SECONDS, maxsize=10_000)


def clear_cache() -> None:
    _cache.clear()


def _versions(names: list[str]) -> list[tuple[datetime, PriceVersion]]:
    for name in names:
        rows = list(
            Price.objects.filter(model=name).order_by("-effective_from").values_list(*_COLUMNS, "effective_from")
        )
        if rows:
            return [(row[-1], PriceVersion(*row[:-1])) for row in rows]
    return []


def _in_force(versions: list[tuple[datetime, PriceVersion]], when: datetime) -> PriceVersion:
    for effective_from, version in versions:
        if effective_from <= when:
            return version
    return UNPRICED


def price_at(litellm_model: str, when: datetime | None = None) -> PriceVersion:
    """The price version in force at `when` (now by default)."""
    versions = _cache.read_through_sync(litellm_model, _versions, price_key(litellm_model))
    return _in_force(versions, when or timezone.now())


async def aprice_at(litellm_model: str, when: datetime | None = None) -> PriceVersion:
    """price_at for the request path; while the database is away, the prices last read."""
    versions = await _cache.read_through(litellm_model, _versions, price_key(litellm_model))
    return _in_force(versions, when or timezone.now())
