"""Synthetic cache contents for the cache-scale benchmark: prompts from templates, embedded with the
project's embedder, and entry vectors derived from them, laid out over tenants and partitions the way
the gateway files them.

Random vectors are a poor stand-in for prompt embeddings (they spread evenly over all 384 dimensions,
so nearest-neighbour search behaves differently on them); here every entry is a real prompt embedding
mixed with a second prompt of the same topic and a little noise, so a partition's entries crowd
together the way a single application's prompts do.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np

# Topics, each a few templates and the values they are filled with. A partition (one application's
# system prompt and model, or one conversation) draws its prompts from one topic.
TOPICS: dict[str, tuple[list[str], dict[str, list[str]]]] = {
    "support": (
        [
            "How do I {action} my {product} account?",
            "I can't {action} my {product} account, what should I do?",
            "Is it possible to {action} my {product} subscription before the billing cycle ends?",
            "What happens to my data if I {action} my {product} plan?",
            "Can you help me {action} the {product} order I placed {when}?",
        ],
        {
            "action": ["reset", "cancel", "upgrade", "downgrade", "pause", "transfer", "close", "verify", "unlock"],
            "product": ["StreamBox", "Nimbus Wear", "CloudNest", "FitTrack", "PayLite", "Shopora", "MealMate"],
            "when": ["yesterday", "last week", "this morning", "two days ago", "last month"],
        },
    ),
    "shipping": (
        [
            "How long does {speed} shipping to {country} take?",
            "My package to {country} says delivered but I never got it, what now?",
            "Do you ship {item} to {country} and what does {speed} delivery cost?",
            "Can I change the delivery address of my {item} order to {country}?",
        ],
        {
            "speed": ["standard", "express", "overnight", "economy", "two-day"],
            "country": ["Canada", "Germany", "Japan", "Brazil", "Australia", "Mexico", "France", "India", "Kenya"],
            "item": ["furniture", "electronics", "clothing", "books", "perfume", "batteries", "plants"],
        },
    ),
    "coding": (
        [
            "How do I {task} in {lang}?",
            "What is the fastest way to {task} in {lang} for a large input?",
            "Write a {lang} function to {task}.",
            "Why does my {lang} code fail when I try to {task}?",
            "Explain how to {task} in {lang} with an example.",
        ],
        {
            "task": [
                "reverse a list",
                "sort a dictionary by value",
                "read a CSV file",
                "parse JSON",
                "merge two sorted arrays",
                "remove duplicates from a list",
                "make an HTTP request",
                "handle a timeout",
                "connect to PostgreSQL",
                "write unit tests",
                "format a date",
                "split a string on commas",
            ],
            "lang": ["Python", "JavaScript", "Go", "Rust", "Java", "C#", "Ruby", "TypeScript", "Kotlin"],
        },
    ),
    "cooking": (
        [
            "How long should I {method} {food}?",
            "What temperature do I {method} {food} at?",
            "Give me a quick recipe to {method} {food} for {people} people.",
            "Can I {method} {food} without {tool}?",
        ],
        {
            "method": ["bake", "grill", "roast", "boil", "steam", "air fry", "slow cook", "poach"],
            "food": ["chicken breast", "salmon", "potatoes", "broccoli", "eggs", "pork chops", "tofu", "rice"],
            "people": ["two", "four", "six", "eight"],
            "tool": ["an oven", "a thermometer", "oil", "a lid", "foil"],
        },
    ),
    "travel": (
        [
            "What are the best things to do in {city} in {season}?",
            "Do I need a visa to visit {city} from {country}?",
            "How many days should I spend in {city} on a first trip?",
            "What is the cheapest way to get from the airport to central {city}?",
        ],
        {
            "city": ["Lisbon", "Tokyo", "Prague", "Cape Town", "Montreal", "Seoul", "Lima", "Istanbul", "Oslo"],
            "season": ["spring", "summer", "autumn", "winter"],
            "country": ["the US", "the UK", "India", "Brazil", "Australia"],
        },
    ),
    "finance": (
        [
            "What is the difference between a {a} and a {b}?",
            "Should I put my savings in a {a} or a {b} when rates are {rates}?",
            "How is a {a} taxed in {country}?",
        ],
        {
            "a": ["Roth IRA", "401k", "index fund", "bond ladder", "savings account", "CD", "money market fund"],
            "b": ["traditional IRA", "brokerage account", "ETF", "treasury bill", "HSA", "annuity"],
            "rates": ["rising", "falling", "high", "low"],
            "country": ["the US", "Canada", "the UK", "Germany"],
        },
    ),
    "health": (
        [
            "How much {thing} should an adult {verb} each day?",
            "Is it bad to {verb} {thing} right before bed?",
            "What are the signs of too little {thing}?",
        ],
        {
            "thing": ["water", "protein", "sleep", "caffeine", "fiber", "vitamin D", "exercise", "sugar"],
            "verb": ["get", "have", "take", "consume"],
        },
    ),
    "writing": (
        [
            "Write a {tone} email to {who} about {topic}.",
            "Give me {n} title ideas for a blog post about {topic}.",
            "Rewrite this in a {tone} tone: we need to talk about {topic}.",
            "Summarize the key points of a memo about {topic} for {who}.",
        ],
        {
            "tone": ["polite", "formal", "friendly", "firm", "apologetic", "enthusiastic"],
            "who": ["my manager", "a customer", "the team", "a landlord", "a recruiter"],
            "topic": [
                "remote work",
                "a delayed project",
                "the new vacation policy",
                "a price increase",
                "an office move",
                "quarterly results",
            ],
            "n": ["three", "five", "ten"],
        },
    ),
    "legal": (
        [
            "How long does a landlord have to return a {thing} in {state}?",
            "Can my employer {act} without notice in {state}?",
            "What is the difference between {thing} and {other} under {state} law?",
        ],
        {
            "thing": ["security deposit", "trademark", "copyright", "non-compete clause", "lease termination"],
            "other": ["a patent", "a contract", "a license", "an NDA"],
            "act": ["cut my hours", "change my shift", "withhold my pay", "fire me", "read my email"],
            "state": ["California", "Texas", "New York", "Florida", "Ontario", "Washington"],
        },
    ),
    "math": (
        [
            "What is the probability of rolling {k} {face}s with {n} dice?",
            "How do I calculate the {stat} of {what}?",
            "Explain {concept} to a {level} student.",
        ],
        {
            "k": ["two", "three", "no"],
            "face": ["six", "one", "four"],
            "n": ["two", "three", "five"],
            "stat": ["mean", "median", "standard deviation", "variance", "percentile"],
            "what": ["a list of grades", "monthly sales", "response times", "house prices"],
            "concept": ["derivatives", "compound interest", "prime numbers", "matrices", "logarithms"],
            "level": ["middle school", "high school", "college"],
        },
    ),
    "howto": (
        [
            "How do I {fix} my {device}?",
            "My {device} keeps {problem}, how do I fix it?",
            "What is the best way to {fix} a {device} that keeps {problem}?",
        ],
        {
            "fix": ["reset", "update", "clean", "back up", "restart", "factory reset"],
            "device": ["Wi-Fi router", "iPhone", "laptop", "smart TV", "printer", "dishwasher", "car battery"],
            "problem": ["disconnecting", "overheating", "freezing", "beeping", "draining fast"],
        },
    ),
    "science": (
        [
            "Why is the {thing} {color}?",
            "How does {process} work?",
            "What would happen if {thing} stopped {verb}?",
        ],
        {
            "thing": ["sky", "ocean", "sun", "moon", "grass", "blood"],
            "color": ["blue", "red", "green", "orange"],
            "process": ["photosynthesis", "vaccination", "nuclear fusion", "evaporation", "plate tectonics"],
            "verb": ["moving", "shining", "spinning"],
        },
    ),
}

# Filler for 20-word prompts (the embedding target is per 20-word prompt).
_LEADS = ["Please", "Could you", "I would like you to", "Kindly", "Can you"]
_TAILS = [
    "and keep the answer short and practical for a beginner",
    "with a clear example I can follow step by step today",
    "and mention any common mistakes people usually make here",
    "in plain words so that my whole team can understand it",
]


def topic_prompts(topic: str) -> list[str]:
    """Every prompt the topic's templates make, in a fixed order."""
    templates, slots = TOPICS[topic]
    found = []
    for template in templates:
        names = [n for n in slots if "{" + n + "}" in template]
        for values in itertools.product(*(slots[n] for n in names)):
            found.append(template.format(**dict(zip(names, values, strict=True))))
    return found


