"""Personal data and secrets in text: where they are (spans), never what they are.

Libraries do the judging, a regular expression only proposes candidates:
- phone numbers: Google's libphonenumber (`phonenumbers`): valid in the tenant's region (or, right
  after a word such as "call" or "mobile", in another common region), or of a
  possible length when written with a country code; on digit runs only (its matcher over a whole
  long text costs milliseconds, over the few candidate runs microseconds);
- payment cards: `python-stdnum`'s Luhn check plus the card networks' prefixes and lengths;
- IBANs and national IDs: `python-stdnum` (country lengths, mod-97, each ID's own checksum): US SSN,
  Canadian SIN, Spanish DNI/NIE, Italian codice fiscale, French NIR, Brazilian CPF, Indian Aadhaar,
  Swedish personnummer; the UK National Insurance number has no checksum and no stdnum module, so it
  is a hand-written pattern with HMRC's prefix rules;
- IP addresses: the standard library's `ipaddress` (loopback, unspecified and netmasks are not data
  about anyone);
- secrets: gateway.screening.credentials (detect-secrets' detector and keyword rules, plus the
  formats of major providers it does not know), each masked whole;
- e-mail addresses: a hand-written pattern (validators such as email-validator check one address,
  they do not find addresses in text), which leaves out file names like icon@2x.png and SSH remotes
  like git@github.com:org/repo.

Installed and used: phonenumbers, python-stdnum, detect-secrets (all offline, pure Python).
Looked at and left out: Microsoft Presidio (its wheel read, not installed: the analyzer's default
configuration loads spaCy's en_core_web_lg, which spaCy downloads from GitHub, out of reach here,
and PyPI has only unofficial re-uploads; its pattern recognizers for these kinds add no checksum
stdnum lacks), scrubadub (unmaintained since 2023; regular expressions without checksums), llm-guard
(its scanners wrap Presidio and detect-secrets, and load Hugging Face models at run time).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import ipaddress
import itertools
import re
import string
import threading
from collections.abc import Iterator

import phonenumbers
from stdnum import iban, luhn
from stdnum.br import cpf
from stdnum.ca import sin
from stdnum.es import dni, nie
from stdnum.fr import nir
from stdnum.in_ import aadhaar
from stdnum.it import codicefiscale
from stdnum.se import personnummer
from stdnum.us import ssn

from gateway.screening import credentials
from gateway.screening.spans import Prefilter, Scan, Span, lowercase, lowered

EMAIL, PHONE, CARD, IBAN, NATIONAL_ID, IP_ADDRESS, SECRET = (
    "email",
    "phone",
    "payment_card",
    "iban",
    "national_id",
    "ip_address",
    "secret",
)
KINDS = (SECRET, CARD, IBAN, NATIONAL_ID, EMAIL, IP_ADDRESS, PHONE)  # also the order overlaps are settled in
_PRIORITY = {kind: rank for rank, kind in enumerate(KINDS)}


# Patterns that must not start inside a word begin with the character they consume and look behind
# it afterwards (`\d(?<![\w-]\d)` for `(?<![\w-])\d`, `sk-(?<!\wsk-)` for `\bsk-`): the same matches,
# but Python's engine can then skip ahead to the characters a match can start with instead of trying
# every position, 2 to 15 times faster on long text. Where the first character is optional, a
# lookahead for it (`(?=\d)`) does part of that.


# --- e-mail ------------------------------------------------------------------------------------

_EMAIL = re.compile(
    # Letters of any script (jürgen@müller.de, an internationalised domain), an apostrophe in the
    # local part (o'connor@...), a punycode top-level domain (xn--...).
    r"\w(?<![\w.%+-]\w)[\w.%+'-]{0,63}@(?:[^\W_](?:[\w-]{0,61}[^\W_])?\.)+"
    r"([^\W\d_]{2,24}|[Xx][Nn]--[A-Za-z0-9-]{1,59})(?![\w-]|\.\w|:[\w~/]|\()"
)
# Not top-level domains here but file extensions (icon@2x.png) and attributes in code (x@w.shape).
_NOT_TLD = frozenset(
    "png jpg jpeg gif svg webp ico bmp tif tiff css scss js jsx ts tsx md txt json yaml yml xml html htm lock toml ini"
    " cfg conf log csv pdf zip gz tar py rb go rs java kt swift php sh bat exe dll so dylib shape dtype".split()
)


# What an address's domain and top-level domain are made of: its match ends in the run of these after
# the "@", and its closing lookahead reads at most two characters past its end.
_DOMAIN_RUN = re.compile(r"[\w.-]*")
_LOCAL_PART = 64  # the local part's longest: \w and then up to 63 more


def _email_matches(text: str) -> Iterator[re.Match]:
    """_EMAIL.finditer(text), the same matches, searched for only around each "@": a match holds
    exactly one "@" (neither part can hold another), starts at most _LOCAL_PART characters before
    it and ends in the domain run after it, so a search from there to two past that run tries every
    start that could hold it and reads what it would in the whole text (a lookbehind reads before the
    search's start). A text of code with a few decorators no longer costs a search of every word."""
    position, length = 0, len(text)
    while (at := text.find("@", position)) >= 0:
        end = min(length, _DOMAIN_RUN.match(text, at + 1).end() + 2)
        match = _EMAIL.search(text, max(position, at - _LOCAL_PART), end)
        if match is None:
            position = at + 1
            continue
        yield match
        position = match.end()


def _emails(text: str, candidates: Scan) -> list[Span]:
    if "@" not in text or not _may_match(candidates, _EMAIL):
        return []
    return [Span(EMAIL, m.start(), m.end()) for m in _email_matches(text) if m.group(1).lower() not in _NOT_TLD]


# --- phone numbers -----------------------------------------------------------------------------

# A run that could be a phone number: optional +, then 7 to 15 digits with the usual separators.
_PHONE_RUN = re.compile(r"(?=[+(\d])(?<![\w.+/-])(?:\+|00)?\(?\d(?:[\d \-.()/]{5,22})\d(?![\w/]|\.\d|-\d)")
_VALID = phonenumbers.Leniency.VALID
_POSSIBLE = phonenumbers.Leniency.POSSIBLE
# A national number of another country (no country code) counts only with a word that says "phone"
# just before it: valid in some region is true of many order numbers and references.
_OTHER_REGIONS = ("GB", "AU", "CA", "IE", "NZ", "IN", "DE", "FR", "ES", "IT", "NL")
_PHONE_CUE = re.compile(
    r"\b(?:call|calls|calling|phone|phones|mobile|cell|tel|telephone|text|sms|whatsapp|reach|dial|ring|landline)\b"
    r"[^.\n]{0,30}$",
    re.IGNORECASE,
)


@functools.cache
def _national_lengths(region: str) -> frozenset[int]:
    """How many digits a national number of `region` can have, with or without its trunk prefix
    (libphonenumber's metadata): a digit run of another length cannot be valid there, and is not
    handed to the matcher (about 150 microseconds a run)."""
    metadata = phonenumbers.PhoneMetadata.metadata_for_region(region)
    if metadata is None or not metadata.general_desc.possible_length:
        return frozenset(range(4, 18))
    lengths = set(metadata.general_desc.possible_length)
    prefix = len(metadata.national_prefix or "")
    return frozenset(lengths | {length + prefix for length in lengths} | {length + 1 for length in lengths})


_NUMBER_TYPES = (
    "fixed_line", "mobile", "toll_free", "premium_rate", "shared_cost", "voip", "personal_number", "pager", "uan",
    "voicemail",
)  # fmt: skip


@functools.cache
def _any_valid(country_code: int) -> re.Pattern | None:
    """A national number valid in any region of `country_code` matches one of its regions' number
    type patterns (libphonenumber's metadata, which is_valid_number reads): their union, or None
    where the metadata has none to offer."""
    regions = phonenumbers.region_codes_for_country_code(country_code)
    metadata = [phonenumbers.PhoneMetadata.metadata_for_region(region) for region in regions if region != "001"]
    if not regions or "001" in regions:
        metadata.append(phonenumbers.PhoneMetadata.metadata_for_nongeo_region(country_code))
    patterns = set()
    for entry in metadata:
        if entry is None:
            return None
        for kind in _NUMBER_TYPES:
            description = getattr(entry, kind)
            if description is not None and description.national_number_pattern:
                patterns.add(description.national_number_pattern)
    return re.compile("|".join(f"(?:{pattern})" for pattern in sorted(patterns))) if patterns else None


def _never_valid(digits: str, region: str) -> bool:
    """Whether a run of digits alone (no separators: the matcher can find no shorter number inside
    it) cannot be a valid number of `region`'s plan: parsed as libphonenumber parses it, its national
    number matches no number type of any region of its country code. 20 microseconds where the
    matcher takes 70 (a timestamp, an order number, a test card number)."""
    try:
        number = phonenumbers.parse(digits, region)
    except phonenumbers.NumberParseException:
        return True
    pattern = _any_valid(number.country_code)
    return pattern is not None and pattern.fullmatch(phonenumbers.national_significant_number(number)) is None


_numbers_seen = threading.local()


@contextlib.contextmanager
def remembering_numbers(seen: dict | None = None) -> Iterator[None]:
    """Within (in this thread): what libphonenumber's matcher makes of a run of digits (the numbers'
    (start, end) in it, for a region and leniency) is kept in `seen` (a new dict if None) and read
    back from it. A streamed answer is screened again with each chunk, the text before it too
    (streaming.StreamScreen), and the matcher takes 0.1-0.4 ms a run: a netmask in an answer cost its
    stream 16 ms; a text that repeats a number (a hostile one: 7,000 netmasks cost 1.8 s) asks once.
    Inside another (a stream's screening of one text), the outer one is kept."""
    if getattr(_numbers_seen, "memo", None) is not None:
        yield
        return
    _numbers_seen.memo = {} if seen is None else seen
    try:
        yield
    finally:
        _numbers_seen.memo = None


def _numbers(candidate: str, region: str, leniency) -> list[tuple[int, int]]:
    """Where the matcher finds numbers in `candidate`: (start, end) of each."""
    seen = getattr(_numbers_seen, "memo", None)
    key = (candidate, region, leniency is _VALID)
    if seen is not None and (found := seen.get(key)) is not None:
        return found
    if leniency is _VALID and candidate.isdigit() and candidate.isascii() and _never_valid(candidate, region):
        found = []
    else:
        found = [(match.start, match.end) for match in phonenumbers.PhoneNumberMatcher(candidate, region, leniency)]
    if seen is not None:
        seen[key] = found
    return found


def _phones(text: str, region: str, found: list[Span], candidates: Scan) -> list[Span]:
    """Numbers valid in the tenant's region, and numbers written with a country code (+44 ..., 0044
    ...) whose length is possible there: the code is signal enough, and it spares an up-to-date
    number plan (new ranges, ranges reserved for fiction) from deciding."""
    spans = []
    if not _may_match(candidates, _PHONE_RUN):
        return spans
    claimed = _Claimed(found)
    for run in _finditer(candidates, _PHONE_RUN, text):
        digits = sum(c.isdigit() for c in run.group())
        if not 7 <= digits <= 15:
            continue
        if claimed.holds(run.start(), run.end()):
            continue  # inside a card number, IBAN, ...: a phone number there would lose the overlap anyway
        candidate, shift = run.group(), 0
        if candidate.startswith("00"):
            # 00 is the international prefix almost everywhere (the tenant's region may use another).
            candidate, shift = "+" + candidate[2:], 1
        leniency = _POSSIBLE if candidate.startswith("+") else _VALID
        if leniency is _VALID and digits not in _national_lengths(region):
            matches = []
        else:
            matches = _numbers(candidate, region, leniency)
        if not matches and leniency is _VALID and _PHONE_CUE.search(text[max(0, run.start() - 40) : run.start()]):
            for other in _OTHER_REGIONS:
                matches = _numbers(run.group(), other, _VALID)
                if matches:
                    break
        for match_start, match_end in matches:
            start = run.start() + (match_start + shift if match_start else 0)  # "+" stood for "00"
            spans.append(Span(PHONE, start, run.start() + shift + match_end))
    return spans


# --- payment cards -----------------------------------------------------------------------------

_CARD_RUN = re.compile(r"\d(?<![\w-]\d)(?:[ .-]?\d){11,18}(?![\w]|[-.]\d)")
# Dots are a separator only in the printed groups (4539.1488.0343.6467, Amex 3782.822463.10005), so a
# decimal number is not read as a card.
_DOTTED_CARD = re.compile(r"\d{4}(?:\.\d{4}){2,3}(?:\.\d{1,3})?|\d{4}\.\d{6}\.\d{4,5}")
# Card networks: number prefix and lengths (Visa, Mastercard 51-55 and 2221-2720, Amex, Diners,
# JCB, Discover, UnionPay, Maestro).
_CARD_NETWORKS = (
    (re.compile(r"4"), frozenset({13, 16, 19})),
    (re.compile(r"5[1-5]|2(?:2[2-9]|[3-6]\d|7[01]|720)"), frozenset({16})),
    (re.compile(r"3[47]"), frozenset({15})),
    (re.compile(r"30[0-5]|3[689]"), frozenset({14, 15, 16, 17, 18, 19})),
    (re.compile(r"35(?:2[89]|[3-8]\d)"), frozenset({16, 17, 18, 19})),
    (re.compile(r"6011|64[4-9]|65"), frozenset({16, 17, 18, 19})),
    (re.compile(r"62"), frozenset({16, 17, 18, 19})),
    (re.compile(r"5018|5020|5038|6304|6759|676[1-3]"), frozenset(range(12, 20))),
)


def _card_network_fits(digits: str) -> bool:
    return any(prefix.match(digits) and len(digits) in lengths for prefix, lengths in _CARD_NETWORKS)


def _cards(text: str, candidates: Scan) -> list[Span]:
    spans = []
    if not _may_match(candidates, _CARD_RUN):
        return spans
    for run in _finditer(candidates, _CARD_RUN, text):
        if "." in run.group() and not _DOTTED_CARD.fullmatch(run.group()):
            continue
        digits = re.sub(r"\D", "", run.group())
        if _card_network_fits(digits) and luhn.is_valid(digits):
            spans.append(Span(CARD, run.start(), run.end()))
    return spans


# --- IBANs -------------------------------------------------------------------------------------

_IBAN_RUN = re.compile(r"(?<![\w])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![\w])", re.IGNORECASE)
_IBAN_RUN_LOWER = lowered(_IBAN_RUN.pattern)


# Letters as the numbers ISO 7064's MOD 97-10 reads them (A = 10 ... Z = 35), either case.
_BASE36 = str.maketrans({letter: str(int(letter, 36)) for letter in string.ascii_letters})


def _may_be_iban(value: str) -> bool:
    """False when `value` (an IBAN run's prefix) fails the IBAN's checksum, found with one
    str.translate and one int: stdnum's iban.is_valid reads the checksum a character at a time and
    then the country's format, so a run's prefixes that swallowed the words after it cost 0.05 ms
    each there. True (ask stdnum) for anything this does not read as it would: a character other than
    an ASCII letter, digit or space."""
    compact = value.replace(" ", "")
    digits = (compact[4:] + compact[:4]).translate(_BASE36)
    if not (digits.isascii() and digits.isdigit()):
        return True
    return int(digits) % 97 == 1


def _ibans(text: str, candidates: Scan) -> list[Span]:
    spans: list[Span] = []
    if not _may_match(candidates, _IBAN_RUN):
        return spans
    folded = lowercase(text)
    if folded is not None:  # the lowered pattern, on the lowercased text (see spans.lowered)
        runs = _finditer(candidates, _IBAN_RUN, folded, _IBAN_RUN_LOWER.pattern)
    else:
        runs = _finditer(candidates, _IBAN_RUN, text)
    for run in runs:
        candidate = text[run.start() : run.end()]
        # The run may have swallowed a following word: try the longest prefix that is an IBAN.
        end = len(candidate)
        while end >= 15:
            if _may_be_iban(candidate[:end]) and iban.is_valid(candidate[:end].upper()):
                spans.append(Span(IBAN, run.start(), run.start() + end))
                break
            end = candidate.rfind(" ", 0, end)
            if end < 0:
                break
    return spans


# --- national IDs ------------------------------------------------------------------------------

_NINO_BAD_PREFIXES = frozenset({"BG", "GB", "NK", "KN", "TN", "NT", "ZZ"})
_NATIONAL_IDS: tuple[tuple[re.Pattern, object], ...] = (
    (re.compile(r"\d(?<![\w-]\d)\d{2}-\d{2}-\d{4}(?![\w-])"), ssn.is_valid),
    (re.compile(r"\d(?<![\w-]\d)\d{2}[ -]\d{3}[ -]\d{3}(?![\w-])"), sin.is_valid),
    (re.compile(r"\d(?<![\w-]\d)\d{7}-?[A-Z](?!\w)"), dni.is_valid),
    (re.compile(r"[XYZ](?<![\w-][XYZ])-?\d{7}-?[A-Z](?!\w)"), nie.is_valid),
    (
        re.compile(r"[A-Z](?<!\w[A-Z])[A-Z]{5}\d{2}[A-Z]\d{2}[A-Z]\d{3}[A-Z](?!\w)", re.IGNORECASE),
        codicefiscale.is_valid,
    ),
    (re.compile(r"[12](?<![\w-][12]) ?\d{2} ?\d{2} ?(?:\d{2}|2[AB]) ?\d{3} ?\d{3} ?\d{2}(?![\w-])"), nir.is_valid),
    (re.compile(r"\d(?<![\w.-]\d)\d{2}\.\d{3}\.\d{3}-\d{2}(?![\w-])"), cpf.is_valid),
    (re.compile(r"[2-9](?<![\w-][2-9])\d{3}[ -]\d{4}[ -]\d{4}(?![\w-])"), aadhaar.is_valid),
    (re.compile(r"(?=\d)(?<![\w-])(?:19|20)?\d{6}[-+]\d{4}(?![\w-])"), personnummer.is_valid),
    (
        re.compile(r"[A-CEGHJ-PR-TW-Z](?<!\w[A-CEGHJ-PR-TW-Z])[A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D](?!\w)"),
        lambda value: value[:2].upper() not in _NINO_BAD_PREFIXES,
    ),
)


# The codice fiscale's pattern starts with a letter, so it is tried at every letter of a text; its
# digits-and-letters middle (…80A01H501…) starts with a digit, which the engine can skip to.
_CODICE_FISCALE_MIDDLE = re.compile(r"\d\d[A-Za-z]\d\d[A-Za-z]\d{3}")


def _national_ids(text: str, candidates: Scan) -> list[Span]:
    spans = []
    for pattern, valid in _NATIONAL_IDS:
        if not _may_match(candidates, pattern):
            continue
        if valid is codicefiscale.is_valid and not _CODICE_FISCALE_MIDDLE.search(text):
            continue
        for match in _finditer(candidates, pattern, text):
            if valid(match.group()):
                spans.append(Span(NATIONAL_ID, match.start(), match.end()))
    return spans


# --- IP addresses ------------------------------------------------------------------------------

_IPV4 = re.compile(r"\d(?<![\w.]\d)\d{0,2}\.(?:\d{1,3}\.){2}\d{1,3}(?![\w]|\.\d|/\d)")  # a /prefix is a network
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4}:|:){2,7}(?:[0-9A-Fa-f]{1,4}|:)(?![\w:])")
_VERSION_BEFORE = re.compile(r"(?:\bv|version\s*|release\s*|build\s*)$", re.IGNORECASE)


