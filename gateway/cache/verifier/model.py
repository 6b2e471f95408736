"""The pair model: logistic regression over features.py's features, its coefficients in
weights.json beside this file (`manage.py cache_verifier_train` rebuilds them from the labeled
pairs in the repository; docs/cache.md says how). Scoring is a dot product: no library at run time.
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
        return 1 / (1 + math.exp(-z))


@lru_cache(maxsize=1)
def pair_model() -> PairModel:
    data = json.loads(WEIGHTS.read_text("utf-8"))
    return PairModel(
        names=tuple(data["features"]),
        mean=tuple(data["mean"]),
        scale=tuple(data["scale"]),
        coef=tuple(data["coef"]),
        intercept=data["intercept"],
        threshold=data["threshold"],
    )
