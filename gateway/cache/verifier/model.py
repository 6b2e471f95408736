"""The pair models: logistic regressions whose coefficients are in weights.json beside this file
(`manage.py cache_verifier_train` rebuilds them from the labeled pairs in the repository;
docs/cache.md says how). Scoring is a dot product: no library at run time.

- the pair model, over features.py's lexical features: a pair it rates at or above its threshold
  is served;
- the context model, over the same features and context.py's fourth-layer alignment of the two
  prompts: a pair the pair model leaves under its threshold but at or above the context model's
  gate (the lowest pair-model probability of a pair the context model accepted out of fold) is
  encoded and served if the context model rates it at or above its own threshold. The two
  thresholds are chosen together, so that what either serves stays within the target share of
  wrong hits out of fold.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

WEIGHTS = Path(__file__).with_name("weights.json")


@dataclass(frozen=True)
class PairModel:
    names: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    threshold: float  # the probability a pair needs to be served

    def probability(self, features: list[float]) -> float:
        z = self.intercept + sum(
            c * (x - m) / s for c, x, m, s in zip(self.coef, features, self.mean, self.scale, strict=True)
        )
        # Stable at any z: a long prompt of distinct words can push z past exp's range (-709).
        if z >= 0:
            return 1 / (1 + math.exp(-z))
        return math.exp(z) / (1 + math.exp(z))


def _model(data: dict) -> PairModel:
    return PairModel(
        names=tuple(data["features"]),
        mean=tuple(data["mean"]),
        scale=tuple(data["scale"]),
        coef=tuple(data["coef"]),
        intercept=data["intercept"],
        threshold=data["threshold"],
    )


@lru_cache(maxsize=1)
def _weights() -> dict:
    return json.loads(WEIGHTS.read_text("utf-8"))


@lru_cache(maxsize=1)
def pair_model() -> PairModel:
    return _model(_weights())


@lru_cache(maxsize=1)
def context_model() -> PairModel:
    return _model(_weights()["context"])


@lru_cache(maxsize=1)
def context_gate() -> float:
    """The pair-model probability under which the context model is not asked."""
    return float(_weights()["context"]["gate"])


@lru_cache(maxsize=1)
def context_cuts() -> tuple[float, float, float]:
    cuts = _weights()["context"]["cuts"]
    return (cuts[0], cuts[1], cuts[2])
