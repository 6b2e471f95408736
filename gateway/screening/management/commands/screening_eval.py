"""Precision and recall of each local screening check on a labeled set. The last line printed is
JSON: {"examples": N, "region": "US", "checks": {check: {"precision", "recall", "tp", "fp", "fn"}}}."""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from gateway.cache.engine import shared_embedder
from gateway.screening.evaluation import CHECKS, by_kind, evaluate, load_for_command


class Command(BaseCommand):
    help = "Precision and recall of the local screening checks on labeled prompts (JSONL: text, labels, kind)."

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument("--region", default="US", help="Phone region, as a tenant's policy sets it.")
        parser.add_argument("--show-errors", action="store_true", help="List false positives and misses.")

    def handle(self, *args, file: Path, region: str, show_errors: bool, **options):
        examples = load_for_command(file)
        if settings.INJECTION_SECOND_LOOK:
            # As a web process does at start: the injection check's second look needs the embedder.
            shared_embedder()
        scores, outcomes = evaluate(examples, region=region)
        self.stdout.write(
            f"{'check':<14}{'labeled':>9}{'fired':>7}{'TP':>5}{'FP':>5}{'FN':>5}{'precision':>11}{'recall':>8}"
        )
        for check in CHECKS:
            s = scores[check]
            counts = f"{s.tp + s.fn:>9}{s.tp + s.fp:>7}{s.tp:>5}{s.fp:>5}{s.fn:>5}"
            self.stdout.write(f"{check:<14}{counts}{s.precision:>11.3f}{s.recall:>8.3f}")
        self.stdout.write(f"\n{'kind':<16}{'examples':>9}{'exactly right':>15}")
        for kind, counts in sorted(by_kind(outcomes).items()):
            self.stdout.write(f"{kind:<16}{counts['examples']:>9}{counts['exact']:>15}")
        if show_errors:
            for outcome in outcomes:
                labels = set(outcome.example["labels"])
                for check in sorted(outcome.fired - labels):
                    self.stdout.write(f"FP {check}: {outcome.example['text'][:160]!r}")
                for check in sorted(labels - outcome.fired):
                    self.stdout.write(f"FN {check}: {outcome.example['text'][:160]!r}")
        self.stdout.write(
            json.dumps(
                {
                    "examples": len(examples),
                    "region": region,
                    "checks": {
                        check: {
                            "precision": round(s.precision, 4),
                            "recall": round(s.recall, 4),
                            "tp": s.tp,
                            "fp": s.fp,
                            "fn": s.fn,
                        }
                        for check, s in scores.items()
                    },
                }
            )
        )
