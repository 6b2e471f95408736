"""Rebuild the cache verifier's pair model (gateway/cache/verifier/weights.json) from labeled pairs.

Every pair that reaches the model in the cache (cosine at least the floor, no explicit check against
it) is one training row: features.py's lexical features, label `same`. The gateway reads the
model's probability as the cross-encoder's first cut (its gate: `manage.py cache_cross_train`
chooses it); the pair model alone would serve pairs from a threshold, which is chosen here by
leave-one-topic-out validation for comparison: for each topic, a model trained on the other topics
scores it; the lowest probability at which the pooled held-out hits keep their wrong share within
--target is the threshold, so the figure reported predicts topics the model never saw. Then it is
fitted on every pair and written with that threshold. Prints the validation per topic; the last
line is JSON. Needs scikit-learn (requirements.in); the request path reads only the coefficients.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
from django.conf import settings
from django.core.management.base import BaseCommand

from gateway.cache.acceptance import DEFAULT_THRESHOLD, normalize_prompt
from gateway.cache.verifier import checks, features
from gateway.cache.verifier.model import WEIGHTS
from gateway.cache.verifier.text import split_payload, tokens
from gateway.management.commands.cache_eval import load_pairs

SOURCES = (
    "bench/data/paraphrase_dev.jsonl",
    "tests/data/cache_pairs_holdout.jsonl",
    "tests/data/cache_pairs_topics.jsonl",
    "tests/data/cache_pairs_fresh.jsonl",
    "tests/data/cache_pairs_fresh2.jsonl",
    "tests/data/cache_pairs_fresh3.jsonl",
    "tests/data/cache_pairs_fresh4.jsonl",
    "tests/data/cache_pairs_fresh5.jsonl",
    "tests/data/cache_pairs_fresh6.jsonl",
    "tests/data/cache_pairs_fresh7.jsonl",
    "tests/data/cache_pairs_fresh8.jsonl",
    "tests/data/cache_pairs_fresh9.jsonl",
    "tests/data/cache_pairs_fresh10.jsonl",
    "tests/data/cache_pairs_fresh11.jsonl",
    "tests/data/cache_pairs_fresh12.jsonl",
    "tests/data/cache_pairs_fresh13.jsonl",
    "tests/data/cache_pairs_fresh14.jsonl",
    "tests/data/cache_pairs_fresh15.jsonl",
    "tests/data/cache_pairs_fresh16.jsonl",
    "tests/data/cache_pairs_fresh17.jsonl",
)


def labeled_pairs() -> list[dict]:
    return [pair for source in SOURCES for pair in load_pairs(settings.BASE_DIR / source)]


def prompt_vectors(pairs: list[dict], embedder) -> dict[str, np.ndarray]:
    """Every prompt of the pairs, normalized as the cache stores it, and its embedding."""
    texts = sorted({normalize_prompt(p[k]) for p in pairs for k in "ab"})
    vectors = np.concatenate([embedder.embed(texts[i : i + 64]) for i in range(0, len(texts), 64)])
    return dict(zip(texts, vectors, strict=True))


def reworded_negatives(pairs: list[dict]) -> list[dict]:
    """Hard negatives in other words: for each prompt, every labeled paraphrase of it against every
    hard negative of it (b means what a means, c does not: b and c differ). The labeled hard
    negatives change one thing of a prompt in its own words, so without these the model learns
    that a rewording with a word left over is a paraphrase ("Explain how rainbows are formed." /
    "How does a double rainbow form?"). Training only: every figure is on the labeled pairs."""
    groups: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for pair in pairs:
        paraphrases, negatives = groups.setdefault((pair["domain"], normalize_prompt(pair["a"])), ([], []))
        if pair["same"]:
            paraphrases.append(pair["b"])
        elif pair.get("kind") == "hard_negative":
            negatives.append(pair["b"])
    return [
        {"a": b, "b": c, "same": False, "kind": "reworded_hard_negative", "domain": domain}
        for (domain, _), (paraphrases, negatives) in groups.items()
        for b in paraphrases
        for c in negatives
    ]


def rows_for(pairs: list[dict], vectors: dict[str, np.ndarray]) -> list[tuple[dict, list[float] | None]]:
    """(pair, features) with features None where the cache would never ask the model."""
    out = []
    for pair in pairs:
        a, b = normalize_prompt(pair["a"]), normalize_prompt(pair["b"])
        similarity = float(vectors[a] @ vectors[b])
        x = None
        if similarity >= DEFAULT_THRESHOLD and a != b and checks.in_english(a) and checks.in_english(b):
            (pa, ia), (pb, ib) = split_payload(a), split_payload(b)
            pasted = bool(pa and pb)
            ta, tb = (tokens(ia), tokens(ib)) if pasted else (tokens(a), tokens(b))
            if not (pasted and pa != pb) and not checks.first_difference(ta, tb):
                x = features.pair_features(ta, tb, similarity, pasted=pasted)
        out.append((pair, x))
    return out


def fit(x: np.ndarray, y: np.ndarray):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=5000)).fit(x, y)


def leave_one_topic_out(candidates: list, extra: list, topics: list[str]) -> dict[int, float]:
    """Each topic's pairs scored by a model fitted on the other topics' (and their extra rows)."""
    held_out: dict[int, float] = {}
    for topic in topics:
        test = [(p, x) for p, x in candidates if p["domain"] == topic]
        if test:
            model = fit_rows([(p, x) for p, x in candidates + extra if p["domain"] != topic])
            scores = model.predict_proba(np.array([x for _, x in test]))[:, 1]
            held_out.update({id(p): float(s) for (p, _), s in zip(test, scores, strict=True)})
    return held_out


def lowest_within(scored: list[tuple[bool, float]], served, target: float) -> float:
    """The lowest of the scores at which the pairs `served(cut)` marks keep their wrong share within
    target (1.0 if none does)."""
    best = 1.0
    for cut in sorted({score for _, score in scored}, reverse=True):
        hit = [same for (same, _), chosen in zip(scored, served(cut), strict=True) if chosen]
        if hit and (len(hit) - sum(hit)) / len(hit) <= target:
            best = cut
    return best


def fit_rows(rows: list):
    return fit(np.array([x for _, x in rows]), np.array([p["same"] for p, _ in rows]))


def coefficients(model, names: list[str], threshold: float) -> dict:
    scaler, regression = model[0], model[1]
    return {
        "features": names,
        "mean": scaler.mean_.round(6).tolist(),
        "scale": scaler.scale_.round(6).tolist(),
        "coef": regression.coef_[0].round(6).tolist(),
        "intercept": round(float(regression.intercept_[0]), 6),
        "threshold": round(threshold, 6),
    }


class Command(BaseCommand):
    help = "Train the semantic cache verifier's pair model; choose its threshold by leave-one-topic-out validation."

    def add_arguments(self, parser):
        parser.add_argument("--target", type=float, default=0.01, help="Largest share of wrong hits (default 0.01).")
        parser.add_argument("--out", type=Path, default=WEIGHTS)

    def handle(self, *args, target: float, out: Path, **options):
        from gateway.cache.embedder import Embedder

        pairs = labeled_pairs()
        reworded = reworded_negatives(pairs)
        embedder = Embedder(cache_dir=settings.DATA_DIR / "models", threads=settings.EMBEDDER_THREADS)
        vectors = prompt_vectors(pairs + reworded, embedder)
        rows = rows_for(pairs, vectors)
        lexical = [(p, x) for p, x in rows if x is not None]
        lexical_extra = [(p, x) for p, x in rows_for(reworded, vectors) if x is not None]
        topics = sorted({p["domain"] for p, _ in rows})

        # The pair model: the lowest threshold whose held-out hits stay within the target.
        words = leave_one_topic_out(lexical, lexical_extra, topics)
        threshold = lowest_within(
            [(p["same"], words[id(p)]) for p, _ in lexical],
            lambda cut: [words[id(p)] >= cut for p, _ in lexical],
            target,
        )
        report = self.report(rows, {id(p): words[id(p)] >= threshold for p, _ in lexical}, topics)

        weights = {
            **coefficients(fit_rows(lexical + lexical_extra), list(features.NAMES), threshold),
            "trained_on": [*SOURCES, "reworded hard negatives built from them (reworded_negatives)"],
            "target_wrong_hit_share": target,
            "leave_one_topic_out": report,
        }
        out.write_text(json.dumps(weights, indent=1) + "\n", "utf-8")
        self.stdout.write(json.dumps({"threshold": weights["threshold"], **report["total"]}))

    def report(self, rows, hits: dict[int, bool], topics: list[str]) -> dict:
        per: dict[str, Counter] = {topic: Counter() for topic in topics}
        for pair, _ in rows:
            hit = hits.get(id(pair), False)
            counts = per[pair["domain"]]
            counts["paraphrases"] += pair["same"]
            counts["recalled"] += hit and pair["same"]
            counts["hits"] += hit
            counts["wrong"] += hit and not pair["same"]
        self.stdout.write(f"{'held-out topic':<18}{'paraphrases':>12}{'recalled':>10}{'hits':>7}{'wrong':>7}")
        total: Counter = Counter()
        for topic, counts in per.items():
            total += counts
            self.stdout.write(
                f"{topic:<18}{counts['paraphrases']:>12}{counts['recalled']:>10}{counts['hits']:>7}{counts['wrong']:>7}"
            )
        summary = {
            "recall": round(total["recalled"] / max(total["paraphrases"], 1), 4),
            "wrong_hit_share": round(total["wrong"] / max(total["hits"], 1), 4),
            "paraphrases": total["paraphrases"],
            "hits": total["hits"],
            "wrong": total["wrong"],
        }
        return {"total": summary, "topics": {t: dict(c) for t, c in per.items()}}
