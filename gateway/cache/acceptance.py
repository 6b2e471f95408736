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
4. the pair model (verifier/model.py, trained on labeled pairs: verifier/features.py) rates the
   two as the same request with at least its threshold's probability, or, for a pair it leaves
   just under, the context model does, reading also how the two prompts' word pieces align in
   MiniLM's fourth layer (verifier/context.py).

Serving a wrong answer costs far more than a miss, so every step errs towards a miss.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

from gateway.cache.verifier import checks, features
from gateway.cache.verifier import context as verifier_context
from gateway.cache.verifier.context import Encoded
from gateway.cache.verifier.model import context_cuts, context_gate, context_model, pair_model
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
    # False for by_words' acceptance of a pair the context model has still to decide.
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
    context: tuple[Encoded, Encoded] | None = None,
) -> Verdict:
    """May the cached answer to prompt `a` be served for prompt `b`? `similarity` is the cosine of
    the two prompt embeddings (the cache has it from the vector search); `context` their
    fourth-layer encodings (verifier/context.py), computed here if needed and not given.
    Deterministic and symmetric; a rejection says what differed."""
    verdict, rows = by_words(a, b, similarity, threshold)
    if verdict.final:
        return verdict
    return by_context(rows, similarity, verdict, context or _encode(a, b))


def by_words(a: str, b: str, similarity: float, threshold: float = DEFAULT_THRESHOLD) -> tuple[Verdict, list[float]]:
    """verify without the context model: its verdict where the words decide (final), else an
    acceptance that is not final (a candidate worth encoding) and the lexical features that
    by_context goes on from. What the cache asks first."""
    verdict, rows = _verdict(a, b, similarity, threshold)
    if rows is None:
        return verdict, []
    model = pair_model()
    probability = model.probability(rows)
    if probability >= model.threshold:
        return Verdict(True, f"cosine {similarity:.3f}, pair model {probability:.3f}"), rows
    below = f"pair model: {probability:.3f} below {model.threshold:.3f}"
    if probability < context_gate():
        return Verdict(False, below), rows
    return Verdict(True, below, final=False), rows


def by_context(rows: list[float], similarity: float, words: Verdict, context: tuple[Encoded, Encoded]) -> Verdict:
    """The context model's verdict on a pair by_words left to it (`words`, with its features `rows`),
    given both prompts' fourth-layer encodings."""
    model = context_model()
    probability = model.probability(rows + verifier_context.context_features(*context, context_cuts()))
    if probability < model.threshold:
        return Verdict(False, f"{words.reason}; context model {probability:.3f} below {model.threshold:.3f}")
    return Verdict(True, f"cosine {similarity:.3f}, context model {probability:.3f}")


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
    inside its 500 ms and failed open) and the pair models' weights."""
    checks.in_english("warm up the language identifier")
    verdict, _ = by_words("How do I warm up the verifier?", "how can i warm up the verifier", 0.99)
    if not verdict.reason.startswith(("cosine", "pair model")):
        raise RuntimeError(f"the verifier's warm-up pair did not reach the pair model: {verdict.reason}")
    context_model()
    context_cuts()


def context_texts(a: str, b: str) -> tuple[str, str]:
    """What the fourth layer reads of each prompt: the prompt as the cache normalizes it."""
    return normalize_prompt(a), normalize_prompt(b)


def _encode(a: str, b: str) -> tuple[Encoded, Encoded]:
    first, second = verifier_context.shared_encoder().encode(context_texts(a, b))
    return first, second