def _is_personal_address(candidate: str) -> bool:
    try:
        address = ipaddress.ip_address(candidate)
    except ValueError:
        return False
    if address.is_loopback or address.is_unspecified or address.is_multicast:
        return False
    # A netmask (255.255.255.0) or the broadcast address is no one's.
    return not (address.version == 4 and candidate.startswith("255."))


def _ip_addresses(text: str, candidates: Scan) -> list[Span]:
    spans: list[Span] = []
    if not _may_match(candidates, _IPV4, _IPV6):
        return spans
    for match in _finditer(candidates, _IPV4, text):
        if not _VERSION_BEFORE.search(text, max(0, match.start() - 10), match.start()) and _is_personal_address(
            match.group()
        ):
            spans.append(Span(IP_ADDRESS, match.start(), match.end()))
    if "::" in text or text.count(":") >= 7:
        for match in _finditer(candidates, _IPV6, text):
            value = match.group()
            if sum(c.isalnum() for c in value) >= 4 and _is_personal_address(value):
                spans.append(Span(IP_ADDRESS, match.start(), match.end()))
    return spans


# --- secrets -----------------------------------------------------------------------------------


def _secrets(text: str, candidates: Scan) -> list[Span]:
    return credentials.find(text)


# --- all of them -------------------------------------------------------------------------------

