"""Precision and recall of the local checks on a labeled set (JSONL: text, labels, kind), through
the same function the request path screens each text with."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from gateway.screening.engine import check_of, local_spans
from gateway.screening.personal_data import KINDS
from gateway.screening.policy import INJECTION, MODERATION

CHECKS = (*KINDS, INJECTION, MODERATION)


class LabeledSetError(ValueError):
    pass


def load(path: Path) -> list[dict]:
    examples = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
            if not isinstance(example["text"], str) or not isinstance(example["labels"], list):
                raise TypeError
            unknown = set(example["labels"]) - set(CHECKS)
            if unknown:
                raise LabeledSetError(f"{path}:{number}: unknown check {sorted(unknown)[0]!r}")
        except (ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, LabeledSetError):
                raise
            raise LabeledSetError(
                f"{path}:{number}: expected {{'text': str, 'labels': [check, ...], 'kind': str}}"
            ) from None
        examples.append(example)
    if not examples:
        raise LabeledSetError(f"{path}: no examples")
    return examples


def load_for_command(path: Path) -> list[dict]:
    """load() as the management commands read their file: a missing file or a bad line is a
    CommandError naming the file (and the line)."""
    from django.core.management.base import CommandError

    if not path.exists():
        raise CommandError(f"{path}: no such file")
    try:
        return load(path)
    except LabeledSetError as exc:
        raise CommandError(str(exc)) from None


def fired(text: str, *, region: str = "US") -> set[str]:
    spans = local_spans(text, kinds=KINDS, injection_on=True, moderation_on=True, region=region)
    return {check_of(span) for span in spans}


@dataclass
class Outcome:
    example: dict
    fired: set[str]


@dataclass
class Scores:
    tp: int = 0
    fp: int = 0
    fn: int = 0

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0


def evaluate(examples: list[dict], *, region: str = "US") -> tuple[dict[str, Scores], list[Outcome]]:
    scores = {check: Scores() for check in CHECKS}
    outcomes = []
    for example in examples:
        found = fired(example["text"], region=region)
        outcomes.append(Outcome(example, found))
        labels = set(example["labels"])
        for check in CHECKS:
            if check in labels and check in found:
                scores[check].tp += 1
            elif check in found:
                scores[check].fp += 1
            elif check in labels:
                scores[check].fn += 1
    return scores, outcomes


def by_kind(outcomes: list[Outcome]) -> dict[str, Counter]:
    """Per kind of example: how many, and how many had exactly their labels fire."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for outcome in outcomes:
        kind = counts[outcome.example.get("kind", "?")]
        kind["examples"] += 1
        kind["exact"] += outcome.fired == set(outcome.example["labels"])
    return counts
