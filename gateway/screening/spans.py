"""A finding of a screening check: which check, and where in the text (never the text itself)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    check: str
    start: int
    end: int
