"""The pair model's contextual features: how well two prompts' word pieces align in MiniLM's fourth
layer (BERTScore-like: each piece's best match in the other prompt).

The lexical features (features.py) see words and their input embeddings, so "kitchen" and
"bathroom" look as alike as "repair" and "fix"; the last hidden state, the one the cache's embedding
pools, is as blind. The middle layers keep a word's identity and add its context: measured
offline (bench/verifier_context.py, docs/cache.md), layer 4 served about half as many paraphrases
again at the same 1% of wrong hits on topics the model never saw.

The states come from the transformer cut after its fourth layer (the packaged weights, exported
once to ONNX beside the embedder's export and run with onnxruntime: about 1 ms for two short
prompts), run only for a candidate that has passed every other step, in the embedder's thread.
Every feature is symmetric.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gateway.cache.embedder import default_model_dir, exported_runner, weights_digest, write_atomically
from gateway.cache.verifier.text import LIGHT_WORDS, STOPWORDS

if TYPE_CHECKING:
    from collections.abc import Sequence

LAYER = 4
EXPORT_VERSION = 2  # 2: eager attention
NAMES = (
    "ctx_piece_f",  # BERTScore F over all word pieces
    "ctx_piece_min_pr",  # the smaller of its precision and recall
    "ctx_piece_idf_f",  # the same, pieces weighted by rarity (log of the word-piece rank)
    "ctx_content_mean",  # mean best match of content words (both sides)
    "ctx_content_idf_mean",  # rarity-weighted
    "ctx_worst",  # the worst-aligned content word's best match
    "ctx_second_worst",
    "ctx_worst_gap",  # how far apart the two sides' worst-aligned content words are
    "ctx_below_a",  # content words whose best match is below the three cuts (both sides)
    "ctx_below_b",
    "ctx_below_c",
    "ctx_worst_rarity",  # rarity of the worst-aligned content word
    "ctx_worst_x_rarity",  # (1 - worst) * rarity
    "ctx_mutual_share",  # content words whose best match has them as its best match too
    "ctx_content_f",  # F over content words only, against the other side's content words
)
_SKIP = STOPWORDS | LIGHT_WORDS


@dataclass(frozen=True, slots=True)
class Encoded:
    """One prompt in the fourth layer: word pieces (without [CLS] and [SEP]) and words (a word's
    vector is the mean of its pieces'), unit vectors."""

    ids: np.ndarray
    pieces: np.ndarray
    words: np.ndarray
    word_rank: np.ndarray  # rarity of each word: log(1 + its rarest piece's rank)
    content: np.ndarray  # bool per word: not a stop word or a light word, letters and digits only


def onnx_path(cache_dir: Path, model_dir: Path, *, quantized: bool = False) -> Path:
    suffix = "-int8" if quantized else ""
    return cache_dir / f"all-MiniLM-L6-v2-{weights_digest(model_dir)}-layer{LAYER}-v{EXPORT_VERSION}{suffix}.onnx"


def export_onnx(model_dir: Path, target: Path) -> None:
    """The embeddings and the first LAYER transformer layers as one ONNX graph; its output is the
    hidden state after them (transformers' hidden_states[LAYER])."""
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a process's log lines are JSON, one a line
    # Attention written out in plain operators (not scaled_dot_product_attention's export): 101
    # fewer nodes in the int8 graph and about 7% less time a prompt (2.07-2.13 against 2.25-2.28 ms
    # for 62 word pieces), with the same verdict on every labeled candidate (docs/cache.md).
    bert = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    bert.encoder.layer = bert.encoder.layer[:LAYER]

    class _Cut(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids)
            ).last_hidden_state

    sample = torch.ones((2, 16), dtype=torch.int64)

    def write(tmp: Path) -> None:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Cut().eval(),
                (sample, torch.ones_like(sample)),
                str(tmp),
                input_names=["input_ids", "attention_mask"],
                output_names=["hidden"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "tokens"},
                    "attention_mask": {0: "batch", 1: "tokens"},
                    "hidden": {0: "batch", 1: "tokens"},
                },
                opset_version=17,
                dynamo=False,
            )

    write_atomically(target, write)


class ContextEncoder:
    """Runs the cut transformer on prompts. `cache_dir` holds the export (written on first use).

    Quantized (int8, per output channel) by default: it halves the verifier's p99 against the
    unquantized cut (docs/cache.md: 4.1-5.6 ms against 8-11 ms, by the hour's host speed); the
    context model is trained on the quantized model's features (weights.json), so the two must
    agree: `quantized=False` is for tests of the export only."""

    def __init__(self, cache_dir: Path, *, threads: int = 1, quantized: bool = True, side_thread: bool = True) -> None:
        model_dir = default_model_dir()
        self.runner = exported_runner(
            onnx_path(cache_dir, model_dir),
            onnx_path(cache_dir, model_dir, quantized=True) if quantized else None,
            export_onnx,
            model_dir,
            threads,
        )
        # A second thread encodes every other text of a call (onnxruntime lets go of the GIL while it
        # runs, and a session serves concurrent runs): both prompts of a candidate at once, on two
        # cores, rather than one after the other (bench verifier: docs/cache.md).
        self._side = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="context-encoder")
            if side_thread and len(os.sched_getaffinity(0)) > 1
            else None
        )

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """Each text in a run of its own: the int8 graph quantizes its activations with one scale
        for the whole batch, so a text's states depended on what it was batched with (a batch of
        the pair against each prompt alone moved a feature by up to 0.05, and 20 of the 3,699
        labeled candidates' verdicts with it). Alone, a text always encodes the same, in training
        and in any lookup, on whichever thread. Two or more: the side thread takes every other one."""
        if self._side is None or len(texts) < 2:
            return [self._one(text) for text in texts]
        side = self._side
        aside = {i: side.submit(self._one, text) for i, text in enumerate(texts) if i % 2}
        # In order: each text here is encoded while the side thread works through its own.
        return [aside[i].result() if i % 2 else self._one(text) for i, text in enumerate(texts)]

    def _one(self, text: str) -> Encoded:
        (e,), hidden = self.runner.run_encoded([text])
        return _encoded(text, e, hidden[0, : len(e.ids)])


