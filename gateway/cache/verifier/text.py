"""Prompts as tokens the checks and the pair model read: words with their stems, numbers with their
values, units under one name, pasted text set apart.

Only general English goes in here: function words, number words, units and their abbreviations,
the names of languages, inflections. Nothing names a topic; which words are interchangeable is left
to the pair model (features.py), which learned it from labeled pairs rather than from a list.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

# Function words, politeness and the framing of a request ("can you tell me", "I need", "show me
# the way to"): they never change which answer is correct.
STOPWORDS = frozenset(
    """
    a an the this that these those it its itself there here i me my mine myself you u your ur
    yours yourself we us our ours they them their he him his she her is am are was were be been
    being do does did done doing have has had having can could should would will shall may might
    must to of for on at by in into onto from with as about via within through across around among
    between and or but so yet if then because while since though although whether some any each
    every all both either such just really actually basically simply exactly also too very quite
    pretty please pls plz kindly thanks thank thx ty hi hey hello dear cheers quick question
    wondering curious okay ok alright someone somebody anyone anybody
    """.split()
)
# Words that frame a request or name the kind of answer rather than its subject: question words,
# generic verbs of asking and doing. Often reworded between paraphrases ("what makes" / "why"),
# sometimes the whole difference ("explain the code" / "write the code"): the model weighs them
# apart from content words (features.py).
LIGHT_WORDS = frozenset(
    """
    what which who whom whose when where why how many much way ways step steps process procedure
    guide tips possible able something anything thing things stuff help tell show know want need
    let look say explain describe give provide get go make like find use using vs versus now
    currently usually typically generally normally best good
    """.split()
)
NEGATIONS = frozenset("not no never none nothing nobody neither nor cannot without".split())

# Units and their spellings; the first word names the unit.
_UNIT_GROUPS = """
    kilometer kilometre km kms | mile miles mi | meter metre m | centimeter centimetre cm
    millimeter millimetre mm | kilogram kg kilo kilos | gram g gm | milligram mg | pound lb lbs
    ounce oz | foot feet ft | inch inches in | yard yd | liter litre l | milliliter millilitre ml
    tablespoon tbsp tbs | teaspoon tsp | gallon gal | quart qt | pint pt | cup | mph | kph kmh
    celsius centigrade c | fahrenheit f | kelvin | gigabyte gb | megabyte mb | kilobyte kb
    terabyte tb | byte | hour hr hrs h | minute min mins | second sec secs s | millisecond ms
    day d | week | month | year | percent pct percentage | dollar usd | euro eur | yen jpy
    thousand k | million | billion | ton t | pm | am | degree | hertz hz | kilohertz khz
    megahertz mhz | gigahertz ghz | watt watts w | kilowatt kw | kilowatthour kwh | volt volts v
    milliamphour mah | rpm | fps | word words | sentence sentences | paragraph paragraphs
    page pages | character characters chars | bullet bullets
"""
# Abbreviations that mean a unit only right after a number ("5 m", "72 F", "3 s").
_AFTER_NUMBER_ONLY = frozenset("m g l s h min f c k pt in d t w v".split())

_NATURAL_LANGUAGES = """
    english spanish french german italian portuguese dutch swedish norwegian danish finnish polish
    czech russian ukrainian greek turkish arabic hebrew hindi bengali urdu persian farsi chinese
    mandarin cantonese japanese korean vietnamese thai indonesian malay tagalog swahili latin
"""
_PROGRAMMING_LANGUAGES = """
    python javascript js typescript ts java kotlin scala swift ruby php perl rust golang c++ c#
    csharp cpp haskell elixir erlang clojure lua matlab julia dart bash shell powershell sql html
    css
