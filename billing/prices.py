"""The price table: seeded from litellm's bundled price map (read from disk, never fetched) and
looked up on the request path from a small in-process cache, which every gateway process drops as
soon as a price changes anywhere (sentinel.localstate)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from django.utils import timezone

from billing.models import Price
from billing.money import to_price
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


def seeded_prices(price_map: dict) -> list[tuple[str, Decimal, Decimal]]:
    """(model, input, output) for every chat/completion model that has both token prices, and every
    embedding model with an input price (an embedding has no output tokens: 0 when the map has none)."""
    rows = []
    for model, entry in price_map.items():
        if not isinstance(entry, dict) or entry.get("mode") not in ("chat", "completion", "embedding"):
            continue
        inp, out = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
        if entry["mode"] == "embedding" and out is None:
            out = 0
        if inp is None or out is None:
            continue
        rows.append((model, to_price(inp), to_price(out)))
    return rows


def seed_from_litellm(price_model=Price) -> int:
    """Insert the bundled prices that are not in the table yet; returns how many were added."""
    rows = [
        price_model(
            model=model,
            input_per_token=inp,
            output_per_token=out,
            effective_from=SEED_EFFECTIVE_FROM,
            source="litellm",
        )
        for model, inp, out in seeded_prices(litellm_price_map())
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
    id: int | None
    input_per_token: Decimal
    output_per_token: Decimal


UNPRICED = PriceVersion(None, Decimal(0), Decimal(0))

# litellm model -> [(effective_from, version)], newest first.
_cache = TTLCache(ttl=CACHE_SECONDS, maxsize=10_000)


def clear_cache() -> None:
    _cache.clear()


def _versions(names: list[str]) -> list[tuple[datetime, PriceVersion]]:
    for name in names:
        rows = list(
            Price.objects.filter(model=name)
            .order_by("-effective_from")
            .values_list("id", "input_per_token", "output_per_token", "effective_from")
        )
        if rows:
            return [(eff, PriceVersion(pk, inp, out)) for pk, inp, out, eff in rows]
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