# One Hyperscan pass says which candidate patterns can match a text (gateway.screening.spans.Prefilter);
# a kind whose patterns cannot is skipped without a pass of its own.
_CANDIDATES = (_EMAIL, _PHONE_RUN, _CARD_RUN, _IBAN_RUN, _IPV4, _IPV6, *(p for p, _ in _NATIONAL_IDS))
_PREFILTER = Prefilter(list(_CANDIDATES))
_INDEX = {pattern: index for index, pattern in enumerate(_CANDIDATES)}


def _may_match(candidates: Scan, *patterns: re.Pattern) -> bool:
    return any(_INDEX[pattern] in candidates for pattern in patterns)


def _finditer(candidates: Scan, pattern: re.Pattern, text: str, run: re.Pattern | None = None) -> Iterator[re.Match]:
    """`pattern`'s matches in `text` (or those of `run`, its lowered twin), searched for only near
    where the prefilter saw them end."""
    return candidates.finditer(_INDEX[pattern], run or pattern, text)


_FINDERS = {
    EMAIL: _emails,
    CARD: _cards,
    IBAN: _ibans,
    NATIONAL_ID: _national_ids,
    IP_ADDRESS: _ip_addresses,
    SECRET: _secrets,
}


_DIGIT = re.compile(r"\d")


