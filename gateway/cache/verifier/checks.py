"""The explicit checks: differences that change the answer whatever the topic, and that no
similarity score sees reliably (MiniLM puts "5 km to miles" and "5 miles to km" at cosine 0.98).

Each check takes the token streams of the cached prompt and the new one and returns the reason for
a rejection, or None. They are symmetric and need no training: numbers and their units and order,
operators, negation, opposites, named languages, the direction of "X to Y" and of "to"/"from".
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from gateway.cache.verifier.text import (
    LANGUAGE_ALIASES,
    LANGUAGES,
    NEGATIONS,
    STOPWORDS,
    Token,
    Tokens,
    names_unit,
    stem,
    tokens,
)

# General opposites: one prompt with one side and the other with the other ask different things.
_OPPOSITES = """
    increase:decrease increase:reduce raise:lower rise:fall up:down upgrade:downgrade
    upload:download import:export min:max minimum:maximum minimize:maximize lowest:highest
    low:high smallest:largest small:large small:big shortest:longest short:long slowest:fastest
    slow:fast cheap:expensive least:most less:more fewer:more under:over below:above before:after
    first:last earliest:latest early:late start:end begin:end open:close enable:disable
    login:logout inside:outside indoor:outdoor indoors:outdoors internal:external input:output
    add:remove add:delete
    insert:delete include:exclude with:without allow:deny allow:block accept:reject
    approve:reject encrypt:decrypt encode:decode compress:decompress lock:unlock
    install:uninstall subscribe:unsubscribe block:unblock hide:show push:pull send:receive
    buy:sell borrow:lend income:expense profit:loss deposit:withdraw pros:cons
    advantage:disadvantage safe:toxic safe:dangerous safe:unsafe healthy:unhealthy legal:illegal
    valid:invalid true:false yes:no positive:negative good:bad best:worst better:worse hot:cold
    warm:cool wet:dry light:dark light:heavy hard:soft hard:easy difficult:easy strong:weak
    thick:thin wide:narrow deep:shallow old:new old:young ascending:descending horizontal:vertical
    left:right top:bottom front:back front:rear north:south east:west sunrise:sunset summer:winter day:night
    morning:evening male:female man:woman adult:child parent:child buyer:seller
    employer:employee landlord:tenant client:server public:private inner:outer singular:plural
    prefix:suffix multiply:divide plus:minus sum:difference even:odd full:empty
    permanent:temporary manual:automatic online:offline active:inactive win:lose pass:fail
    success:failure agree:disagree like:dislike entry:exit arrival:departure domestic:international
    local:remote senior:junior hire:fire same:different cause:effect prevent:treat read:write
    eat:avoid include:avoid best:avoid good:avoid recommend:avoid ideal:avoid catch:throw import:export
    hand:machine prevent:treatment uppercase:lowercase since:before since:until
    prevention:treat prevention:treatment start:stop debug:release radius:diameter
    radius:circumference diameter:circumference simple:technical simple:detailed brief:detailed