"""
LANGUAGE_ALIASES = {"js": "javascript", "ts": "typescript", "csharp": "c#", "cpp": "c++"}

# fmt: off
_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90, "dozen": 12, "half": 0.5, "quarter": 0.25,
}
_MULTIPLIERS = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_ORDINAL_WORDS = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
    "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "twentieth": 20,
    "hundredth": 100,
}
_IRREGULAR = {
    "children": "child", "men": "man", "women": "woman", "people": "person", "feet": "foot",
    "teeth": "tooth", "mice": "mouse", "wrote": "write", "written": "write", "made": "make",
    "bought": "buy", "sold": "sell", "paid": "pay", "took": "take", "taken": "take", "gave": "give",
    "given": "give", "found": "find", "told": "tell", "said": "say", "knew": "know", "known": "know",
    "began": "begin", "broke": "break", "broken": "break", "chose": "choose", "chosen": "choose",
    "ate": "eat", "eaten": "eat", "fell": "fall", "grew": "grow", "grown": "grow", "held": "hold",
    "kept": "keep", "lost": "lose", "meant": "mean", "sent": "send", "spent": "spend", "won": "win",
    "built": "build", "caught": "catch", "taught": "teach", "brought": "bring", "ran": "run",
    "froze": "freeze", "frozen": "freeze", "drew": "draw", "drawn": "draw", "saw": "see", "seen": "see",
}
_INFORMAL = {
    "whats": "what is", "hows": "how is", "wheres": "where is", "whos": "who is", "thats": "that is",
    "dont": "do not", "doesnt": "does not", "didnt": "did not", "cant": "can not", "isnt": "is not",
    "arent": "are not", "wasnt": "was not", "shouldnt": "should not", "couldnt": "could not",
    "wouldnt": "would not", "havent": "have not", "hasnt": "has not", "im": "i am", "ive": "i have",
    "youre": "you are",
}
_PUNCT_MAP = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-",
                            "\u2014": "-", "\u00d7": "*", "\u00f7": "/", "\u2192": "->"})
_SUPERSCRIPTS = str.maketrans({"²": "^2", "³": "^3"})
# fmt: on
_CURRENCY = {"$": "dollar", "€": "euro", "£": "pound", "¥": "yen"}
_INFORMAL_RE = re.compile(r"\b(" + "|".join(_INFORMAL) + r")\b", re.IGNORECASE)


def _unit_table() -> dict[str, str]:
    table = {}
    for group in re.split(r"[|\n]", _UNIT_GROUPS):
        words = group.split()
        for word in words:
            table[word] = words[0]
    return table


UNITS = _unit_table()
LANGUAGES = frozenset(_NATURAL_LANGUAGES.split()) | frozenset(_PROGRAMMING_LANGUAGES.split())
PROGRAMMING_LANGUAGES = frozenset(_PROGRAMMING_LANGUAGES.split())


@dataclass(frozen=True, slots=True)
class Token:
    text: str  # lower-cased surface form ("5" for numbers, the unit's name for units)
    kind: str  # "word" | "ident" (code-like, matched exactly) | "number" | "ordinal" | "symbol" | "punct"
    keys: frozenset[str]  # forms under which another prompt's token is the same word
    content: bool  # carries meaning of its own: must find a counterpart in the other prompt
    capital: bool = False  # written with a capital letter not at the start: a name


Tokens = tuple[Token, ...]


@lru_cache(maxsize=65536)  # a pure function of one word: words recur from prompt to prompt
def stem(word: str) -> str:
    """Light suffix stripping: inflections only (plural, -ed, -ing, -ly), never -er/-est."""
    word = _IRREGULAR.get(word, word)
    if len(word) <= 3:
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "shes", "ches", "xes", "zes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix, keep in (("ing", 2), ("ed", 2), ("ly", 4)):
        base = word[: -len(suffix)]
        if word.endswith("eed"):
            break  # "need", "speed" are not past tenses
        if word.endswith(suffix) and len(base) >= keep and re.search(r"[aeiouy]", base):
            word = base
            if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]
            elif len(word) == 2:
                word += "e"  # "used" = "use", not the pronoun "us"
            break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    if len(word) > 3 and word.endswith("y"):
        word = word[:-1] + "i"
    return word


def stems(word: str) -> set[str]:
    """The stem, plus the stem of the word a derived noun comes from ("invitation" -> "invite",
    "rejection" -> "reject"), for long words only, where such roots rarely collide."""
    found = {stem(word)}
    singular = word.removesuffix("s")
    if singular.endswith("ation") and len(singular) >= 9:
        root = singular[:-5]
        found |= {stem(root), stem(root + "e"), stem(root + "ate")}
    elif singular.endswith(("tion", "sion")) and len(singular) >= 8:
        found.add(stem(singular[:-3]))
    return found


_ABBREVIATION_RE = re.compile(r"\b(e\.g|i\.e|etc)\.", re.IGNORECASE)
_TEMPERATURE_RE = re.compile(r"(?:°\s*|\bdegrees?\s+)([FfCc])\b")
_NOT_EQUAL_RE = re.compile(r"!==?")
_EQUAL_RE = re.compile(r"===?")
_WITHOUT_RE = re.compile(r"\bw/o\b")
_JOINING_HYPHEN_RE = re.compile(r"(?<=[A-Za-z0-9])-(?=[A-Za-z])")
_SPACED_DASH_RE = re.compile(r"\s-+\s")
_ASKING_EQUALS_RE = re.compile(r"=\s*(?=\?|what\b|how\b)", re.IGNORECASE)
_PLUS_AND_RE = re.compile(r"(?<=[A-Za-z]{2})\s\+\s(?=[A-Za-z]{2})")
_SLASH_OR_RE = re.compile(r"(?<=[A-Za-z])\s/\s(?=[A-Za-z])")
_AMOUNT_RE = re.compile(r"([$€£¥])\s?(\d[\d,.]*\d|\d)")
_CURRENCY_RE = re.compile(r"[$€£¥]")


def _prepare(text: str) -> str:
    """Spell out symbols and informal forms so that equal requests tokenise alike."""
    text = unicodedata.normalize("NFKC", text.translate(_SUPERSCRIPTS).translate(_PUNCT_MAP))
    text = _ABBREVIATION_RE.sub(" ", text)
    text = _INFORMAL_RE.sub(lambda m: _INFORMAL[m.group(1).lower()], text)
    text = _TEMPERATURE_RE.sub(lambda m: " fahrenheit " if m[1] in "Ff" else " celsius ", text)
    text = text.replace("°", " degree ").replace("%", " percent ").replace("&", " and ")
    text = _NOT_EQUAL_RE.sub(" not equal ", text)
    text = _EQUAL_RE.sub(" equal ", text)
    text = _WITHOUT_RE.sub(" without ", text)
    # A hyphen inside a word joins parts ("wi-fi", "3-day"); a spaced dash is punctuation.
    text = _JOINING_HYPHEN_RE.sub(" ", text)
    text = _SPACED_DASH_RE.sub(" , ", text).replace("->", " to ").replace("=>", " to ")
    text = _ASKING_EQUALS_RE.sub(" is ", text)
    text = _PLUS_AND_RE.sub(" and ", text)
    text = _SLASH_OR_RE.sub(" or ", text)
    text = _AMOUNT_RE.sub(lambda m: f"{m[2]} {_CURRENCY[m[1]]}", text)
    return _CURRENCY_RE.sub(lambda m: f" {_CURRENCY[m[0]]} ", text)


_RAW_TOKEN_RE = re.compile(
    r"""
    # An operator of two or three symbols standing alone ("the ?. operator", "x ?? y", "`::`"), not
    # emphasis at the end ("why??", "help !!") nor an ellipsis.
    (?P<operator>(?<![^\s`(])(?!\.+(?![^\s`)]))(?![?!.]+\s*$)[?!:.|<>*+/^~]{2,3}(?![^\s`),]))
    |(?P<ident>[\w.+-]+@[\w-]+(?:\.[\w-]+)+|https?://\S+|(?<![\w/])(?:~|\.{1,2})?/[\w.\-/*]+
        |(?<![\w-])--?[A-Za-z][\w-]*)
    |(?P<num>\d+(?:,\d{3})+(?:\.\d+)?|\d*\.\d+|\d+)(?P<suffix>[A-Za-z]+)?
    |(?P<word>[^\W\d_]\w*(?:'[^\W\d_]+)?(?:[.+#][\w+#]+)*[+#]*(?:<[\w<>, ]+>)?(?:\[\])?)
    |(?P<symbol>[<>=+\-*/^])
    |(?P<punct>[.?!,;:()])
    """,
    re.VERBOSE,
)


@lru_cache(maxsize=65536)  # a pure function of one word: words recur from prompt to prompt
def _unit(word: str) -> str | None:
    """The unit a word names, in the singular or the plural ("tablespoons", "inches")."""
    return UNITS.get(word) or (UNITS.get(stem(word)) if len(word) > 3 else None)


def names_unit(word: str) -> bool:
    """Whether a word names a unit of measure, in the singular or the plural ("minutes", "ounces":
    the stem drops their "e"), or a few the unit table leaves out ("calories", "yrs")."""
    plural = len(word) > 4 and word.endswith("s") and _unit(word[:-1])
    return bool(_unit(word) or plural or word in _OTHER_MEASURES)


_OTHER_MEASURES = frozenset("calorie calories kcal cal yr yrs".split())


def _number_value(text: str) -> str:
    value = float(text.replace(",", ""))
    return str(int(value)) if value.is_integer() else repr(value)


_CODE_CHARACTER_RE = re.compile(r"[0-9_.@/#+<\[]|[a-z][A-Z]")


@lru_cache(maxsize=65536)  # a pure function of one word: words recur from prompt to prompt
def _is_identifier(raw: str) -> bool:
    """Code-ish tokens match only exactly: `List<String>`, `useState`, `SUMIFS`."""
    return bool(_CODE_CHARACTER_RE.search(raw) or (len(raw) >= 2 and raw.isupper()))


def _raw_tokens(text: str) -> list[tuple[str, str, bool]]:
    """(kind, lower-cased surface, capitalised) triples: contractions split, number suffixes apart."""
    out: list[tuple[str, str, bool]] = []
    shouting = sum(w.isupper() for w in text.split()) > len(text.split()) / 2
    for match in _RAW_TOKEN_RE.finditer(text):
        group, raw = match.lastgroup or "symbol", match.group(0)
        if group == "ident":
            out.append(("ident", raw.lower(), False))
        elif group == "operator":
            out.append(("symbol", raw, False))
        elif group in ("num", "suffix"):
            number, suffix = match["num"], (match["suffix"] or "").lower()
            if suffix in ("st", "nd", "rd", "th"):
                out.append(("ordinal", _number_value(number), False))
            elif suffix and suffix not in UNITS:
                out.append(("ident", raw.lower(), False))  # "2fa", "3d"
            else:
                out.append(("number", _number_value(number), False))
                if suffix:
                    out.append(("unit", suffix, False))
        elif group == "word":
            base, _, tail = raw.partition("'")
            low = base.lower()
            if tail.lower() == "t" and low.endswith("n"):  # "don't", "can't", "won't"
                out += [("word", {"wo": "will", "ca": "can"}.get(low[:-1], low[:-1]), False), ("word", "not", False)]
            else:
                # Code-like words are identifiers, matched only exactly; but a unit written in capitals
                # right after a number is the unit ("6 PM", "10 GB").
                identifier = not shouting and _is_identifier(base)
                kind = "ident" if identifier and not (low in UNITS and out and out[-1][0] == "number") else "word"
                out.append((kind, low, base[:1].isupper() and bool(out) and out[-1][0] != "punct"))
        else:
            out.append((group, raw, False))
    return out


def _combine_numbers(raw: list[tuple[str, str, bool]]) -> list[tuple[str, str, bool]]:
    """Number words to digits ("twenty five" -> 25, "5 million" -> 5000000), ordinal words to
    ordinals, units after numbers to their name; "one" as a pronoun ("a new one") dropped."""
    out: list[tuple[str, str, bool]] = []
    i = 0
    while i < len(raw):
        kind, text, capital = raw[i]
        previous = out[-1] if out else ("", "", False)
        if kind == "word" and (text in _NUMBER_WORDS or (text in _MULTIPLIERS and previous[0] == "number")):
            if text == "one" and previous[1] in ("a", "the", "new", "this", "that", "which", "each", "another"):
                i += 1
                continue
            total, current = 0.0, float(previous[1]) if text in _MULTIPLIERS else 0.0
            if text in _MULTIPLIERS:
                out.pop()
            while i < len(raw) and raw[i][0] == "word" and (raw[i][1] in _NUMBER_WORDS or raw[i][1] in _MULTIPLIERS):
                word = raw[i][1]
                if word in _NUMBER_WORDS:
                    current += _NUMBER_WORDS[word]
                elif word == "hundred":
                    current = max(current, 1) * 100
                else:
                    total += max(current, 1) * _MULTIPLIERS[word]
                    current = 0
                i += 1
            out.append(("number", _number_value(str(total + current)), False))
            continue
        i += 1
        if kind == "word" and text in _ORDINAL_WORDS and not (text == "second" and previous[0] == "number"):
            out.append(("ordinal", str(_ORDINAL_WORDS[text]), False))
        elif kind in ("unit", "word") and _unit(text) and (text not in _AFTER_NUMBER_ONLY or previous[0] == "number"):
            if text == "in" and not (len(out) > 1 and out[-2][1] in ("ft", "foot", "feet")):
                out.append(("word", text, False))  # "in" is an inch only in "6 ft 2 in"
            elif _unit(text) == "thousand" and previous[0] == "number":
                out[-1] = ("number", _number_value(str(float(previous[1]) * 1000)), False)  # "20k"
            else:
                out.append(("unit", _unit(text), False))
        else:
            out.append(("word" if kind == "unit" else kind, text, capital))
    return out


@lru_cache(maxsize=16384)
def _make_token(kind: str, text: str, capital: bool) -> Token:
    if kind in ("number", "ordinal"):
        return Token(text, kind, frozenset({("#" if kind == "number" else "#ord") + text}), False)
    if kind in ("symbol", "punct"):
        return Token(text, kind, frozenset({text}), False)
    if kind == "unit":
        return Token(text, "word", frozenset({"unit:" + text}), True)
    keys = {text, LANGUAGE_ALIASES.get(text, text)} | (stems(text) if kind == "word" else set())
    content = text not in STOPWORDS and text not in NEGATIONS and text not in LIGHT_WORDS
    return Token(text, kind, frozenset(keys), content, capital)


@lru_cache(maxsize=4096)
def tokens(text: str) -> Tokens:
    return tuple(_make_token(*raw) for raw in _combine_numbers(_raw_tokens(_prepare(text))))


# --- pasted text: quotes, backticks, code blocks, and long text after a colon ----------------------

_QUOTED_RE = re.compile(
    r"```(?P<fence>.*?)```|`(?P<tick>[^`]+)`|(?<![\w])(?P<q>['\"])(?P<quoted>.+?)(?P=q)(?![\w])", re.DOTALL
)
_LEAD_IN_RE = re.compile(r"^(?P<head>[^:?]{2,}?)(?::|\?|->)\s+(?P<tail>.+)$", re.DOTALL)
_CODE_HINT_RE = re.compile(r"[;{}()\[\]<>=_`$\\|]|[a-z][A-Z]|^\s*[A-Z]+\s")


def _normalize_payload(text: str) -> str:
    """Pasted text compares exactly, except for runs of whitespace, wrapping quotes and the final
    full stop; prose (no code-like characters) also ignores case."""
    text = unicodedata.normalize("NFC", text.translate(_PUNCT_MAP)).strip()
    text = text.strip("'\"` ").rstrip(".?!;,").strip("'\"` ")
    if not _CODE_HINT_RE.search(text):
        text = text.casefold()
    return re.sub(r"\s*([^\w\s])\s*", r"\1", re.sub(r"\s+", " ", text))


@lru_cache(maxsize=4096)
def split_payload(text: str) -> tuple[tuple[str, ...], str]:
    """(normalised pasted spans, the instruction around them)."""
    text = text.translate(_PUNCT_MAP)
    spans = list(_QUOTED_RE.finditer(text))
    if spans:
        payloads = sorted(_normalize_payload(m["fence"] or m["tick"] or m["quoted"]) for m in spans)
        return tuple(payloads), _QUOTED_RE.sub(" ", text)
    lead_in = _LEAD_IN_RE.match(text.strip())
    if lead_in and len(lead_in["tail"].split()) >= 5:
        return (_normalize_payload(lead_in["tail"]),), lead_in["head"]
    return (), text
