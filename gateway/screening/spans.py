"""What the checks report, and how they match phrases fast.

Span: a finding of a check, which check and where in the text (never the text itself).

lowered(): a phrase pattern written for re.IGNORECASE, compiled to run on the lowercased text
instead. Python's engine skips ahead to a pattern's possible first characters only without
IGNORECASE, so the same search over a long prompt is about three times faster (the injection and
moderation phrases, 0.4 -> 0.14 ms each on 4,000 characters).
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from re import _constants as sre
from re import _parser as sre_parse
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
    # Every match begins with one of these (None: the pattern's start is not such a set).
    starts: tuple[str, ...] | None = None

    def finditer(self, text: str):
        for match in self.pattern.finditer(text) if self.starts is None else self._from_starts(text):
            start = match.start()
            if not self.word_start or start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_"):
                yield match

    def search(self, text: str) -> re.Match | None:
        return next(self.finditer(text), None)

    def _from_starts(self, text: str) -> Iterator[re.Match]:
        """pattern.finditer(text), tried only where one of `starts` is (found by str.find): Python's
        engine tries a pattern that opens with an alternation at every position of the text whose
        character could begin it (0.1-0.4 ms over 4,000 characters), and the finds take microseconds.
        A match is tried at each such position in order, past the end of the last match, as finditer
        does."""
        positions = set()
        for start in self.starts or ():
            at = text.find(start)
            while at >= 0:
                positions.add(at)
                at = text.find(start, at + 1)
        if len(positions) > len(text) // _DENSEST_STARTS:  # a start at every few characters: the engine is quicker
            yield from self.pattern.finditer(text)
            return
        resume = 0
        for at in sorted(positions):
            if at >= resume and (match := self.pattern.match(text, at)) is not None:
                resume = max(match.end(), at + 1)
                yield match


# Past one start of a phrase in this many characters, a phrase is searched for by the engine (a
# Python-level try costs about five of the engine's own).
_DENSEST_STARTS = 8


def _leading(items: list) -> list[str] | None:
    """The literal strings a parsed pattern's matches can begin with: its literal characters up to
    the first item that is not one, through groups and alternatives at that point; zero-width
    assertions before the first character are passed over. None when one alternative cannot say."""
    found = [""]
    for op, av in items:
        if op is sre.LITERAL:
            found = [prefix + chr(av) for prefix in found]
            continue
        if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT) and found == [""]:
            continue  # a \b, lookahead or lookbehind before anything is read
        if op is sre.SUBPATTERN and not av[1] & re.IGNORECASE:
            inner = _leading(list(av[3]))
        elif op is sre.BRANCH:
            branches = [_leading(list(branch)) for branch in av[1]]
            inner = None if not all(branches) else [prefix for branch in branches for prefix in branch]
        else:
            break
        # What follows a group is not added: its alternatives may end in different places.
        return None if inner is None else [prefix + more for prefix in found for more in inner]
    return found


def leading_literals(pattern: re.Pattern) -> tuple[str, ...] | None:
    """Strings of two characters or more one of which every match of `pattern` (case-sensitive)
    begins with, or None when its start is not such a set."""
    if pattern.flags & re.IGNORECASE:
        return None
    try:
        found = _leading(list(sre_parse.parse(pattern.pattern, pattern.flags)))
    except re.error:
        return None
    if not found or min(map(len, found)) < 2:  # one letter begins too many words to be worth it
        return None
    return tuple(sorted(set(found)))


def lowered(source: str) -> Phrase:
    """`source` with its literal letters lowercased (an escape such as \\S or \\W keeps its case),
    compiled without IGNORECASE: it matches lowercased text as `source` with IGNORECASE matches the
    original."""
    word_start = source.startswith("\\b")
    out, escaped = [], False
    for char in source[2:] if word_start else source:
        out.append(char if escaped else char.lower())
        escaped = not escaped and char == "\\"
    pattern = re.compile("".join(out))
    return Phrase(pattern, word_start, leading_literals(pattern))


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

        Every text is prefiltered, however short: a short prompt's forty-odd patterns cost Python's
        engine more than one Hyperscan pass (short prompts 0.28 -> 0.20 ms, a conversation of clean
        turns under 1,000 characters each 4.0 -> 2.0 ms, when only texts of 1,000 characters or more
        were). In ASCII, Python's \\w, \\d, \b and case-folding agree with Hyperscan's byte mode, and
        a text that is not ASCII is scanned as its stand-in (below). A pattern Hyperscan cannot
        compile, or Hyperscan not installed (a binary wheel: x86-64 and arm64 Linux and macOS) leave
        every such pattern in. The database is compiled in a thread of its own when the process first
        meets a text (or when asked: engine.compile_prefilters); until it is ready every pattern is
        run, so no request waits for it.

        A pattern whose matches are at most some characters long is also told where it can match
        (Scan.finditer): Hyperscan reports where each match of its superset ends, and Python's
        engine then searches only the few characters before those ends instead of the whole text.

        A text that is not ASCII is scanned as an ASCII stand-in of the same length (STAND_IN: a
        space for a space, 0 for a digit, a letter for a letter, \\x01 for any other character),
        which every pattern's character classes match wherever they match the original, so
        Hyperscan still sees every match; a pattern with a character beyond ASCII in it is always
        run, over the whole text."""

    MIN_CHARS = 0  # texts shorter than this are not prefiltered (the tests raise it to compare)

    def __init__(self, patterns: list[re.Pattern | Phrase]) -> None:
        self.patterns = [pattern.pattern if isinstance(pattern, Phrase) else pattern for pattern in patterns]
        self.count = len(patterns)
        self._everything: frozenset[int] = frozenset(range(self.count))
        self._always: frozenset[int] = self._everything
        # Patterns with a character beyond ASCII: the stand-in of a text has none, so they always run.
        self._beyond_ascii = frozenset(i for i, regex in enumerate(self.patterns) if not regex.pattern.isascii())
        self._windowed = frozenset(i for i, regex in enumerate(self.patterns) if window(regex) is not None)
        self._reported = self._windowed  # those whose ends the database reports (all it compiled)
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
            flags = hyperscan.HS_FLAG_PREFILTER | hyperscan.HS_FLAG_ALLOWEMPTY
            if index not in self._windowed:  # where its matches end is of no use: one report is enough
                flags |= hyperscan.HS_FLAG_SINGLEMATCH
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
            self._reported = self._windowed - self._always
            self._hyperscan = hyperscan
            self._database = database  # last: candidates() reads the others once it sees this

    def candidates(self, text: str) -> frozenset[int] | set[int]:
        """Indexes of the patterns that may match `text` (all of them when it cannot tell)."""
        return self.scan(text).candidates

    def scan(self, text: str) -> Scan:
        """Which patterns may match `text` and where (everything, everywhere, when it cannot tell)."""
        if len(text) < self.MIN_CHARS:
            return Scan(self._everything, None)
        database = self._database
        if database is None:
            if self._compiling != os.getpid():
                self._start()
            return Scan(self._everything, None)
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:  # a scratch space per thread: the screening pool scans concurrently
            scratch = self._local.scratch = self._hyperscan.Scratch(database)
        scanned = _stand_in_of(text)
        if scanned is None:
            scanned = text.encode()
            found = set(self._always)
            ends: dict[int, list[int]] = {index: [] for index in self._reported}
        else:
            found = set(self._always | self._beyond_ascii)
            ends = {index: [] for index in self._reported - self._beyond_ascii}
        database.scan(scanned, match_event_handler=_collect, context=(found, ends), scratch=scratch)
        return Scan(found, ends)


