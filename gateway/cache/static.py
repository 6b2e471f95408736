"""A static word-piece model distilled from all-MiniLM-L6-v2: the semantic cache's first stage.

MiniLM costs 3-10 ms of CPU per prompt; a miss in a partition that has entries would pay it for
every request, and most such lookups find nothing the verifier would serve. A static model embeds a
prompt in a few hundredths of a millisecond: a table lookup per word piece, averaged. Its vectors
find the partition's nearest entries, and the verifier decides, with MiniLM's cosine, only for those
it could accept at all (gateway/cache/engine.py; docs/decisions.md, 15).

The table is distilled the way model2vec distils (Tulkens and van Dongen, 2024): every word piece of
MiniLM's vocabulary is run through MiniLM itself (with [CLS] and [SEP], mean-pooled), the vectors
are centred and reduced by PCA, and each row is weighted down by how common its word piece is
(smooth inverse frequency over the vocabulary's rank, which for this tokenizer follows frequency).
model2vec's own `distill` cannot be installed beside this project's transformers (it pins
transformers < 5.4), so the few steps are done here with the ONNX export the embedder already has.
The table is written once under the models directory (about 31 MB), keyed by the weights' digest
and VERSION, and shared by every process. Rows keep the vectors of the table that filed them: a
change to the distillation (a new VERSION) needs a migration that clears `static_embedding`, after
which lookups give each partition's rows new ones (gateway/cache/engine.py, _static_deferred).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from gateway.cache import embedder as minilm

log = logging.getLogger(__name__)

DIMENSION = 256
VERSION = 2  # bump when the distillation changes, so an old table is not reused
_SIF = 1e-4  # smooth inverse frequency coefficient (model2vec's default)
_FIRST_WORD_PIECE = 999  # BERT's vocabulary: [PAD], [unused*], [CLS]/[SEP]/[MASK] come first
_BATCH = 2048
# What of a prompt is read: MiniLM reads its first MAX_TOKENS word pieces ([CLS] and [SEP] among them),
# so the first stage reads those too; and the tokenizer is handed a prefix that holds them (a word
# piece is at most 18 characters here), never a request body of megabytes (4 MB took seconds).
READ_PIECES = minilm.MAX_TOKENS - 2
READ_CHARS = 8 * 1024


def table_path(cache_dir: Path, model_dir: Path) -> Path:
    return cache_dir / f"all-MiniLM-L6-v2-{minilm.weights_digest(model_dir)}-static{DIMENSION}-v{VERSION}.npy"


def distill(embedder: minilm.Embedder) -> np.ndarray:
    """The static table: one DIMENSION-wide float32 row per word piece."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(embedder.model_dir / "tokenizer.json"))
    size = tokenizer.get_vocab_size()
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    runner = embedder._runner
    session = getattr(runner, "session", None)
    rows = np.zeros((size, minilm.DIMENSION), dtype=np.float32)
    for start in range(0, size, _BATCH):
        ids = np.arange(start, min(start + _BATCH, size), dtype=np.int64)
        batch = np.stack([np.full_like(ids, cls), ids, np.full_like(ids, sep)], axis=1)
        if session is not None:
            (rows[ids],) = session.run(None, {"input_ids": batch, "attention_mask": np.ones_like(batch)})
        else:  # the sentence-transformers fallback: decode and embed (slower, same idea)
            rows[ids] = embedder.embed([tokenizer.id_to_token(int(i)) for i in ids])
    words = rows[_FIRST_WORD_PIECE:]
    centred = words - words.mean(axis=0)
    _, _, components = np.linalg.svd(centred, full_matrices=False)
    components = components[:DIMENSION]
    # An axis's sign is arbitrary: fixed (its largest coordinate positive, as scikit-learn's svd_flip
    # does), so processes on hosts that distil their own table file vectors the others can search.
    components *= np.sign(components[np.arange(DIMENSION), np.abs(components).argmax(axis=1)])[:, None]
    reduced = centred @ components.T
    rank = np.arange(1, len(reduced) + 1, dtype=np.float64)
    frequency = 1.0 / (rank * np.log(len(reduced)))  # Zipf's law over the vocabulary's order
    weighted = reduced * (_SIF / (_SIF + frequency))[:, None]
    table = np.zeros((size, DIMENSION), dtype=np.float32)
    table[_FIRST_WORD_PIECE:] = weighted
    return table


def _save(path: Path, table: np.ndarray) -> None:
    with path.open("wb") as file:  # a file, not a name: np.save would add ".npy" to the temporary's
        np.save(file, table)


class StaticEmbedder:
    """Embeds prompts into L2-normalised DIMENSION-wide float32 vectors from the distilled table."""

    def __init__(self, embedder: minilm.Embedder, cache_dir: Path) -> None:
        from tokenizers import Tokenizer

        path = table_path(cache_dir, embedder.model_dir)
        if not path.exists():
            log.info("distilling the static first-stage model to %s", path)
            table = distill(embedder)
            minilm.write_atomically(path, lambda tmp: _save(tmp, table))
        self.table = np.load(path)
        self.tokenizer = Tokenizer.from_file(str(embedder.model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=READ_PIECES)
        self._lock = threading.Lock()  # a tokenizers.Tokenizer is not documented as thread-safe

    def embed(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            encodings = self.tokenizer.encode_batch([text[:READ_CHARS] for text in texts], add_special_tokens=False)
        vectors = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        for row, encoding in enumerate(encodings):
            if encoding.ids:
                vectors[row] = self.table[encoding.ids].mean(axis=0)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]
