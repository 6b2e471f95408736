"""`model: "auto"`: a local classifier that sends simple prompts to the tenant's `fast` model and
demanding ones (reasoning, proofs and math, writing or debugging real code, design and analysis,
multi-part tasks) to its `smart` model, with the reason it chose.

Hand-written on purpose: a few precompiled regular expressions over the conversation's user text,
scored with weights read off tests/data/routing_eval.jsonl's dev half (`manage.py route_eval` reports
both halves). No model, no network, a few microseconds per prompt (bench/routing.py), so it can sit
on the request path before admission. A learned model would need a labeled corpus much larger than
ours to beat cues this explicit, and would cost a dependency and milliseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FAST = "fast"
SMART = "smart"
AUTO_MODEL = "auto"
THRESHOLD = 2.0
# Only the last user message is read (a long history of easy turns is not a hard request), and of a
# long one only its head and tail, where instructions are (pasted material sits between): the
# classifier's time stays bounded whatever the request's length.
HEAD_CHARS, TAIL_CHARS = 2000, 1000


def _cues(*words: str) -> re.Pattern:
    return re.compile(r"\b(?:" + "|".join(words) + r")\b")


# Cues are matched against the lowercased text (five times faster than case-insensitive patterns).
# Each feature counts once, however often its cues appear.
_REASONING = _cues(
    r"step[- ]by[- ]step",
    r"show(?:ing)? (?:your|the|each) (?:reasoning|work|steps?|calculations?)",
    r"explain (?:why|how|each|your)",
    r"walk (?:me )?through",
    r"reason(?:ing)? through",
    r"justify",
    r"derive",
    r"prove",
    r"proof",
    r"why (?:does|is|isn't|can't|doesn't|do|would)",
    r"what (?:happens|would happen)",
    r"figure out",
    r"how would you",
    r"how does [^?.]{3,60} (?:guarantee|ensure|prevent|work)",
    r"why it matters",
    r"model the",
)
_MATH = _cues(
    r"integral",
    r"derivative",
    r"eigen\w*",
    r"matri(?:x|ces)",
    r"probabilit\w*",
    r"expected (?:value|number)",
    r"recurrence",
    r"induction",
    r"irrational",
    r"primes?",
    r"theorem",
    r"how many ways",
    r"solutions? of",
    r"statistically significant",
    r"confidence interval",
    r"compound",
    r"complexity",
    r"paradox",
)
_EQUATION = re.compile(r"[a-z0-9)\]]\s*(?:\^|\*\*)\s*[a-z0-9(]|\b[a-z]\s*\(\s*n\s*/|\d\s*[-+*/]\s*\d.*=")
_DESIGN = _cues(
    r"design(?:ing)? (?:a|an|the)",
    r"architecture",
    r"trade-?offs?",
    r"pros and cons",
    r"analy[sz]e",
    r"evaluate",
    r"critique",
    r"recommend (?:one|how|which)",
    r"justify",
    r"scal(?:e|ing) to",
    r"consistency",
    r"threat model",
    r"root cause",
    r"migrat\w+",
    r"risks?",
    r"postmortem",
    r"methodology",
    r"implications",
    r"essay",
    r"for and against",
    r"arguing",
)
_COMPARE = _cues(r"compare", r"comparison", r"versus", r"vs\.?")
_CODE_TASK = _cues(
    r"implement\w*",
    r"refactor\w*",
    r"debug\w*",
    r"find the bug",
    r"fix (?:it|the bug|this bug)",
    r"review this",
    r"optimi[sz]e",
    r"deadlocks?",
    r"race conditions?",
    r"memory leak",
    r"unit tests?",
    r"with tests",
    r"include tests",
    r"thread-safe",
    r"concurren\w+",
    r"async/await",
    r"window functions?",
    r"slow",
)
_BUILD = re.compile(
    r"\b(?:write|create|build|implement)\b[^.?!\n]{0,60}\b(?:program|script|app|application|service|hook|class|"
    r"system|server|crawler|parser|cache|limiter|deployment|model and migration|algorithm)\b"
)
_CODE_BLOCK = re.compile(r"```|^(?: {4}|\t)\S", re.MULTILINE)
_CODE_LINE = re.compile(
    r"^\s*(?:def |class |func |fn |function |import |from \S+ import|#include|public |private |const |let |var |"
    r"if .*[:{]\s*$|for .*[:{]\s*$|while .*[:{]\s*$|return |SELECT |\w+\s*=\s*\S)",
    re.MULTILINE,
)
_PARTS = re.compile(r"^\s*(?:\(?\d+[.)]|[-*•]\s)|\b(?:first|then|finally|next|after that|for each)\b[, ]", re.MULTILINE)
_CONSTRAINTS = _cues(
    r"without (?:using|downtime)",
    r"at least",
    r"at most",
    r"exactly-once",
    r"under \d",
    r"within \d",
    r"must",
    r"guarantee\w*",
    r"budget of",
    r"handl(?:e|es|ing) \d",
    r"\d[\d,]* (?:requests|writes|reads|events|users|rows) (?:per|a) (?:second|day)",
)
_SIMPLE = _cues(
    r"translate",
    r"in one (?:sentence|word|line|paragraph)",
    r"in (?:two|three) (?:sentences|words)",
    r"briefly",
    r"keep it short",
    r"one-line",
    r"tl;dr",
    r"summari[sz]e",
    r"fix (?:the|any) (?:grammar|typos|spelling)",
    r"correct the spelling",
    r"synonym",
    r"like i'?m (?:five|5)",
    r"in simple terms",
    r"extract",
    r"sort these",
    r"sort them",
    r"just",
)


@dataclass(frozen=True)
class Choice:
    route: str  # FAST | SMART
    reason: str
    score: float


def user_text(messages: list) -> str:
    """The text of the conversation's last user message (its text parts, when a list)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            return (content or "") if isinstance(content, str) else ""
    return ""