def find(text: str, kinds: frozenset[str] | tuple[str, ...], *, region: str = "US") -> list[Span]:
    """Spans of the given kinds in `text`, without overlaps, in text order. Of two overlapping
    spans the longer wins (+34 612 345 678 is a phone number, not the 9-digit ID inside it), then
    the kind earlier in KINDS."""
    if not text:
        return []
    spans: list[Span] = []
    candidates = _PREFILTER.scan(text)
    has_digit = _DIGIT.search(text) is not None  # the patterns' \d; a generator over 4,000 characters is 0.1 ms
    for kind in kinds:
        if kind == PHONE or (kind in (CARD, NATIONAL_ID) and not has_digit):
            continue
        spans.extend(_FINDERS[kind](text, candidates))
    if PHONE in kinds and has_digit:  # last: it skips digit runs the other kinds already claimed
        spans.extend(_phones(text, region, spans, candidates))
    if len(spans) < 2:
        return spans
    return _settle(spans)


def _settle(spans: list[Span]) -> list[Span]:
    """Of overlapping spans, the longer, then the kind earlier in KINDS, in text order. The
    non-empty spans kept do not overlap: sorted by start, their ends are sorted too, so a span
    overlaps one of them only if it overlaps the one starting before it or the one starting at or
    after it; an empty span kept overlaps a span only if it lies strictly inside it (a text of
    thousands of findings: n log n, not n squared)."""
    spans.sort(key=lambda s: (s.start - s.end, _PRIORITY[s.check], s.start))
    kept: list[Span] = []
    starts: list[int] = []  # of the non-empty spans kept, in text order
    ends: list[int] = []
    empty: list[int] = []  # where the empty spans kept are
    for span in spans:
        at = bisect.bisect_left(starts, span.start)
        if at and ends[at - 1] > span.start:
            continue
        if span.start < span.end:
            if at < len(starts) and starts[at] < span.end:
                continue
            inside = bisect.bisect_right(empty, span.start)
            if inside < len(empty) and empty[inside] < span.end:
                continue
            starts.insert(at, span.start)
            ends.insert(at, span.end)
        else:
            bisect.insort(empty, span.start)
        kept.append(span)
    kept.sort(key=lambda s: s.start)
    return kept


class _Claimed:
    """Whether one of some spans holds a stretch of text: the spans by start, with the furthest end
    reached so far (log n a question; a text of thousands of findings asked about thousands of
    runs)."""

    def __init__(self, spans: list[Span]) -> None:
        ordered = sorted((span.start, span.end) for span in spans)
        self._starts = [start for start, _ in ordered]
        self._reach = list(itertools.accumulate((end for _, end in ordered), max))

    def holds(self, start: int, end: int) -> bool:
        before = bisect.bisect_right(self._starts, start)  # the spans starting at or before it
        return bool(before) and self._reach[before - 1] >= end
