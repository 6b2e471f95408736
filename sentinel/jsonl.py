"""Labeled sets for the evaluation commands (cache_eval, route_eval): JSONL files, one object a line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from django.core.management.base import CommandError


def read_jsonl(path: Path, *, valid: Callable[[dict], bool], expected: str, what: str) -> list[dict]:
    """The objects of a JSONL file, blank lines skipped. A line that is not JSON, or an object that is
    not `valid` (a missing member may raise KeyError or TypeError), is a CommandError naming the file,
    the line and what was `expected`; so is a file with none (`what` names them)."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not valid(row):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise CommandError(f"{path}:{number}: expected {expected}") from None
        rows.append(row)
    if not rows:
        raise CommandError(f"{path}: no {what}")
    return rows
