"""Decides whether a cached answer for an earlier prompt `a` may be served for a new prompt `b`.

A cosine threshold alone cannot: MiniLM puts "convert 5 km to miles" and "convert 5 miles to km",
or "reverse a list in Python" and "... in JavaScript", as close as true paraphrases. A candidate
above the cosine floor is served only if, in this order:

1. they are the same prompt once normalized; else both are at most SEMANTIC_MAX_CHARS long, and
   they are the same words (whatever the case and punctuation), or both are in English (a prompt
   in another language is served only for its own words: nothing here can tell its paraphrases
   from its near misses);
2. pasted text (quotes, backticks, code, the text after "Summarize this:") is the same;
3. no explicit check finds a difference that changes the answer (verifier/checks.py: numbers,
   units and their order, operators, negation, opposites, named languages, one vs several, the
   kind of question, the task, the direction of "X to Y");
4. the pair model (verifier/model.py, a logistic regression over lexical features:
   verifier/features.py) rates them at least the cross-encoder's gate (a cheap first cut), and the
   cross-encoder (verifier/cross.py: MiniLM reading both prompts at once, with an update trained
   here on labeled pairs) scores them at or above its threshold.

Serving a wrong answer costs far more than a miss, so every step errs towards a miss.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

from gateway.cache.verifier import checks, cross, features
from gateway.cache.verifier.model import pair_model
from gateway.cache.verifier.text import split_payload, tokens

# Cosine (all-MiniLM-L6-v2, normalised vectors) below which a cached prompt is not even verified.
DEFAULT_THRESHOLD = 0.75
# The semantic tier serves prompts up to this many characters (a longer one only for the same
# prompt: the exact tier). MiniLM reads a prompt's first 256 word pieces (about 1,000 characters of
# English), the verifier every word, on the event loop: about 3 ms a KiB for a pair, so a pair of
# 32 KiB prompts took 90-130 ms for each candidate. No labeled prompt is longer than 270
# characters, and a long prompt the words would serve was not found (pasted documents under other
# instructions: the pair model rates them 0.000).
SEMANTIC_MAX_CHARS = 4096

numbers_in = checks.numbers_in


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    reason: str
    # False for by_words' acceptance of a pair the cross-encoder has still to score.
    final: bool = field(default=True, compare=False)


_FENCE_RE = re.compile(r"(```.*?```)", re.DOTALL)


def normalize_prompt(text: str) -> str:
    """Canonical form for the exact-match tier: only changes that cannot change the answer.

    Unicode NFC, CRLF to LF, trim, and runs of whitespace collapsed to one space outside fenced
    code blocks (inside them indentation and line breaks can be meaningful). Case is kept: "the
    `Users` table" and "the `users` table" can be different questions.
    """
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").strip()
    if "```" not in text:
        # No fence: str.split() cuts at exactly the characters \s matches (both ask str.isspace), and
        # is a fifth of the regular expression's cost (every message of a conversation's cache key).
        return " ".join(text.split())
    return "".join(
        part if part.startswith("```") else re.sub(r"\s+", " ", part) for part in _FENCE_RE.split(text)
    ).strip()


def verify(
    a: str,
    b: str,
    similarity: float,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    score: float | None = None,
) -> Verdict:
    """May the cached answer to prompt `a` be served for prompt `b`? `similarity` is the cosine of
    the two prompt embeddings (the cache has it from the vector search); `score` the cross-encoder's
    score of the pair (verifier/cross.py), computed here if needed and not given.
    Deterministic and symmetric; a rejection says what differed."""
    verdict = by_words(a, b, similarity, threshold)
    if verdict.final:
        return verdict
    return by_cross(similarity, verdict, cross_score(a, b) if score is None else score)


def by_words(a: str, b: str, similarity: float, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    """verify without the cross-encoder: its verdict where the words decide (final), else an
    acceptance that is not final (a pair worth scoring, whose verdict by_cross gives). What the
    cache asks first."""
    verdict, rows = _verdict(a, b, similarity, threshold)
    if rows is None:
        return verdict
    probability = pair_model().probability(rows)
    gate = cross.meta().gate
    if probability < gate:
        return Verdict(False, f"pair model {probability:.3f} below {gate:.3f}")
    return Verdict(True, f"pair model {probability:.3f}", final=False)


def by_cross(similarity: float, words: Verdict, score: float) -> Verdict:
    """The verdict on a pair by_words left to the cross-encoder (`words`), given its score."""
    threshold = cross.meta().threshold
    if score < threshold:
        return Verdict(False, f"{words.reason}; cross-encoder {score:.2f} below {threshold:.2f}")
    return Verdict(True, f"cosine {similarity:.3f}, {words.reason}, cross-encoder {score:.2f}")


def cross_texts(a: str, b: str) -> tuple[str, str]:
    """What the cross-encoder reads of a pair: both prompts as the cache normalizes them."""
    return normalize_prompt(a), normalize_prompt(b)


def cross_score(a: str, b: str) -> float:
    (score,) = cross.shared_scorer().score([cross_texts(a, b)])
    return score


def _verdict(a: str, b: str, similarity: float, threshold: float) -> tuple[Verdict, list[float] | None]:
    """The steps before the pair models: a verdict, or (a placeholder and) the lexical features."""
    if similarity < threshold:
        return Verdict(False, f"cosine {similarity:.3f} below {threshold:.2f}"), None
    if normalize_prompt(a) == normalize_prompt(b):
        return Verdict(True, "same prompt"), None
    if max(len(a), len(b)) > SEMANTIC_MAX_CHARS:
        return Verdict(False, f"longer than {SEMANTIC_MAX_CHARS} characters: served only for the same prompt"), None
    ta, tb = tokens(a), tokens(b)
    if checks.wordless(ta) or checks.wordless(tb):
        return Verdict(
            False, "no words (emoji, punctuation or control characters): served only for the same prompt"
        ), None
    if checks.same_words(ta, tb):
        return Verdict(True, "the same words"), None
    if not (checks.in_english(a) and checks.in_english(b)):
        return Verdict(False, "not in English: served only for the same words"), None
    payloads_a, instruction_a = split_payload(a)
    payloads_b, instruction_b = split_payload(b)
    pasted = bool(payloads_a and payloads_b)
    if pasted and payloads_a != payloads_b:
        return Verdict(False, "pasted or quoted text differs"), None
    # With the same text pasted, only the instructions around it can differ.
    ta, tb = (tokens(instruction_a), tokens(instruction_b)) if pasted else (ta, tb)
    reason = checks.first_difference(ta, tb)
    if reason:
        return Verdict(False, reason), None
    return _UNDECIDED, features.pair_features(ta, tb, similarity, pasted=pasted)


_UNDECIDED = Verdict(False, "undecided")


def warm_up() -> None:
    """Load what verify() reads on first use and is slow to load: the language identifier (half a
    second), MiniLM's word-piece table the pair features read (30,522 x 384, centred and normalised:
    a few hundred milliseconds on a loaded host, which the first lookup to reach the pair model paid
    inside its 500 ms and failed open), the pair model's weights and the cross-encoder (exported on
    the very first run) with a first pair scored."""
    checks.in_english("warm up the language identifier")
    verdict = by_words("How do I warm up the verifier?", "how can i warm up the verifier", 0.99)
    if not verdict.reason.startswith("pair model"):
        raise RuntimeError(f"the verifier's warm-up pair did not reach the pair model: {verdict.reason}")
    cross_score("How do I warm up the verifier?", "how can i warm up the verifier")
