"""What the checks report, and how they match phrases fast.

Span: a finding of a check, which check and where in the text (never the text itself).

lowered(): a phrase pattern written for re.IGNORECASE, compiled to run on the lowercased text
instead. Python's engine skips ahead to a pattern's possible first characters only without
IGNORECASE, so the same search over a long prompt is about three times faster (the injection and
moderation phrases, 0.4 -> 0.14 ms each on 4,000 characters).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from types import ModuleType


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


class Prefilter:
    """Which of many patterns can match a text, found in one pass over it by Hyperscan instead of
        one pass per pattern: Python's engine scans 4,000 characters in 50-200 microseconds a pattern,
        Hyperscan scans them for all of them at once in a few. Each pattern is compiled in Hyperscan's
        prefilter mode, as a superset of itself (lookarounds and back-references relaxed), so a pattern it
        rules out cannot match; one it lets through is then run by Python's engine as before, so the
        findings are the same. Compiling the four checks' patterns takes about 2 s of CPU, in a thread
        that leaves the GIL (a thread ticking every 5 ms beside it saw a longest gap of 9 ms on a quiet
    host, up to 100 ms at load 5, the scheduler's).

        Only ASCII texts of MIN_CHARS or more are prefiltered (there Python's \\w, \\d, \b and
        case-folding agree with Hyperscan's byte mode; a short text costs Python's engine little). Other
        texts, a pattern Hyperscan cannot compile, or Hyperscan not installed (a binary wheel: x86-64 and
        arm64 Linux and macOS) leave every such pattern in. The database is compiled in a thread of its
        own when the process first meets such a text (or when asked: engine.compile_prefilters); until
        it is ready every pattern is run, so no request waits for it."""

    MIN_CHARS = 1_000  # as engine.INLINE_CHARS: a text this long is screened off the event loop

    def __init__(self, patterns: list[re.Pattern | Phrase]) -> None:
        self.patterns = [pattern.pattern if isinstance(pattern, Phrase) else pattern for pattern in patterns]
        self.count = len(patterns)
        self._everything: frozenset[int] = frozenset(range(self.count))
        self._always: frozenset[int] = self._everything
        self._database = None
        self._compiling: int | None = None  # the process that started compiling (a fork starts again)
        self._compiled = threading.Event()
        self._lock = threading.Lock()
        self._local = threading.local()

    def compile(self, timeout: float | None = None) -> bool:
        """Compile the database now, or wait for the compiling under way; whether it is ready (False
        also where Hyperscan is not installed or compiled nothing)."""
        self._start()
        self._compiled.wait(timeout)
        return self._database is not None

    def _start(self) -> None:
        with self._lock:
            if self._compiling == os.getpid():
                return
            self._compiling = os.getpid()
            self._compiled.clear()
        threading.Thread(target=self._compile_once, name="hyperscan-prefilter", daemon=True).start()

    def _compile_once(self) -> None:
        try:
            self._compile()
        finally:
            self._compiled.set()

    def _compile(self) -> None:
        try:
            import hyperscan
        except ImportError:
            return
        expressions = []
        for index, regex in enumerate(self.patterns):
            flags = hyperscan.HS_FLAG_PREFILTER | hyperscan.HS_FLAG_SINGLEMATCH | hyperscan.HS_FLAG_ALLOWEMPTY
            if regex.flags & re.IGNORECASE:
                flags |= hyperscan.HS_FLAG_CASELESS
            if regex.flags & re.DOTALL:
                flags |= hyperscan.HS_FLAG_DOTALL
            if regex.flags & re.MULTILINE:
                flags |= hyperscan.HS_FLAG_MULTILINE
            try:
                # Python's \v is one character, PCRE's a class of them.
                source = regex.pattern.replace("\\v", "\\x0b").encode()
            except UnicodeEncodeError:
                continue  # a lone surrogate in a pattern: it stays in
            expressions.append((source, index, flags))
        database = _database(hyperscan, expressions)
        if database is None:  # one of them does not compile: keep those that do, one by one
            expressions = [e for e in expressions if _database(hyperscan, [e]) is not None]
            database = _database(hyperscan, expressions)
        if database is not None:
            self._always = self._everything - {index for _, index, _ in expressions}
            self._hyperscan = hyperscan
            self._database = database  # last: candidates() reads the others once it sees this

    def candidates(self, text: str) -> frozenset[int] | set[int]:
        """Indexes of the patterns that may match `text` (all of them when it cannot tell)."""
        if len(text) < self.MIN_CHARS or not text.isascii():
            return self._everything
        database = self._database
        if database is None:
            if self._compiling != os.getpid():
                self._start()
            return self._everything
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:  # a scratch space per thread: the screening pool scans concurrently
            scratch = self._local.scratch = self._hyperscan.Scratch(database)
        found = set(self._always)
        database.scan(text.encode(), match_event_handler=_collect, context=found, scratch=scratch)
        return found


def _database(hyperscan: ModuleType, expressions: list[tuple[bytes, int, int]]) -> object | None:
    if not expressions:
        return None
    database = hyperscan.Database()
    try:
        database.compile(
            expressions=[e[0] for e in expressions],
            ids=[e[1] for e in expressions],
            elements=len(expressions),
            flags=[e[2] for e in expressions],
        )
    except hyperscan.error:
        return None
    return database


def _collect(index: int, start: int, end: int, flags: int, found: set[int]) -> None:
    found.add(index)