# How people dress the same question differently; a cache keeps such variants apart whenever the
# verifier did not accept one for another, so a busy partition holds many near-duplicates.
_OPENERS = ["", "", "Quick question: ", "Hi, ", "Hey, ", "Please tell me: ", "I was wondering, "]
_CLOSERS = ["", "", " Thanks!", " Please keep it short.", " I need this today.", " Explain briefly."]


def prompt_pool(size: int, seed: int = 5) -> tuple[list[str], np.ndarray]:
    """`size` distinct prompts spread evenly over the topics (template prompts, some with an opener or
    a closer), and each one's topic number."""
    rng = np.random.default_rng(seed)
    per_topic = -(-size // len(TOPICS))
    texts: list[str] = []
    labels: list[int] = []
    for number, topic in enumerate(TOPICS):
        bases = topic_prompts(topic)
        chosen: set[str] = set()
        while len(chosen) < min(per_topic, len(bases) * len(_OPENERS) * len(_CLOSERS) // 2):
            base = bases[rng.integers(len(bases))]
            chosen.add(_OPENERS[rng.integers(len(_OPENERS))] + base + _CLOSERS[rng.integers(len(_CLOSERS))])
        texts.extend(sorted(chosen))
        labels.extend([number] * len(chosen))
    order = rng.permutation(len(texts))[:size]
    return [texts[i] for i in order], np.asarray(labels, dtype=np.int32)[order]


def twenty_word_prompts(count: int, seed: int = 20) -> list[str]:
    """Prompts of exactly 20 words: a topic prompt with a lead and a tail, trimmed or padded."""
    rng = np.random.default_rng(seed)
    pool, _ = prompt_pool(max(count, 50), seed=seed)
    found = []
    for i in range(count):
        words = (
            f"{_LEADS[i % len(_LEADS)]} answer this: {pool[i % len(pool)]} {_TAILS[i % len(_TAILS)]}"
            " and thanks a lot in advance for all of your help"
        ).split()
        found.append(" ".join(words[:20]))
        rng.random()
    return found


# --- tenants and partitions --------------------------------------------------------------------

BUCKETS = ((1, 100), (100, 1_000), (1_000, 10_000), (10_000, None))  # partition sizes, rows [low, high)


def bucket_name(size: int) -> str:
    for low, high in BUCKETS:
        if high is None or size < high:
            return f"{low:,}+ rows" if high is None else f"{low:,}–{high - 1:,} rows"
    raise AssertionError(size)


@dataclass(frozen=True)
class Partition:
    key: str  # what the gateway files it under (a sha256 hex, like gateway.cache.keys)
    tenant: int
    topic: int
    size: int


def layout(entries: int, tenants: int = 100, seed: int = 1) -> list[Partition]:
    """How `entries` spread over `tenants` and their partitions, as a gateway would file them.

    Tenants differ in size (a Zipf-like share, exponent 0.45: the largest holds about 20 times the
    smallest's entries). Inside a tenant: three applications with a fixed system prompt and model
    hold 40, 20 and 10 % of its entries, five features 3 % each, and the last 15 % are conversations
    (every earlier turn is part of the partition) of 1 to about 30 entries each."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, tenants + 1) ** 0.45
    per_tenant = np.floor(weights / weights.sum() * entries).astype(int)
    per_tenant[: entries - per_tenant.sum()] += 1
    partitions: list[Partition] = []
    topics = len(TOPICS)
    for tenant, count in enumerate(per_tenant.tolist()):
        sizes = [int(count * share) for share in (0.40, 0.20, 0.10, 0.03, 0.03, 0.03, 0.03, 0.03)]
        rest = count - sum(sizes)
        while rest > 0:
            size = min(rest, int(rng.geometric(0.2)))
            sizes.append(size)
            rest -= size
        for number, size in enumerate(s for s in sizes if s > 0):
            key = hashlib.sha256(f"tenant {tenant} partition {number} seed {seed}".encode()).hexdigest()
            partitions.append(Partition(key=key, tenant=tenant, topic=int(rng.integers(topics)), size=size))
    assert sum(p.size for p in partitions) == entries
    return partitions


# --- vectors -----------------------------------------------------------------------------------


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def derive(pool: np.ndarray, labels: np.ndarray, topic: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` entry vectors of one topic: a prompt of the topic plus up to half of each of two others of
    the same topic, plus a little noise, renormalised (a new prompt in the topic's neighbourhood)."""
    members = np.flatnonzero(labels == topic)
    mixed = pool[rng.choice(members, count)].copy()
    for _ in range(2):
        mixed += rng.uniform(0.0, 0.5, (count, 1)).astype(np.float32) * pool[rng.choice(members, count)]
    return unit(unit(mixed) + rng.normal(0.0, 0.012, mixed.shape).astype(np.float32))


def paraphrase_of(vectors: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A query vector near each given vector (cosine about 0.9), as a paraphrase's embedding is."""
    return unit(vectors + rng.normal(0.0, 0.025, vectors.shape).astype(np.float32))
