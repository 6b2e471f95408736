"""What the checks report, and how they match phrases fast.

Span: a finding of a check, which check and where in the text (never the text itself).

lowered(): a phrase pattern written for re.IGNORECASE, compiled to run on the lowercased text
instead. Python's engine skips ahead to a pattern's possible first characters only without
IGNORECASE, so the same search over a long prompt is about three times faster (the injection and
moderation phrases, 0.4 -> 0.14 ms each on 4,000 characters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    check: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Phrase:
    """A phrase pattern for lowercased text. A leading \\b is checked after the match instead of by
    the engine: an assertion first keeps the engine from skipping to the pattern's first letters."""

    pattern: re.Pattern
    word_start: bool

    def finditer(self, text: str):
        for match in self.pattern.finditer(text):
            start = match.start()
            if not self.word_start or start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_"):
                yield match

    def search(self, text: str) -> re.Match | None:
        return next(self.finditer(text), None)


def lowered(source: str) -> Phrase:
    """`source` with its literal letters lowercased (an escape such as \\S or \\W keeps its case),
    compiled without IGNORECASE: it matches lowercased text as `source` with IGNORECASE matches the
    original."""
    word_start = source.startswith("\\b")
    out, escaped = [], False
    for char in source[2:] if word_start else source:
        out.append(char if escaped else char.lower())
        escaped = not escaped and char == "\\"
    return Phrase(re.compile("".join(out)), word_start)


def lowercase(text: str) -> str | None:
    """The text lowercased, or None when lowercasing moves positions (a few characters, such as
    "İ", lowercase to two): then the IGNORECASE patterns run on the original instead."""
    folded = text.lower()
    return folded if len(folded) == len(text) else None