def classify(messages: list) -> Choice:
    text = user_text(messages)
    if len(text) > HEAD_CHARS + TAIL_CHARS:
        text = text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]
    words = len(text.split())
    low = text.lower()
    code_lines = len(_CODE_LINE.findall(text))
    has_code = bool(_CODE_BLOCK.search(text)) or code_lines >= 3
    parts = len(_PARTS.findall(low))
    questions = text.count("?")
    features: list[tuple[float, str]] = []

    def feature(weight: float, reason: str, present: bool) -> None:
        if present:
            features.append((weight, reason))

    feature(2.5, "multi-step reasoning", bool(_REASONING.search(low)))
    feature(2.0, "math", bool(_MATH.search(low)) or bool(_EQUATION.search(low)))
    feature(2.0, "design or analysis", bool(_DESIGN.search(low)))
    feature(1.0, "comparison", bool(_COMPARE.search(low)))
    feature(2.5, "code task", bool(_CODE_TASK.search(low)))
    feature(2.0, "writing a program", bool(_BUILD.search(low)))
    feature(1.5, "code to work on", has_code and code_lines >= 5)
    feature(1.5, "multi-part task", parts >= 3 or questions >= 3)
    feature(1.0, "constraints", bool(_CONSTRAINTS.search(low)))
    feature(1.0, "long request", words >= 60)
    feature(1.0, "explanation asked", words >= 12 and "explain" in low)
    feature(-2.5, "simple task", bool(_SIMPLE.search(low)))
    feature(-1.5, "short question", words <= 8 and not has_code)
    score = sum(weight for weight, _ in features)
    if score >= THRESHOLD:
        reason = max((f for f in features if f[0] > 0), key=lambda f: f[0])[1]
        return Choice(SMART, reason, score)
    reason = "simple task" if any(r == "simple task" for _, r in features) else "short or simple request"
    return Choice(FAST, reason, score)