"""
# Words between two shared words that make their order meaningful ("X to Y", "X than Y").
_DIRECTION_MARKERS = {"to": "to", "into": "to", "toward": "to", "towards": "to", "from": "from", "in": "in"}
_DIRECTION_MARKERS |= {"than": "than", "of": "of", "over": "over", "under": "under", "per": "per"}
_DIRECTION_MARKERS |= {"then": "then"}  # a sequence: "sort by name, then by age"

# Frequent function words of other languages that are not English words: a prompt with more of
# them than English function words is not in English.
_FOREIGN_FUNCTION_WORDS = frozenset(
    """
    los las una está están del que por para con cómo cuál cuáles cuántos cuántas qué dónde puedo
    hay tiene les des est sont une avec pour dans qui quoi quel quelle comment combien faut ils
    elle nous vous mes sur pas der die das und ist sind ein eine einen einem wie viel viele wer
    warum ich mich mir nicht mit auf für den dem uma com não são como qual quais faço minha meu
    até gli della delle sono cosa quanto posso che een het ik hoeveel heeft zijn nodig wat hoe
    """.split()
)


def _opposites() -> dict[str, frozenset[str]]:
    table: dict[str, set[str]] = {}
    for pair in _OPPOSITES.split():
        x, y = (stem(w) for w in pair.split(":"))
        table.setdefault(x, set()).add(y)
        table.setdefault(y, set()).add(x)
    return {word: frozenset(others) for word, others in table.items()}


_OPPOSITE = _opposites()


def _show(items) -> str:
    return "{" + ", ".join(sorted(str(i).removeprefix("#ord").lstrip("#") for i in items)) + "}"


def _both_differ(label: str, sa: set[str], sb: set[str]) -> str | None:
    """The reason, where both prompts name something of a kind and not the same (a prompt that
    names none constrains nothing)."""
    return f"{label}: {_show(sa)} vs {_show(sb)}" if sa and sb and sa != sb else None


# Languages written in the Latin alphabet that langid tells apart; the identifier chooses among
# these only (unconstrained, it reads informal English as Nigerian Pidgin, Frisian or Occitan).
_LATIN_SCRIPT_LANGUAGES = (
    "en de fr es it pt nl pl sv da no fi cs sk hu ro tr id ms tl vi ca hr sl et lv lt af sw eu gl is ga cy sq"
).split()
# How sure langid must be of another language: on the 3,700 labeled prompts of the five cache sets
# at 0.8 it named 45 prompts in Italian, Dutch, German, French, Polish, Portuguese or Spanish that
# the rules below had read as English, and no English one (at 0.6 it took "What is absolute zero in
# Fahrenheit?" for German).
_OTHER_LANGUAGE_CONFIDENCE = 0.8


@cache
def _identifier():
    import py3langid.langid as langid

    identifier = langid.LanguageIdentifier.from_modelpath(
        Path(langid.__file__).parent / langid.MODEL_FILE, norm_probs=True
    )
    identifier.set_languages(_LATIN_SCRIPT_LANGUAGES)
    return identifier


@lru_cache(maxsize=4096)
def in_english(text: str) -> bool:
    """Written in English (or too short to tell), read outside quotes: letters outside ASCII, more
    function words of other languages than of English, or a language identifier (langid's model,
    py3langid) sure of another language say it is not."""
    instruction = re.sub(r"(['\"`]).*?\1", " ", text)
    if any(ch.isalpha() and not ch.isascii() for ch in instruction):
        return False
    words = re.findall(r"[a-záéíóúñüöäçàèìòùâêîôûãõ]+", instruction.lower())
    foreign = sum(w in _FOREIGN_FUNCTION_WORDS for w in words)
    if foreign >= 2 and foreign >= sum(w in STOPWORDS for w in words):
        return False
    language, confidence = _identifier().classify(instruction)
    return language == "en" or confidence < _OTHER_LANGUAGE_CONFIDENCE


@dataclass(frozen=True, slots=True)
class _Number:
    value: str  # "#5", "#ord2"
    unit: str | None  # the unit right after it ("100 dollars"), or one word later ("100 US dollars")


def _numbers(ts: Tokens) -> list[_Number]:
    out = []
    for i, token in enumerate(ts):
        if token.kind not in ("number", "ordinal"):
            continue
        unit = None
        for following in ts[i + 1 : i + 3]:
            if following.kind in ("number", "ordinal", "punct"):
                break
            units = sorted(k for k in following.keys if k.startswith("unit:"))
            if units:
                unit = units[0]
                break
        out.append(_Number(next(iter(token.keys)), unit))
    return out


def numbers_in(text: str) -> frozenset[str]:
    """The numbers a text states (digits or words, read as the number check reads them)."""
    return frozenset(number.value for number in _numbers(tokens(text)))


def numbers(ta: Tokens, tb: Tokens) -> str | None:
    """Same numbers and ordinals, bound to the same units, in an order that means the same."""
    na, nb = _numbers(ta), _numbers(tb)
    ca, cb = Counter(n.value for n in na), Counter(n.value for n in nb)
    for mine, theirs, other in ((ca, cb, tb), (cb, ca, ta)):
        if mine["#1"] and not theirs["#1"] and any(t.text in ("a", "an", "per", "each", "single") for t in other):
            del mine["#1"]  # "one cup" = "a cup"
    ca, cb = +ca, +cb
    if ca != cb:
        return f"numbers differ: {_show(ca)} vs {_show(cb)}"
    units_a = {n.value: n.unit for n in na if n.unit}
    units_b = {n.value: n.unit for n in nb if n.unit}
    for value in sorted(units_a.keys() & units_b.keys()):
        if units_a[value] != units_b[value]:
            return f"units differ: {value[1:]} {units_a[value][5:]} vs {value[1:]} {units_b[value][5:]}"
    order_a = [n.value for n in na if ca[n.value] == 1]
    order_b = [n.value for n in nb if cb[n.value] == 1]
    for i, x in enumerate(order_a):
        for y in order_a[i + 1 :]:
            # "$1,000 at 5% for 3 years" = "3 years at 5% on $1,000", but "2^10" is not "10^2".
            distinct_units = units_a.get(x) and units_a.get(y) and units_a[x] != units_a[y]
            if order_b.index(x) > order_b.index(y) and not distinct_units:
                return f"numbers in a different order: {x[1:]}, {y[1:]}"
    return None


_PERIODS = frozenset("hour day week month quarter year".split())
# Rates the tokenizer leaves as words ("monthly", "weekly", "yearly" and "hourly" it reads as the
# unit itself, which alone says no rate: "how many hours" is a quantity).
_PERIOD_WORDS = {"daily": "day", "quarterly": "quarter", "annual": "year", "annually": "year"}


def _periods(ts: Tokens) -> set[str]:
    """The periods a rate is stated per ("$500 a month", "per year", "each week", "daily",
    "annual"), or a time within ("the best time of day", "this time of year")."""
    found = set()
    for i, token in enumerate(ts):
        following = ts[i + 1].text if i + 1 < len(ts) else ""
        if token.text in _PERIOD_WORDS:
            found.add(_PERIOD_WORDS[token.text])
        elif token.text in ("a", "an", "per", "each", "every") and following in _PERIODS:
            found.add(following)
        elif token.text in ("time", "times") and following == "of" and i + 2 < len(ts) and ts[i + 2].text in _PERIODS:
            found.add(ts[i + 2].text)
    return found


def periods(ta: Tokens, tb: Tokens) -> str | None:
    """Rates per different periods: "$500 a month" is not "$500 a year". A prompt that names no
    period constrains nothing ("how often" against "how many times a day" is the question check's)."""
    return _both_differ("periods differ", _periods(ta), _periods(tb))


# Closed classes: two prompts that name different members ask about different things ("plant in
# September" / "in March", "spring feeding" / "fall feeding"). "May" and "March" are months only
# with their capital, not at the start ("may I", "march").
_CLASSES = {
    "season": {"spring": "spring", "summer": "summer", "autumn": "autumn", "fall": "autumn", "winter": "winter"},
    "month": {
        m: m for m in "january february march april may june july august september october november december".split()
    },
    "weekday": {d: d for d in "monday tuesday wednesday thursday friday saturday sunday".split()},
    "meal": {m: m for m in "breakfast brunch lunch dinner supper".split()},
    "age": {
        **dict.fromkeys("baby babies infant infants newborn newborns".split(), "baby"),
        **dict.fromkeys("toddler toddlers".split(), "toddler"),
        **dict.fromkeys("child children kid kids".split(), "child"),
        **dict.fromkeys("teen teens teenager teenagers adolescent adolescents".split(), "teen"),
        **dict.fromkeys("adult adults".split(), "adult"),
        **dict.fromkeys("senior seniors elderly".split(), "senior"),
    },
}
_CAPITAL_ONLY = frozenset({"may", "march"})


def _members(ts: Tokens, members: dict[str, str]) -> set[str]:
    return {members[t.text] for t in ts if t.text in members and (t.capital or t.text not in _CAPITAL_ONLY)}


def named(ta: Tokens, tb: Tokens) -> str | None:
    """Different members of a closed class (seasons, months, days of the week, meals, ages), where
    both prompts name one."""
    for name, members in _CLASSES.items():
        reason = _both_differ(f"{name} differs", _members(ta, members), _members(tb, members))
        if reason:
            return reason
    return None


# Operations on a number that change the answer, by their names: "the square of 144" and "the
# square root of 144" share every other word.
_OPERATIONS = {
    **dict.fromkeys("root roots sqrt".split(), "root"),
    **dict.fromkeys("log logs logarithm logarithms ln".split(), "log"),
    **dict.fromkeys("factorial factorials".split(), "factorial"),
    **dict.fromkeys("derivative derivatives differentiate".split(), "derivative"),
    **dict.fromkeys("integral integrals integrate antiderivative".split(), "integral"),
    **dict.fromkeys("inverse inverses".split(), "inverse"),
    **dict.fromkeys("reciprocal reciprocals".split(), "reciprocal"),
}


# Named by one prompt only, they still change the answer; the others ("integrate the new hens",
# "git log") are words of other meanings too, compared only where both prompts name an operation.
_ALWAYS_AN_OPERATION = frozenset({"root", "factorial", "reciprocal"})


def operations(ta: Tokens, tb: Tokens) -> str | None:
    """A mathematical operation on a number named differently (the square / the square root of 144;
    the derivative / the integral of x^3), where either prompt has a number."""
    if not (_numbers(ta) or _numbers(tb)):
        return None
    sa = {_OPERATIONS[t.text] for t in ta if t.text in _OPERATIONS}
    sb = {_OPERATIONS[t.text] for t in tb if t.text in _OPERATIONS}
    if (sa ^ sb) & _ALWAYS_AN_OPERATION:
        return f"operation differs: {_show(sa)} vs {_show(sb)}"
    return _both_differ("operation differs", sa, sb)


# Time zones by their names and abbreviations ("3 PM Eastern", "15:00 UTC", "9am PST").
_ZONES = {
    spelling: zone
    for zone, spellings in {
        "eastern": "eastern et est edt",
        "central": "central ct cst cdt",
        "mountain": "mountain mt mst mdt",
        "pacific": "pacific pt pst pdt",
        "alaska": "alaska akst akdt",
        "hawaii": "hawaii hst",
        "atlantic": "atlantic ast adt",
        "utc": "utc gmt zulu",
        "cet": "cet cest",
        "ist": "ist",
        "jst": "jst",
        "bst": "bst",
        "aest": "aest aedt",
    }.items()
    for spelling in spellings.split()
}
_CLOCK = frozenset({"am", "pm"})


def _clock_zones(ts: Tokens) -> dict[str, str]:
    """{number: zone} for a time followed by its zone: "3 pm eastern", "15 UTC"."""
    found: dict[str, str] = {}
    for i, token in enumerate(ts):
        if token.kind != "number":
            continue
        j = i + 1 + (i + 1 < len(ts) and ts[i + 1].text in _CLOCK)
        if j < len(ts) and ts[j].text in _ZONES:
            found.setdefault(next(iter(token.keys)), _ZONES[ts[j].text])
    return found


def clock_zones(ta: Tokens, tb: Tokens) -> str | None:
    """The same time in another zone: "3 PM Pacific in Eastern time" is not "3 pm eastern = what
    time pacific?" (the direction of a conversion stated by the zone beside the time alone)."""
    za, zb = _clock_zones(ta), _clock_zones(tb)
    for number in sorted(za.keys() & zb.keys()):
        if za[number] != zb[number]:
            return f"time zone differs: {number[1:]} {za[number]} vs {number[1:]} {zb[number]}"
    return None


_SWITCH_VERBS = frozenset("turn turns turning turned switch switches switching switched".split())
_SWITCHED = {
    stem(verb): state
    for verb, state in (("enable", "on"), ("activate", "on"), ("disable", "off"), ("deactivate", "off"))
}


def _switched(ts: Tokens) -> set[str]:
    found = set()
    for i, token in enumerate(ts):
        following = ts[i + 1].text if i + 1 < len(ts) else ""
        if token.text in _SWITCH_VERBS and following in ("on", "off"):
            found.add(following)
        elif (base := stem(token.text)) in _SWITCHED:
            found.add(_SWITCHED[base])
    return found


def switched(ta: Tokens, tb: Tokens) -> str | None:
    """ "turn on dark mode" is not "turn off dark mode" nor "disable dark mode"."""
    return _both_differ("on vs off", _switched(ta), _switched(tb))


def operators(ta: Tokens, tb: Tokens) -> str | None:
    sa = Counter(t.text for t in ta if t.kind == "symbol" and t.text != "*")
    sb = Counter(t.text for t in tb if t.kind == "symbol" and t.text != "*")
    return f"operators differ: {_show(sa)} vs {_show(sb)}" if sa != sb else None


def negation(ta: Tokens, tb: Tokens) -> str | None:
    for marker, words in (("negation", NEGATIONS - {"without"}), ("'without'", frozenset({"without"}))):
        if any(t.text in words for t in ta) != any(t.text in words for t in tb):
            return f"{marker} in only one prompt"
    return _without_differs(ta, tb)


_WITHOUT_SKIP = frozenset("using use having getting any some".split()) | STOPWORDS
_CLAUSE_ENDS = frozenset("and or but with while when if so because".split())


def _without(ts: Tokens) -> tuple[set[str], set[str]]:
    """(the word each "without" governs, every word within its reach): "without ABS and without a
    vacuum bleeder" governs {abs, vacuum}; the reach ends at punctuation, a conjunction or five
    tokens."""
    governed: set[str] = set()
    reach: set[str] = set()
    left, looking = 0, False
    for t in ts:
        if t.kind == "word" and t.text == "without":
            left, looking = 5, True
        elif left:
            if t.kind == "punct" or t.text in _CLAUSE_ENDS:
                left = 0
                continue
            left -= 1
            if t.kind in ("word", "ident", "number"):
                reach.add(stem(t.text))
                if looking and t.text not in _WITHOUT_SKIP:
                    governed.add(stem(t.text))
                    looking = False
    return governed, reach


def _without_differs(ta: Tokens, tb: Tokens) -> str | None:
    """Both prompts say "without", but one goes without what the other has: "... without ABS and
    without a vacuum bleeder" / "... with ABS without a vacuum bleeder" (or "... abs motorcycle
    without vacuum bleeder")."""
    (governed_a, reach_a), (governed_b, reach_b) = _without(ta), _without(tb)
    words_a = {stem(t.text) for t in ta if t.kind in ("word", "ident")}
    words_b = {stem(t.text) for t in tb if t.kind in ("word", "ident")}
    for governed, other_reach, other_words in ((governed_a, reach_b, words_b), (governed_b, reach_a, words_a)):
        for word in sorted(governed - other_reach):
            if word in other_words:
                return f"'without {word}' in one prompt, {word!r} in the other"
    return None


def _base(word: str) -> str:
    """The stem, and for comparatives and superlatives their adjective ("higher" -> "high")."""
    for suffix in ("est", "er"):
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            base = word[: -len(suffix)]
            for candidate in (
                base,
                base[:-1] if base[-1:] == base[-2:-1] else base,
                base[:-1] + "y" if base.endswith("i") else base,
            ):
                if stem(candidate) in _OPPOSITE:
                    return stem(candidate)
    return stem(word)


def opposites(ta: Tokens, tb: Tokens) -> str | None:
    """One prompt says a word more often than the other, which says its opposite more often: "turn
    on" / "turn off", and also a swap where both sides appear ("hitting left ... right-handed" /
    "hitting right ... right-handed"; a set of words cannot tell those apart)."""
    ca = Counter(_base(t.text) for t in ta if t.kind in ("word", "ident"))
    cb = Counter(_base(t.text) for t in tb if t.kind in ("word", "ident"))
    for word in sorted(ca):
        if ca[word] <= cb[word]:
            continue
        for opposite in sorted(_OPPOSITE.get(word, ())):
            if cb[opposite] > ca[opposite]:
                return f"opposite words: {word!r} vs {opposite!r}"
    return None


def _languages(ts: Tokens) -> set[str]:
    return {LANGUAGE_ALIASES.get(t.text, t.text) for t in ts if t.kind in ("word", "ident") and t.text in LANGUAGES}


def languages(ta: Tokens, tb: Tokens) -> str | None:
    """ "reverse a list in Python" vs "... in JavaScript"; "translate into French" vs "into German"."""
    la, lb = _languages(ta), _languages(tb)
    return f"languages differ: {_show(la)} vs {_show(lb)}" if la != lb else None


def order(ta: Tokens, tb: Tokens) -> str | None:
    """Swapped roles: "5 km to miles" vs "5 miles to km", "liters in a gallon" vs "gallons in a
    liter", "can a landlord sue a tenant" vs "can a tenant sue a landlord". Two shared words close
    together, in swapped order, with the same direction word or the same content word between."""
    ta = tuple(t for t in ta if t.kind != "punct")
    tb = tuple(t for t in tb if t.kind != "punct")
    first_in_b: dict[str, int] = {}
    for i, token in enumerate(tb):
        if token.content or token.kind == "number":
            for key in token.keys:
                first_in_b.setdefault(key, i)
    anchors = []
    for i, token in enumerate(ta):
        shared = sorted(token.keys & first_in_b.keys())
        if shared and (token.content or token.kind == "number"):
            anchors.append((i, first_in_b[shared[0]], token.text))
    for n, (ia, ib, x) in enumerate(anchors):
        for ja, jb, y in anchors[n + 1 : n + 7]:
            if not (0 < ja - ia <= 6 and 0 < ib - jb <= 6):
                continue
            between_a, between_b = ta[ia + 1 : ja], tb[jb + 1 : ib]
            markers_a = {_DIRECTION_MARKERS[t.text] for t in between_a if t.text in _DIRECTION_MARKERS}
            markers_b = {_DIRECTION_MARKERS[t.text] for t in between_b if t.text in _DIRECTION_MARKERS}
            same_middle = [t.text for t in between_a] == [t.text for t in between_b]
            if (markers_a & markers_b) or (same_middle and any(t.content for t in between_a)):
                return f"order swapped: {x!r} and {y!r}"
    return None


def _sides(ts: Tokens) -> dict[str, str]:
    """{key of a word: "to" | "from"} for words right after a direction preposition."""
    found: dict[str, str] = {}
    side = ""
    for token in ts:
        if token.text in ("to", "into", "towards", "toward"):
            side = "to"
        elif token.text == "from":
            side = "from"
        elif token.text not in ("a", "an", "the", "my", "your", "our", "their", "its"):
            if side and (token.content or token.kind == "number"):
                for key in token.keys:
                    found.setdefault(key, side)
            side = ""
    return found


def direction(ta: Tokens, tb: Tokens) -> str | None:
    """One word's direction: "translate into German" vs "translate from German"."""
    pa, pb = _sides(ta), _sides(tb)
    for key in sorted(pa.keys() & pb.keys()):
        if pa[key] != pb[key]:
            return f"direction differs: {pa[key]} vs {pb[key]} {key}"
    return None


_ENUMERATING = frozenset(
    stem(w) for w in "give name list suggest recommend provide share write create generate draft".split()
)


def _requested(ts: Tokens) -> dict[str, str]:
    """{stem of an item asked for: "one" | "several"}, read after a verb that asks for items at
    the start of a clause: "give me an example" / "list examples"."""
    words = [t for t in ts if t.kind in ("word", "ident", "number", "punct")]
    found: dict[str, str] = {}
    for i, token in enumerate(words):
        opens = i == 0 or words[i - 1].kind == "punct" or words[i - 1].text in ("please", "you", "me", "to")
        if not (opens and token.kind == "word" and stem(token.text) in _ENUMERATING):
            continue
        rest = [t for t in words[i + 1 : i + 5] if t.text not in ("me", "us", "some")]
        if rest and rest[0].text in ("a", "an", "single"):
            for word in rest[1:4]:
                if word.kind != "word":
                    break
                found[stem(word.text)] = "one"
        else:
            for word in rest[:3]:
                if word.kind != "word":
                    break
                if word.text.endswith("s") and stem(word.text) != word.text:
                    found[stem(word.text)] = "several"
                    break
    return found


def count(ta: Tokens, tb: Tokens) -> str | None:
    """One or several: "give me an example" is not "give me examples"."""
    ia, ib = _requested(ta), _requested(tb)
    for item in sorted(ia.keys() & ib.keys()):
        if ia[item] != ib[item]:
            return f"one vs several: {item}"
    return None


_AUXILIARIES = frozenset(
    "is are was were am can could should would will shall may might must do does did has have had".split()
)
_QUANTITY = frozenset("many much long far tall high old often big large heavy deep wide fast".split())
_FREQUENCY = frozenset("often frequently regularly".split())  # "how often" asks when, as a schedule
_REQUEST_VERBS = frozenset(
    "explain tell show give write help make create draft provide list suggest recommend translate summarize "
    "rewrite rephrase check fix correct convert calculate compute find generate describe walk put send let".split()
)
_WH = {"who": "who", "whom": "who", "whose": "who", "when": "when", "where": "where", "why": "why"}
_ENTITY_QUESTION = {"year": "when", "date": "when", "day": "when", "month": "when", "time": "when"}
_ENTITY_QUESTION |= {"city": "where", "country": "where", "place": "where", "person": "who"}


def _token_clauses(ts: Tokens) -> list[list[Token]]:
    clauses: list[list[Token]] = [[]]
    for token in ts:
        if token.kind == "punct" or token.text in ("and", "or", "but"):
            clauses.append([])
        elif token.kind in ("word", "ident", "number"):
            clauses[-1].append(token)
    return [c for c in clauses if c]


def _clauses(ts: Tokens) -> list[list[str]]:
    return [[t.text for t in clause] for clause in _token_clauses(ts)]


def _how_kind(following: str) -> str:
    """What "how <following>" asks: "how often" when, "how many" / "how long" a quantity, else how."""
    return "when" if following in _FREQUENCY else "quantity" if following in _QUANTITY else "how"


def _question_kinds(ts: Tokens) -> set[str]:
    """Kinds of answer asked for, from each clause that opens with a question word or an
    auxiliary: "when", "where", "who", "why", "how" (manner), "quantity", "yesno"; "what year"
    asks "when". "What" and "which" alone say nothing."""
    kinds = set()
    for clause in _clauses(ts):
        while clause and clause[0] in ("hi", "hey", "hello", "please", "so", "ok", "okay", "quick", "question"):
            clause = clause[1:]
        if len(clause) > 1 and clause[0] in ("for", "in", "at", "on", "by", "to", "from"):
            clause = clause[1:]
        if not clause:
            continue
        head, following = clause[0], clause[1] if len(clause) > 1 else ""
        if clause[-1] in _WH and len(clause) > 2:
            kinds.add(_WH[clause[-1]])  # "the Mona Lisa was painted by who?"
        if head in ("what", "which") and following in _ENTITY_QUESTION:
            kinds.add(_ENTITY_QUESTION[following])
        elif head == "how":
            kinds.add(_how_kind(following))
        elif head in ("when", "where", "why") and (not following or following in _AUXILIARIES):
            kinds.add(head)
        elif head in ("who", "whom", "whose"):
            kinds.add("who")
        elif head in _AUXILIARIES:
            verb = next((w for w in clause[2:] if w not in ("please", "kindly", "just")), "")
            if not (following == "you" and verb in _REQUEST_VERBS):
                kinds.add("yesno")  # "can you explain ..." is a request, not a question
    return kinds


# What a search-style query names when it asks "when" ("kitten feeding frequency").
_TIME_WORDS = frozenset("time times timing date dates when schedule frequency often age season month year day".split())
_QUESTION_WORDS = frozenset("what which how why who where".split()) | _AUXILIARIES


def _keywords_only(ts: Tokens) -> bool:
    """A search-style query: no question mark, question word, auxiliary or request verb."""
    return not any(
        t.text == "?" or (t.kind == "word" and (t.text in _QUESTION_WORDS or t.text in _REQUEST_VERBS)) for t in ts
    )


_MEASURES = frozenset("long far tall high big large heavy deep wide fast old".split())
_RATE = frozenset("per a an each every".split())
# Where the noun phrase after "how many" ends ("how many US gallons are in ...").
_COUNTED_ENDS = _AUXILIARIES | frozenset("in of to for on at from per does do should would can could i you we".split())
_RATE_PERIODS = frozenset("second minute hour day night week month year session set game".split())


def _how_many_kinds(ts: Tokens) -> set[str]:
    """What each "how many" or "how <measure>" of a prompt counts: "count" (things: "how many
    periods", "how many lanes") or "measure" (a size, a length, a time: "how long", "how many
    minutes", "how many oz"). Not "how many times" or "how many lessons a week": a rate is asked
    either way ("how often"); nor "how far back", a span asked in any unit."""
    kinds = set()
    for clause in _token_clauses(ts):
        words = [t.text for t in clause]
        rate_from = _rate_from(words)
        for i in range(len(clause) - 1):
            if words[i] != "how":
                continue
            following, rest = words[i + 1], words[i + 2 :]
            if following == "many" and rest:
                if rest[0] != "times" and not rate_from[i + 3]:
                    counted = itertools.takewhile(lambda t: t.text not in _COUNTED_ENDS, clause[i + 2 : i + 5])
                    kinds.add("measure" if any(names_unit(t.text) for t in counted) else "count")
            elif following in _MEASURES and not (rest and rest[0] in ("back", "ahead", "in", "into")):
                kinds.add("measure")
    return kinds


def _rate_from(words: list[str]) -> list[bool]:
    """For each position (and one past the end), whether a rate is named from there on: "per", or a
    rate word followed by a period ("times a week", "lessons each month"). One pass from the end, so
    a clause of many "how many" is read once, not once for each."""
    found = [False] * (len(words) + 2)
    for k in range(len(words) - 1, -1, -1):
        found[k] = (
            found[k + 1]
            or words[k] == "per"
            or (words[k] in _RATE and k + 1 < len(words) and words[k + 1] in _RATE_PERIODS)
        )
    return found


def _asked_inside(ts: Tokens) -> set[str]:
    """The kinds a search-style query asks with a question word inside it ("yin yoga how long to
    hold poses", "countersteering technique how to"): "how", "quantity", "when", "why"."""
    kinds = set()
    for clause in _clauses(ts):
        for i in range(1, len(clause)):
            if clause[i] == "why":
                kinds.add("why")
            elif clause[i] == "how" and i + 1 < len(clause):
                kinds.add(_how_kind(clause[i + 1]))
    return kinds


_DOES_ENDS = frozenset("for to in on".split())


def _asks_what_it_does(ts: Tokens) -> bool:
    """ "What does dethatching do (for a lawn)?", "what dethatching does for lawn": what something
    is for. Not "what do I do if ..." (what to do), nor "what size cage does a parrot need"."""
    for clause in _clauses(ts):
        if len(clause) < 3 or clause[0] != "what":
            continue
        if clause[1] in ("does", "do") and clause[2] not in ("i", "you", "we") and "do" in clause[3:]:
            return True
        ends = [k for k, word in enumerate(clause[2:], 2) if word == "does"]
        if clause[1] not in _AUXILIARIES and any(k == len(clause) - 1 or clause[k + 1] in _DOES_ENDS for k in ends):
            return True
    return False


def _asks_what_it_is(ts: Tokens) -> bool:
    """ "What does 'osu' mean?", "what is the meaning of ...", "what does DRS stand for?", and a
    short "what is X?" alone ("What is the Inverted Jenny stamp?", "What is El Niño?"; not "what is
    the capital of ...", "what's 5 km in miles": a value of something)."""
    clauses = _clauses(ts)
    if any(
        clause[0] == "what" and ("mean" in clause or "meaning" in clause or ("stand" in clause and "for" in clause))
        for clause in clauses
    ):
        return True
    if len(clauses) != 1 or any(t.kind == "number" for t in ts):
        return False
    (clause,) = clauses
    return (
        2 < len(clause) <= 6
        and clause[0] == "what"
        and clause[1] in ("is", "are", "was", "were")
        and "of" not in clause
    )


def question(ta: Tokens, tb: Tokens) -> str | None:
    """Different kinds of answer: "when did it fall" vs "why did it fall", "how many periods" vs
    "how long is a period", "what does 'osu' mean" vs "when do you say 'osu'". A prompt that asks
    no question ("berlin wall fall date") constrains nothing, except that a search-style query is
    not a "when" question unless it names a time ("reefing a mainsail" is how, not when), and one
    with a question word inside it asks what that word asks ("yin yoga how long to hold poses" is
    not "why are poses held so long")."""
    qa, qb = _question_kinds(ta), _question_kinds(tb)
    if qa and qb and qa != qb and (qa | qb) != {"where", "how"}:
        return f"question differs: {_show(qa)} vs {_show(qb)}"
    ka, kb = _how_many_kinds(ta), _how_many_kinds(tb)
    if ka and kb and ka != kb:
        return f"question differs: {_show(ka)} vs {_show(kb)}"
    for own, asked, other in ((ta, qa, qb), (tb, qb, qa)):
        if not asked and other - {"yesno"} and _asks_what_it_is(own):
            return f"question differs: what it is vs {_show(other)}"
        # What something does vs when, why, how much about it ("how does it affect" asks the same).
        if not asked and other - {"yesno", "how"} and _asks_what_it_does(own):
            return f"question differs: what it does vs {_show(other)}"
    for asked, other, query in ((qa, qb, tb), (qb, qa, ta)):
        if "when" in asked and not other and _keywords_only(query) and not any(t.text in _TIME_WORDS for t in query):
            return "question differs: {when} vs a search naming no time"
        if asked and not other and not any(t.text == "?" or t.text in _REQUEST_VERBS for t in query):
            inside, named = _asked_inside(query), asked - {"yesno"}
            if inside and named and not inside & named and (inside | named) != {"where", "how"}:
                return f"question differs: {_show(named)} vs a search asking {_show(inside)}"
    return None


# Verbs (and nouns) that name the task itself: two prompts naming different ones ask for different
# work ("What is the sentiment of this review: ..." / "Summarize this review: ...").
_TASKS = {
    stem(word): task
    for task, words in {
        "write": "write draft compose create generate give show",
        "explain": "explain describe define",
        "translate": "translate translation",
        "summarize": "summarize summarise summary",
        "fix": "fix correct debug",
        "find": "find identify extract detect",
        "rewrite": "rewrite rephrase reword paraphrase",
        "classify": "classify categorize categorise sentiment",
        "compare": "compare",
    }.items()
    for word in words.split()
}


def task(ta: Tokens, tb: Tokens) -> str | None:
    """ "write a Dockerfile" vs "explain a Dockerfile". A prompt naming no task is not compared."""
    ka = {_TASKS[stem(t.text)] for t in ta if t.kind == "word" and stem(t.text) in _TASKS}
    kb = {_TASKS[stem(t.text)] for t in tb if t.kind == "word" and stem(t.text) in _TASKS}
    return _both_differ("task differs", ka, kb)


_VERSUS = frozenset({"vs", "versus"})
_COMPARING = _VERSUS | frozenset("or than which better worse".split())
_CHOOSING = frozenset("which when should".split())


def _compares(words: set[str]) -> bool:
    return bool(words & _COMPARING) or any(w.startswith(("dif", "compar")) for w in words)


def comparison(ta: Tokens, tb: Tokens) -> str | None:
    """ "tcp vs udp" asks how two things compare; "When should I use UDP instead of TCP?" or "Do I
    need both a router and a modem?" asks something else about them. A prompt that only sets two
    things against each other ("vs", "versus"; not "median vs mean, when to use which") is served
    only for one that compares them too (a difference, misspelt or not, which is better, one or
    the other, more than)."""
    wa = {t.text for t in ta if t.kind == "word"}
    wb = {t.text for t in tb if t.kind == "word"}
    if bool(wa & _VERSUS) == bool(wb & _VERSUS):
        return None
    versus, other = (wa, wb) if wa & _VERSUS else (wb, wa)
    if versus & _CHOOSING or _compares(other):
        return None
    return "comparison differs: one sets two things against each other, the other does not compare them"


CHECKS = (
    numbers,
    operations,
    periods,
    named,
    clock_zones,
    switched,
    operators,
    negation,
    opposites,
    languages,
    count,
    question,
    task,
    comparison,
    order,
    direction,
)


def first_difference(ta: Tokens, tb: Tokens) -> str | None:
    for check in CHECKS:
        reason = check(ta, tb)
        if reason:
            return reason
    return None


_POLITENESS = frozenset("please pls plz kindly thanks thx ty hi hey hello cheers".split())


def same_words(ta: Tokens, tb: Tokens) -> bool:
    """The same words in the same order, whatever the case, punctuation and politeness. Prompts with
    no word (emoji, control characters, punctuation only: "🙂" and "🙃" are one unknown piece to
    MiniLM, cosine 1.0) have no words to be the same: only the same prompt is served for them."""

    def words(ts: Tokens) -> list[str]:
        return [t.text for t in ts if t.kind != "punct" and t.text not in _POLITENESS]

    wa = words(ta)
    return bool(wa) and wa == words(tb)


def wordless(ts: Tokens) -> bool:
    """Nothing but punctuation, or nothing the tokenizer reads (emoji, control characters)."""
    return all(t.kind == "punct" for t in ts)


__all__ = ["CHECKS", "Token", "first_difference", "in_english", "numbers_in", "same_words", "wordless"]
