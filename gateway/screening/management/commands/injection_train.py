"""Train the prompt-injection model (gateway.screening.injection_model) from labeled sets (JSONL:
text, labels; "injection" in labels or not; by default TRAINING_SETS, the shipped weights' own) and
write its weights to injection_model.json.

The threshold is chosen from 5-fold cross-validated scores: the lowest at which the benign texts'
false-positive rate stays at or under --max-false-positives. The second look (a logistic regression
over a text's MiniLM embedding and the word model's logit, for texts within --band of the threshold)
is trained on the cross-validated logits, so it learns where the word model errs on texts it did not
see. Prints the cross-validated precision and recall at that threshold, without and with the second
look; the last line is JSON."""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from gateway.screening.evaluation import load_for_command
from gateway.screening.injection_model import WEIGHTS, features, second_look_features

# The texts the shipped weights are trained on (under the project's folder): the training set, and the
# sets that were held out until 2026-12-07 (docs/screening.md says how each was written and measured
# before it was trained on).
TRAINING_SETS = (
    "tests/data/injection_train.jsonl",
    *(f"tests/data/injection_holdout_{name}.jsonl" for name in "cdefghijk"),
)


class Command(BaseCommand):
    help = "Train the prompt-injection classifier from labeled texts and write its weights."

    def add_arguments(self, parser):
        parser.add_argument("files", type=Path, nargs="*", help="JSONL files (default: TRAINING_SETS)")
        parser.add_argument("--out", type=Path, default=WEIGHTS)
        parser.add_argument("--c", type=float, default=3.0, help="Inverse regularization strength.")
        parser.add_argument("--max-false-positives", type=float, default=0.01)
        parser.add_argument("--band", type=float, default=2.0, help="Second look: logits under the threshold.")
        parser.add_argument("--second-c", type=float, default=3.0, help="Second look: inverse regularization.")
        parser.add_argument("--second-threshold", type=float, default=0.8, help="Second look: its probability.")

    def handle(
        self,
        *args,
        files: list[Path],
        out: Path,
        c: float,
        max_false_positives: float,
        band: float,
        second_c: float,
        second_threshold: float,
        **options,
    ):
        import numpy as np
        from sklearn.feature_extraction import DictVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import StratifiedKFold, cross_val_predict

        files = files or [settings.BASE_DIR / source for source in TRAINING_SETS]
        examples = [example for file in files for example in load_for_command(file)]
        y = np.array([int("injection" in e["labels"]) for e in examples])
        vectorizer = DictVectorizer()
        x = vectorizer.fit_transform([features(e["text"]) for e in examples])
        classifier = LogisticRegression(C=c, class_weight="balanced", max_iter=5000)
        folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=7)
        scores = cross_val_predict(classifier, x, y, cv=folds, method="predict_proba")[:, 1]
        benign = np.sort(scores[y == 0])
        allowed = int(max_false_positives * len(benign))
        threshold = float(max(0.5, benign[len(benign) - 1 - allowed] + 1e-6 if len(benign) else 0.5))
        predicted = scores >= threshold
        tp = int((predicted & (y == 1)).sum())
        fp = int((predicted & (y == 0)).sum())
        fn = int((~predicted & (y == 1)).sum())

        from gateway.cache.engine import shared_embedder

        clipped = np.clip(scores, 1e-9, 1 - 1e-9)
        logits = np.log(clipped / (1 - clipped))
        embeddings = _embedded(shared_embedder(), [e["text"] for e in examples])
        stacked = np.array([second_look_features(v, z) for v, z in zip(embeddings, logits, strict=True)])
        second = LogisticRegression(C=second_c, class_weight="balanced", max_iter=5000)
        looked = cross_val_predict(second, stacked, y, cv=folds, method="predict_proba")[:, 1]
        unsure = (logits >= np.log(threshold / (1 - threshold)) - band) & ~predicted
        with_look = predicted | (unsure & (looked >= second_threshold))
        second.fit(stacked, y)
        classifier.fit(x, y)
        weights = {
            name: round(float(weight), 5)
            for name, weight in zip(vectorizer.get_feature_names_out(), classifier.coef_[0], strict=True)
            if abs(weight) >= 1e-4
        }
        out.write_text(
            json.dumps(
                {
                    "trained_on": [file.name for file in files],
                    "examples": len(examples),
                    "bias": round(float(classifier.intercept_[0]), 5),
                    "threshold": round(threshold, 5),
                    "weights": dict(sorted(weights.items())),
                    "second_look": {
                        "band": band,
                        "threshold": second_threshold,
                        "bias": round(float(second.intercept_[0]), 5),
                        "weights": [round(float(w), 5) for w in second.coef_[0]],
                    },
                },
                ensure_ascii=False,
                indent=0,
            )
            + "\n"
        )
        figures = {
            "examples": len(examples),
            "features": len(weights),
            "threshold": round(threshold, 4),
            "cv_precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
            "cv_recall": round(tp / (tp + fn), 4) if tp + fn else 1.0,
            **{f"cv_{name}_with_second_look": value for name, value in _rates(with_look, y).items()},
            "in_band": int(unsure.sum()),
        }
        self.stdout.write(f"wrote {out} ({len(weights)} weights)")
        self.stdout.write(json.dumps(figures))


def _rates(predicted, y) -> dict[str, float]:
    tp = int((predicted & (y == 1)).sum())
    fp = int((predicted & (y == 0)).sum())
    fn = int((~predicted & (y == 1)).sum())
    return {
        "precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
        "recall": round(tp / (tp + fn), 4) if tp + fn else 1.0,
    }


def _embedded(embedder, texts: list[str]):
    """Embeddings of texts in batches of similar length (a batch is padded to its longest text)."""
    import numpy as np

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    vectors = np.zeros((len(texts), 384), dtype=np.float32)
    for start in range(0, len(order), 32):
        batch = order[start : start + 32]
        vectors[batch] = embedder.embed([texts[i] for i in batch])
    return vectors
