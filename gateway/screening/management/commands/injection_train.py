"""Train the prompt-injection model (gateway.screening.injection_model) from a labeled set (JSONL:
text, labels; "injection" in labels or not) and write its weights to injection_model.json.

The threshold is chosen from 5-fold cross-validated scores: the lowest at which the benign texts'
false-positive rate stays at or under --max-false-positives. Prints the cross-validated precision
and recall at that threshold; the last line is JSON."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand

from gateway.screening.evaluation import load_for_command
from gateway.screening.injection_model import WEIGHTS, features


class Command(BaseCommand):
    help = "Train the prompt-injection classifier from labeled texts and write its weights."

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument("--out", type=Path, default=WEIGHTS)
        parser.add_argument("--c", type=float, default=3.0, help="Inverse regularization strength.")
        parser.add_argument("--max-false-positives", type=float, default=0.01)

    def handle(self, *args, file: Path, out: Path, c: float, max_false_positives: float, **options):
        import numpy as np
        from sklearn.feature_extraction import DictVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import StratifiedKFold, cross_val_predict

        examples = load_for_command(file)
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
        classifier.fit(x, y)
        weights = {
            name: round(float(weight), 5)
            for name, weight in zip(vectorizer.get_feature_names_out(), classifier.coef_[0], strict=True)
            if abs(weight) >= 1e-4
        }
        out.write_text(
            json.dumps(
                {
                    "trained_on": file.name,
                    "examples": len(examples),
                    "bias": round(float(classifier.intercept_[0]), 5),
                    "threshold": round(threshold, 5),
                    "weights": dict(sorted(weights.items())),
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
        }
        self.stdout.write(f"wrote {out} ({len(weights)} weights)")
        self.stdout.write(json.dumps(figures))
