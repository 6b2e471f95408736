"""Moderation: a local check, and a provider's moderation endpoint through litellm.

The local check is conservative and hand-written (no offline library classifies harm without a
model download): phrases asking for serious harm or announcing it, per category, where a keyword
list alone would flag a history lesson or a crime novel. It catches blunt requests and misses
paraphrases; a tenant that needs more points its policy at a moderation provider, which sees the
text after the personal-data redactions.

The provider call is `litellm.amoderation` (OpenAI's /v1/moderations shape), bounded by a timeout.
An answer it cannot give (error, timeout, a malformed body) raises ModerationUnavailable: the
caller's outage policy decides what that means.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from gateway.screening.spans import Prefilter, Span, lowercase, lowered

MODERATION = "moderation"

# Category names follow OpenAI's moderation categories.
_PERSON = (
    r"(?:someone|somebody|anyone|a\s+person|people|him|her|them|(?:a|an|the|my|our|his|her|their)\s+(?:\w+\s+)?"
    r"(?:man|woman|child|kid|baby|girl|boy|teacher|cop|police(?:\s+officer)?|officer|president|neighbou?r|coworker|"
    r"colleague|classmate|boss|wife|husband|girlfriend|boyfriend|ex|partner|mother|father|mom|dad|brother|sister|"
    r"family|witness|landlord|roommate|friend|son|daughter|student|students|people|person|crowd|politician))"
)
_MAKE = (
    r"(?:cook(?:ing)?|mak(?:e|ing)|synthesi[sz](?:e|ing)|manufactur(?:e|ing)|produc(?:e|ing)|brew(?:ing)?|"
    r"extract(?:ing)?)"
)
_HOW = (
    r"(?:how\s+(?:do\s+i|can\s+i|to|would\s+i|should\s+i)|help\s+me|teach\s+me\s+(?:how\s+)?to|best\s+way\s+to|"
    r"(?:most\s+\w+|easiest|quickest)\s+way\s+to|step[- ]by[- ]step(?:\s+(?:guide|instructions))?\s+(?:to|for)|"
    r"instructions?\s+(?:to|for)|recipe\s+for|guide\s+(?:to|for))"
)
# Category names follow OpenAI's moderation categories.
_CATEGORIES: dict[str, str] = {
    "violence": (
        _HOW + r"\s+(?:\w+\s+){0,2}?(?:kill(?:ing)?|murder(?:ing)?|poison(?:ing)?|stab(?:bing)?|strangl(?:e|ing)|"
        r"shoot(?:ing)?|behead(?:ing)?|tortur(?:e|ing)|kidnap(?:ping)?|assassinat(?:e|ing)|hurt(?:ing)?|maim(?:ing)?|"
        r"cripple|beat(?:ing)?\s+up)\s+" + _PERSON + r"\b"
        r"|" + _HOW + r"\s+(?:(?:\w+\s+){0,2}?(?:make|build|assemble|construct)(?:ing)?\s+)?(?:a\s+|an\s+)?"
        r"(?:pipe\s+|nail\s+|car\s+|fertili[sz]er\s+|suicide\s+)?(?:bomb|explosive\s+device|ied|molotov(?:\s+cocktail)?|"
        r"grenade)s?\b(?!\s+(?:disposal|squad|shelter|threat))"
        r"|\bi(?:'m|\s+am)\s+going\s+to\s+(?:kill|shoot|stab|murder)\s+(?:him|her|them|you|my|everyone|people)"
        r"|\b(?:plan(?:ning)?|carry\s+out)\s+(?:a\s+)?(?:mass\s+shooting|school\s+shooting|terrorist\s+attack)"
    ),
    "self-harm": (
        r"\b(?:i\s+(?:want|plan|am\s+going|'m\s+going)\s+to\s+(?:kill\s+myself|end\s+(?:my\s+life|it\s+all)|die|"
        r"commit\s+suicide|hurt\s+myself|cut\s+myself)|(?:best|easiest|painless|quickest)\s+(?:way|method)s?\s+"
        r"(?:to|of)\s+(?:kill(?:ing)?\s+(?:myself|yourself|oneself)|suicide|commit(?:ting)?\s+suicide|die)"
        r"|how\s+(?:many|much)\s+(?:\w+\s+){0,3}?(?:would|will|does|do|to)\s+(?:it\s+)?(?:take\s+to\s+)?(?:kill\s+(?:me|"
        r"myself)|overdose|die)|how\s+(?:do\s+i|to|can\s+i)\s+(?:kill\s+myself|commit\s+suicide|cut\s+myself|"
        r"end\s+my\s+(?:own\s+)?life)|i\s+don'?t\s+want\s+to\s+(?:live|be\s+alive)\s+anymore)"
    ),
    "sexual/minors": (
        r"\b(?:nude|naked|erotic|porn\w*|sexy|sext\w*|undress\w*|sexual(?:ly)?\s+(?:explicit|acts?|content|images?|"
        r"photos?|pictures?|encounters?|story|stories|roleplay|role-play|fantas(?:y|ies))|explicit\s+(?:photos?|images?|"
        r"pictures?|content|story))\b[^.?!\n]{0,60}?\b(?:child(?:ren)?|kids?|minors?|underage|preteens?|"
        r"\d{1,2}[- ]year[- ]old|(?:little|young)\s+(?:girls?|boys?)|schoolgirls?|schoolboys?)\b"
        r"|\b(?:child(?:ren)?|kids?|minors?|underage|preteens?|(?:little|young)\s+(?:girls?|boys?))\b[^.?!\n]{0,40}?"
        r"\b(?:nude|naked|erotic|porn\w*|sexy|sexual(?:ly)?\s+(?:explicit|acts?|content|abuse\s+material))\b"
        r"|\bsex\s+with\s+(?:a\s+)?(?:child|minor|kid|\d{1,2}[- ]year[- ]old)|\bcsam\b|\bchild\s+porn"
    ),
    "hate": (
        r"\b(?:all|every)\s+(?:\w+\s+){0,2}?(?:jews|muslims|christians|blacks|whites|asians|arabs|immigrants|gays|"
        r"women|men|mexicans|refugees|hindus)\s+(?:should|must|deserve\s+to|need\s+to)\s+(?:be\s+)?"
        r"(?:die|killed|exterminated|gassed|eradicated|wiped\s+out|burn(?:ed)?|hang(?:ed)?|deported\s+or\s+killed)"
        r"|\b(?:exterminate|eradicate|wipe\s+out|gas)\s+(?:all\s+)?(?:the\s+)?(?:jews|muslims|christians|blacks|"
        r"whites|asians|arabs|immigrants|gays|mexicans|refugees|hindus)"
        r"|\b(?:jews|muslims|blacks|immigrants|gays|refugees)\s+are\s+(?:\w+\s+)?(?:subhuman|vermin|animals|parasites|"
        r"a\s+disease)"
    ),
    "illicit": (
        _HOW + r"\s+(?:\w+\s+){0,3}?" + _MAKE + r"\s+(?:\w+\s+)?(?:meth(?:amphetamine)?|fentanyl|heroin|"
        r"crack\s+cocaine|cocaine|sarin|vx\s+nerve|nerve\s+agents?|ricin|anthrax|mustard\s+gas|chemical\s+weapons?|"
        r"bioweapons?)"
        r"|\b(?:synthesi[sz]e|weaponi[sz]e)\s+(?:sarin|vx|ricin|anthrax|smallpox|nerve\s+agents?)"
    ),
}
# A category's pattern is only tried on text that holds one of its words (a substring search each),
# so a long prompt about something else costs microseconds.
_ANCHORS = {
    "violence": (
        "kill",
        "murder",
        "poison",
        "stab",
        "strangl",
        "shoot",
        "behead",
        "tortur",
        "kidnap",
        "assassinat",
        "hurt",
        "maim",
        "crippl",
        "beat",
        "bomb",
        "explosive",
        "ied",
        "molotov",
        "grenade",
        "terrorist",
    ),
    "self-harm": ("myself", "suicide", "overdose", "die", "end it all", "my life", "alive", "oneself", "yourself"),
    "sexual/minors": (
        "nude",
        "naked",
        "erotic",
        "porn",
        "sexy",
        "sext",
        "undress",
        "sexual",
        "explicit",
        "sex",
        "csam",
    ),
    "hate": (
        "jews",
        "muslims",
        "christians",
        "blacks",
        "whites",
        "asians",
        "arabs",
        "immigrants",
        "gays",
        "women",
        "men",
        "mexicans",
        "refugees",
        "hindus",
    ),
    "illicit": (
        "meth",
        "fentanyl",
        "heroin",
        "cocaine",
        "sarin",
        "vx",
        "nerve agent",
        "ricin",
        "anthrax",
        "mustard gas",
        "chemical weapon",
        "bioweapon",
        "smallpox",
    ),
}
CATEGORIES = tuple(_CATEGORIES)
_LOCAL = [
    (category, _ANCHORS[category], re.compile(pattern, re.IGNORECASE), lowered(pattern))
    for category, pattern in _CATEGORIES.items()
]

_PREFILTER = Prefilter([any_case for _, _, any_case, _ in _LOCAL])


def find(text: str) -> list[Span]:
    """Spans the local check flags (the span's check is the category, e.g. `self-harm`)."""
    spans = []
    folded = lowercase(text)
    lowered_text = folded if folded is not None else text.lower()
    candidates = _PREFILTER.candidates(text)
    for index, (category, anchors, any_case, lower_case) in enumerate(_LOCAL):
        if index not in candidates or not any(anchor in lowered_text for anchor in anchors):
            continue
        match = lower_case.search(folded) if folded is not None else any_case.search(text)
        if match:
            spans.append(Span(category, match.start(), match.end()))
    return spans


class ModerationUnavailable(Exception):
    """The moderation provider gave no usable answer (its kind, never the text, in the message)."""


@dataclass(frozen=True)
class ModerationProvider:
    """Where a tenant's moderation calls go: resolved once per process from a gateway Provider."""

    model: str
    api_base: str | None
    api_key: str | None
    timeout: float


async def moderate(provider: ModerationProvider, text: str) -> list[str]:
    """The categories the provider flags `text` for (empty: not flagged)."""
    import litellm

    try:
        response = await asyncio.wait_for(
            litellm.amoderation(
                input=text,
                model=provider.model,
                api_key=provider.api_key or "sk-none",
                api_base=provider.api_base,
                timeout=provider.timeout,
                max_retries=0,
            ),
            provider.timeout,
        )
        results = response.results
        flagged = []
        for result in results:
            categories = result.categories
            if not isinstance(categories, dict):
                categories = categories.model_dump(by_alias=True) if categories is not None else {}
            # OpenAI's names (self-harm, sexual/minors); litellm adds snake_case copies of them.
            flagged += [name for name, value in categories.items() if value and "_" not in name]
            if result.flagged and not flagged:
                flagged.append("flagged")
        return sorted(set(flagged))
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        raise ModerationUnavailable("timeout") from None
    except Exception as exc:  # noqa: BLE001 - any failure of the provider is an outage, by policy
        raise ModerationUnavailable(type(exc).__name__) from None
