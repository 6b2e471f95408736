"""Prompt injection, learned: a logistic regression over the words of a text, its word stems and
word pairs, after undoing the usual disguises (l33t digits, s p a c e d letters, full-width forms,
accents), with Chinese and Japanese read as character pairs.

The weights are a small JSON file shipped beside this module (injection_model.json), trained
offline from a labeled set by `python manage.py injection_train tests/data/injection_train.jsonl`
(scikit-learn's LogisticRegression, which the request path never imports: scoring is a dictionary
lookup per feature, about 0.1 ms per 1,000 characters). A text is scored in chunks of a few
sentences, so an instruction hidden in a long pasted e-mail or a tool result is judged on its own
and not diluted by the rest; a chunk at or above the model's threshold is a finding.

Why not the MiniLM embeddings the cache uses: 3-6 ms a prompt (gateway.cache.embedder), over the
local checks' budget, and weights a few kilobytes of word features cannot be inspected the same way.
"""

from __future__ import annotations

import functools
import json
import math
import re
import unicodedata
from pathlib import Path

from gateway.screening.spans import Span

INJECTION = "injection"
WEIGHTS = Path(__file__).with_name("injection_model.json")

# l33t: digits and symbols standing for letters, inside words.
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s"})
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"), None)
# "I G N O R E", "i.g.n.o.r.e", "ign-ore": letters kept apart to slip past word matching.
_SPACED = re.compile(r"(?<!\w)(?:\w[ .\-_*]{1,3}){3,}\w(?!\w)")
_SPLIT_WORD = re.compile(r"(?<=\w)[.\-_*](?=\w)")
_WORDS = re.compile(r"\w+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]")
_COMBINING = re.compile(r"[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")
_DISGUISED = re.compile(r"[a-z][0-9@$]|[0-9@$][a-z]")
_SENTENCE_END = re.compile(r"(?<=[.!?。！？；;])\s+|\n+")
# A passage set apart inside a chunk: in brackets or parentheses, between quotes, inside an HTML tag.
_ENCLOSED = re.compile(
    r"\(([^()]{20,})\)|\[([^\[\]]{20,})\]|>([^<>]{20,})<|\"([^\"]{20,})\"|<!--(.{20,}?)-->", re.DOTALL
)
CHUNK_CHARS = 280  # sentences are gathered into chunks of about this many characters


def normalize(text: str) -> str:
    """Lowercase, accents and full-width forms folded, invisible characters dropped, l33t digits
    read as letters, spaced or split letters joined."""
    if not text.isascii():
        text = _COMBINING.sub("", unicodedata.normalize("NFKD", text.translate(_INVISIBLE)))
    text = _SPACED.sub(_join_letters, text.lower())
    text = _SPLIT_WORD.sub("", text)
    # Digits inside a word of letters are letters in disguise ("1gn0r3"); a number stays a number.
    if not _DISGUISED.search(text):
        return text
    return " ".join(word.translate(_LEET) if _DISGUISED.search(word) else word for word in text.split())


def _join_letters(match: re.Match) -> str:
    # Letters kept apart by single separators form a word; a wider gap (two spaces or more) is the
    # space between two words: "f o r g e t   y o u r" -> "forget your".
    return " ".join(re.sub(r"[ .\-_*]", "", word) for word in re.split(r"\s{2,}", match.group()))


def features(text: str) -> set[str]:
    """Words, their first five letters (a cheap stem across languages: ignor-, instr-, anwei-),
    neighbouring pairs of both, and character pairs of Chinese or Japanese runs."""
    words = _WORDS.findall(normalize(text))
    found: set[str] = set()
    if _CJK.search(text):
        found.update("c:" + w[i : i + 2] for w in words if _CJK.search(w) for i in range(max(1, len(w) - 1)))
        words = [w for w in words if not _CJK.search(w)]
    stems = [w[:5] for w in words]
    found.update("w:" + w for w in words)
    found.update("s:" + stem for stem in stems)
    found.update(f"b:{a} {b}" for a, b in zip(words, words[1:], strict=False))
    found.update(f"t:{a} {b}" for a, b in zip(stems, stems[1:], strict=False))
    return found


@functools.cache
def model() -> tuple[float, float, dict[str, float]]:
    """(bias, threshold, weights), read once per process."""
    data = json.loads(WEIGHTS.read_text())
    return data["bias"], data["threshold"], data["weights"]


def score(text: str) -> float:
    """The probability the model gives `text` of being an injection attempt."""
    bias, _, weights = model()
    z = bias + sum(weights[feature] for feature in features(text) & weights.keys())
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def chunks(text: str) -> list[tuple[int, int]]:
    """(start, end) of runs of whole sentences of about CHUNK_CHARS characters."""
    found, start, position = [], 0, 0
    for boundary in _SENTENCE_END.finditer(text):
        position = boundary.end()
        if position - start >= CHUNK_CHARS:
            found.append((start, boundary.start()))
            start = position
    if start < len(text):
        found.append((start, len(text)))
    return [(a, b) for a, b in found if text[a:b].strip()]


def find(text: str) -> list[Span]:
    """Chunks the model judges injection attempts, and passages quoted or bracketed inside them (a
    note in parentheses, a hidden HTML element, a quoted e-mail) judged on their own."""
    _, threshold, _ = model()
    found = []
    for start, end in chunks(text):
        if score(text[start:end]) >= threshold:
            found.append(Span(INJECTION, start, end))
            continue
        for inner in _ENCLOSED.finditer(text, start, end):
            a, b = inner.span(inner.lastindex)
            if b - a >= 20 and score(text[a:b]) >= threshold:
                found.append(Span(INJECTION, a, b))
    return found
