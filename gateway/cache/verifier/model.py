"""The pair model, whose parameters are in weights.json beside this file (`manage.py
cache_verifier_train` rebuilds them from the labeled pairs in the repository; docs/cache.md says
how): a logistic regression over features.py's lexical features (a dot product), no library at run
time. The verifier reads its probability as the cross-encoder's gate (verifier/cross.py): a pair
rated under it is refused without being scored.
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
    threshold: float  # the probability the pair model alone would serve from (validation only)

    def probability(self, features: list[float]) -> float:
        z = self.intercept + sum(
            c * (x - m) / s for c, x, m, s in zip(self.coef, features, self.mean, self.scale, strict=True)
        )
        return _sigmoid(z)


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


@lru_cache(maxsize=1)
def _weights() -> dict:
    return json.loads(WEIGHTS.read_text("utf-8"))


@lru_cache(maxsize=1)
def pair_model() -> PairModel:
    return _model(_weights())