class Scan:
    """What one Hyperscan pass found in a text: `candidates`, the patterns that may match, and for
    those with a bounded window, where their matches can end."""

    __slots__ = ("_ends", "candidates")

    def __init__(self, candidates: frozenset[int] | set[int], ends: dict[int, list[int]] | None) -> None:
        self.candidates = candidates
        self._ends = ends

    def __contains__(self, index: int) -> bool:
        return index in self.candidates

    def finditer(self, index: int, pattern: re.Pattern, text: str) -> Iterator[re.Match]:
        """pattern.finditer(text), the same matches, searched for only where Hyperscan saw pattern
        `index` of the prefilter end (`pattern` is that pattern, or its lowered twin run on the
        lowercased text)."""
        ends = self._ends.get(index) if self._ends is not None else None
        bounds = window(pattern) if ends is not None else None
        if ends is None or bounds is None:
            return pattern.finditer(text)
        return _finditer_near(pattern, text, ends, bounds)


@functools.cache
def window(pattern: re.Pattern) -> tuple[int, int, int] | None:
    """(longest, shortest, reach) of a pattern's matches, or None when not bounded: a match is
    `shortest` to `longest` characters long, and trying it at a position reads no character
    `reach` or more past it (lookaheads included; lookbehinds read before it)."""
    try:
        parsed = sre_parse.parse(pattern.pattern, pattern.flags)
    except re.error:
        return None
    shortest, longest = parsed.getwidth()
    reach = _reach(parsed)
    if shortest == 0 or longest >= sre.MAXREPEAT or reach is None:
        return None
    return longest, shortest, reach + 1