def _encoded(text: str, e, hidden: np.ndarray) -> Encoded:
    inner = slice(1, len(e.ids) - 1)  # drop [CLS] and [SEP]
    ids = np.array(e.ids[inner], dtype=np.int64)
    spans = e.offsets[inner]
    groups: dict[int, list[int]] = {}
    for i, word in enumerate(e.word_ids[inner]):
        groups.setdefault(word, []).append(i)
    order = sorted(groups)
    content, rank = [], []
    for word in order:
        members = groups[word]
        surface = text[spans[members[0]][0] : spans[members[-1]][1]].lower()
        content.append(surface.isalnum() and surface not in _SKIP)
        rank.append(math.log(1 + max(int(ids[i]) for i in members)))
    pieces = hidden[inner].astype(np.float32)
    words = np.stack([pieces[groups[g]].mean(axis=0) for g in order]) if order else np.zeros((0, pieces.shape[1]))
    # float16, as the experiment measured them (and as an entry would store them).
    return Encoded(
        ids,
        _unit(pieces).astype(np.float16).astype(np.float32),
        _unit(words).astype(np.float16).astype(np.float32),
        np.array(rank, dtype=np.float32),
        np.array(content, dtype=bool),
    )


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-6)


def context_features(a: Encoded, b: Encoded, cuts: Sequence[float]) -> list[float]:
    """BERTScore-like alignment of two prompts' fourth-layer vectors; every feature symmetric.
    `cuts` are the three thresholds the below_* counts use (weights.json: label-free percentiles of
    the worst-aligned word's match over the training pairs)."""
    pa, pb = a.pieces, b.pieces
    if not len(pa) or not len(pb):
        return [0.0] * len(NAMES)
    s = pa @ pb.T
    best_a, best_b = s.max(axis=1), s.max(axis=0)
    precision, recall = float(best_a.mean()), float(best_b.mean())
    f = 2 * precision * recall / max(precision + recall, 1e-6)
    wa, wb = np.log1p(a.ids.astype(np.float32)), np.log1p(b.ids.astype(np.float32))
    ip, ir = float(best_a @ wa / wa.sum()), float(best_b @ wb / wb.sum())
    idf_f = 2 * ip * ir / max(ip + ir, 1e-6)

    w = a.words @ b.words.T
    best_wa, best_wb = w.max(axis=1), w.max(axis=0)
    arg_wa, arg_wb = w.argmax(axis=1), w.argmax(axis=0)
    ca, cb = a.content, b.content
    sims = np.concatenate([best_wa[ca], best_wb[cb]])
    rarity = np.concatenate([a.word_rank[ca], b.word_rank[cb]])
    if not len(sims):
        sims, rarity = np.array([1.0]), np.array([0.0])
    ordered = np.sort(sims)
    worst_index = int(np.argmin(sims))
    worst_a = float(best_wa[ca].min()) if ca.any() else 1.0
    worst_b = float(best_wb[cb].min()) if cb.any() else 1.0
    mutual = [arg_wb[arg_wa[i]] == i for i in np.flatnonzero(ca)] + [arg_wa[arg_wb[j]] == j for j in np.flatnonzero(cb)]
    if ca.any() and cb.any():
        wc = w[np.ix_(ca, cb)]
        cp, cr = float(wc.max(axis=1).mean()), float(wc.max(axis=0).mean())
        content_f = 2 * cp * cr / max(cp + cr, 1e-6)
    else:
        content_f = float(ca.any() == cb.any())
    return [
        f,
        min(precision, recall),
        idf_f,
        float(sims.mean()),
        float(sims @ rarity / rarity.sum()) if rarity.sum() else float(sims.mean()),
        float(ordered[0]),
        float(ordered[1]) if len(ordered) > 1 else float(ordered[0]),
        abs(worst_a - worst_b),
        float((sims < cuts[0]).sum()),
        float((sims < cuts[1]).sum()),
        float((sims < cuts[2]).sum()),
        float(rarity[worst_index]),
        float((1 - ordered[0]) * rarity[worst_index]),
        float(np.mean(mutual)) if mutual else 1.0,
        content_f,
    ]


_encoder: ContextEncoder | None = None
_lock = threading.Lock()


def shared_encoder() -> ContextEncoder:
    """The process's one encoder, its export in the models folder beside the embedder's."""
    global _encoder
    with _lock:
        if _encoder is None:
            from django.conf import settings

            _encoder = ContextEncoder(settings.DATA_DIR / "models")
    return _encoder
