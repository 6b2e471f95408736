"""The pair models, whose parameters are in weights.json beside this file (`manage.py
cache_verifier_train` rebuilds them from the labeled pairs in the repository; docs/cache.md says
how). No library at run time.

- the pair model, a logistic regression over features.py's lexical features (a dot product): a
  pair it rates at or above its threshold is served;
- the context model, an additive model (boosted stumps: one step function a feature, summed) over
  the same features and context.py's fourth-layer alignment of the two prompts: a pair the pair
  model leaves under its threshold but at or above the context model's gate (the lowest
  pair-model probability of a pair the context model accepted out of fold) is encoded and served
  if the context model rates it at or above its own threshold. The two thresholds are chosen
  together, so that what either serves stays within the target share of wrong hits out of fold.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
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
        return _sigmoid(z)


@dataclass(frozen=True)
class AdditiveModel:
    names: tuple[str, ...]
    base: float
    # (feature index, its cuts ascending, the value of each interval: len(cuts) + 1); a value x
    # falls in interval bisect_left(cuts, x), so x equal to a cut takes the value left of it.
    steps: tuple[tuple[int, tuple[float, ...], tuple[float, ...]], ...]
    threshold: float

    def probability(self, features: list[float]) -> float:
        if len(features) != len(self.names):
            raise ValueError(f"{len(features)} features for a model of {len(self.names)}")
        return _sigmoid(self.base + sum(values[bisect_left(cuts, features[i])] for i, cuts, values in self.steps))


def _sigmoid(z: float) -> float:
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


def additive_model(data: dict) -> AdditiveModel:
    names = tuple(data["features"])
    return AdditiveModel(
        names=names,
        base=data["base"],
        steps=tuple(
            (names.index(name), tuple(step["cuts"]), tuple(step["values"])) for name, step in data["steps"].items()
        ),
        threshold=data["threshold"],
    )


@lru_cache(maxsize=1)
def _weights() -> dict:
    return json.loads(WEIGHTS.read_text("utf-8"))


@lru_cache(maxsize=1)
def pair_model() -> PairModel:
    return _model(_weights())


@lru_cache(maxsize=1)
def context_model() -> AdditiveModel:
    return additive_model(_weights()["context"])


@lru_cache(maxsize=1)
def context_gate() -> float:
    """The pair-model probability under which the context model is not asked."""
    return float(_weights()["context"]["gate"])


@lru_cache(maxsize=1)
def context_cuts() -> tuple[float, float, float]:
    cuts = _weights()["context"]["cuts"]
    return (cuts[0], cuts[1], cuts[2])