def _reach(items) -> int | None:
    """How far past its start a part of a pattern can read, at most (None: unbounded). Each item is
    counted as if it were read after the one before, lookaheads too: an overestimate, never less."""
    total = 0
    for op, av in items:
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN, sre.AT):
            reach = 1
        elif op is sre.BRANCH:
            branches = [_reach(branch) for branch in av[1]]
            reach = None if None in branches else max(b for b in branches if b is not None)
        elif op is sre.SUBPATTERN:
            reach = _reach(av[3])
        elif op is sre.ATOMIC_GROUP:
            reach = _reach(av)
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            _, most, item = av
            inner = _reach(item)
            reach = None if inner is None or most >= sre.MAXREPEAT else inner * most
        elif op in (sre.ASSERT, sre.ASSERT_NOT):
            direction, item = av
            reach = _reach(item) if direction == 1 else 0  # a lookbehind reads before where it stands
        else:  # a back-reference, a conditional: not bounded here
            return None
        if reach is None:
            return None
        total += reach
    return total


def _finditer_near(pattern: re.Pattern, text: str, ends: list[int], bounds: tuple[int, int, int]) -> Iterator[re.Match]:
    """pattern.finditer(text) where every match ends at one of `ends`. A match ending at e starts in
    [e - longest, e - shortest]; those ranges, merged, are searched in turn, each up to `reach` past
    its last start, so every attempt at a start in the range reads only what it would read in the
    whole text (a lookbehind reads before the search's start: Python's engine sees the whole string).
    A match found past a range's last start is not trusted: no match of the whole text starts there."""
    longest, shortest, reach = bounds
    length = len(text)
    position = 0
    ends.sort()
    index, count = 0, len(ends)
    while index < count:
        first, last = ends[index] - longest, ends[index] - shortest
        index += 1
        while index < count and ends[index] - longest <= last + 1:
            last = ends[index] - shortest
            index += 1
        start = max(first, position)
        while start <= last:
            match = pattern.search(text, start, min(length, last + reach))
            if match is None or match.start() > last:
                break
            yield match
            position = start = match.end()


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


class Literals:
    """Which groups of literal strings occur in a text, found in one Hyperscan pass over its UTF-8
    bytes (a string's bytes occur in a text's bytes exactly where the string occurs in the text: UTF-8
    never starts a character inside another's bytes) instead of one str.find a string: 5
    microseconds for fifty-six strings in 4,000 characters, where the finds take 70 (145 in a text
    with characters beyond Latin-1). The database is compiled on first use (2 ms); without Hyperscan
    the strings are looked for one by one."""

    def __init__(self, groups: list[tuple[str, ...]]) -> None:
        self.groups = groups
        self._database: object | None = None
        self._compiled = False
        self._lock = threading.Lock()
        self._local = threading.local()

    def present(self, text: str) -> set[int]:
        """Indexes of the groups with a string in `text`."""
        database = self._compiled_database()
        if database is None:
            return {index for index, group in enumerate(self.groups) if any(string in text for string in group)}
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:  # a scratch space per thread, as Prefilter's
            scratch = self._local.scratch = self._hyperscan.Scratch(database)
        found: set[int] = set()
        database.scan(
            text.encode("utf-8", "surrogatepass"), match_event_handler=_note_group, context=found, scratch=scratch
        )
        return found

    def compile(self) -> bool:
        """Compile the database now (engine.compile_prefilters); whether there is one."""
        return self._compiled_database() is not None

    def _compiled_database(self) -> object | None:
        if self._compiled:
            return self._database
        with self._lock:
            if not self._compiled:
                try:
                    import hyperscan
                except ImportError:
                    hyperscan = None
                if hyperscan is not None:
                    self._hyperscan = hyperscan
                    flags = hyperscan.HS_FLAG_SINGLEMATCH
                    literals = [
                        (re.escape(string).encode(), index, flags)
                        for index, group in enumerate(self.groups)
                        for string in group
                    ]
                    self._database = _database(hyperscan, literals)
                self._compiled = True
        return self._database


def _note_group(index: int, start: int, end: int, flags: int, found: set[int]) -> None:
    found.add(index)


def _collect(index: int, start: int, end: int, flags: int, context: tuple[set[int], dict[int, list[int]]]) -> None:
    found, ends = context
    found.add(index)
    at = ends.get(index)
    if at is not None:
        at.append(end)


class _StandIn(dict):
    """str.translate's table for STAND_IN, filled in as characters are met."""

    def __missing__(self, code: int) -> int:
        char = chr(code)
        if char.isspace():  # Python's \s
            value = " "
        elif char.isdecimal():  # Python's \d
            value = "0"
        elif char.isalnum():  # Python's \w: the ASCII letter it matches ignoring case (K for the Kelvin sign), or a
            value = next((letter for letter in _LETTERS if _CASELESS[letter].fullmatch(char)), "a")
        else:
            value = "\x01"
        if len(self) < _STAND_IN_REMEMBERED:  # a text of every code point must not grow it without end
            self[code] = ord(value)
        return ord(value)


def stand_in(text: str) -> bytes | None:
    """The ASCII stand-in of a text that is not plain ASCII (see Prefilter), or None for one that is.
    About 25 microseconds for 4,000 characters with a few accented words: made once for the four
    checks' prefilters while the text is being read (see reading)."""
    if text.isascii() and not _ODD_SPACES.search(text):
        return None
    return text.encode("ascii", "sentinel-stand-in").translate(_ODD_SPACES_TO_SPACE)


def _stand_in_error(error: UnicodeError) -> tuple[str, int]:
    # The encoder runs in C over ASCII and calls this for each run of other characters.
    assert isinstance(error, UnicodeEncodeError)
    return error.object[error.start : error.end].translate(STAND_IN), error.end


codecs.register_error("sentinel-stand-in", _stand_in_error)
_reading = threading.local()
_NOT_MADE = object()  # the stand-in not made yet (stand_in itself gives bytes or None)


@contextlib.contextmanager
def reading(text: str) -> Iterator[None]:
    """While the checks read `text`: its stand-in is made the first time a prefilter scans it and
    used by the others (each check has its own), and forgotten on the way out, so no text outlives
    its screening in memory. Per thread: the screening pool reads texts concurrently."""
    _reading.text, _reading.stand_in = text, _NOT_MADE
    try:
        yield
    finally:
        _reading.text = _reading.stand_in = None


def _stand_in_of(text: str) -> bytes | None:
    if getattr(_reading, "text", None) is not text:
        return stand_in(text)
    if _reading.stand_in is _NOT_MADE:
        _reading.stand_in = stand_in(text)
    return _reading.stand_in


_ODD_SPACES = re.compile(r"[\x1c-\x1f]")  # in Python's \s, not in Hyperscan's
_ODD_SPACES_TO_SPACE = bytes.maketrans(b"\x1c\x1d\x1e\x1f", b"    ")
_STAND_IN_REMEMBERED = 20_000
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_CASELESS = {letter: re.compile(letter, re.IGNORECASE) for letter in _LETTERS}
# A non-ASCII text's stand-in for Hyperscan, character for character (see Prefilter).
STAND_IN = _StandIn()
