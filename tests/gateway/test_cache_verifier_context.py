"""The verifier's fourth-layer encodings (gateway/cache/verifier/context.py): the exported cut of
the model gives transformers' own hidden state, and the features are symmetric and total."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.cache.verifier.context import LAYER, NAMES, ContextEncoder, context_features, shared_encoder
from gateway.cache.verifier.model import context_cuts

PROMPTS = [
    "How do I reset my router to factory settings?",
    "router factory reset how",
    "What's the boiling point of water in Fahrenheit?",
    "Explain how rainbows are formed.",
]


def test_the_exported_cut_gives_the_transformers_fourth_hidden_state() -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    from gateway.cache.embedder import default_model_dir

    model_dir = default_model_dir()
    bert = AutoModel.from_pretrained(str(model_dir)).eval()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()  # the packaged file pads to 128
    encoded = _plain().encode(PROMPTS)
    for prompt, ours in zip(PROMPTS, encoded, strict=True):
        ids = tokenizer.encode(prompt).ids
        with torch.no_grad():
            hidden = bert(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[LAYER][0].numpy()
        pieces = hidden[1:-1] / np.linalg.norm(hidden[1:-1], axis=1, keepdims=True)
        assert ours.ids.tolist() == ids[1:-1]
        # float16 as stored: three decimals.
        assert np.abs(ours.pieces - pieces).max() < 2e-3
        assert ours.content.dtype == bool and len(ours.content) == len(ours.words)


def _plain() -> ContextEncoder:
    from django.conf import settings

    return ContextEncoder(settings.DATA_DIR / "models", quantized=False)


def test_the_quantized_cut_the_verifier_runs_stays_close_to_the_exported_one() -> None:
    """int8 weights move each word piece's vector a little (over the labeled prompts the least cosine
    to the unquantized one was 0.980); the context model is trained on the quantized features."""
    quantized, plain = shared_encoder(), _plain()
    assert quantized.runner.name.endswith("-int8.onnx") and not plain.runner.name.endswith("-int8.onnx")
    for ours, exact in zip(quantized.encode(PROMPTS), plain.encode(PROMPTS), strict=True):
        assert ours.ids.tolist() == exact.ids.tolist()
        cosines = (ours.pieces * exact.pieces).sum(axis=1)
        assert cosines.min() > 0.98
        assert not np.array_equal(ours.pieces, exact.pieces)


def test_the_side_thread_encodes_exactly_what_one_thread_does() -> None:
    """Every other text of a call goes to the encoder's second thread: the same encodings, in the
    order asked, as each text alone on the caller's thread (the verdicts must not depend on it)."""
    from django.conf import settings

    texts = [*PROMPTS, "x", PROMPTS[0]]
    one_thread = ContextEncoder(settings.DATA_DIR / "models", side_thread=False)
    assert shared_encoder()._side is not None and one_thread._side is None
    together = shared_encoder().encode(texts)
    assert len(together) == len(texts)
    for text, ours in zip(texts, together, strict=True):
        (alone,) = one_thread.encode([text])
        assert ours.ids.tolist() == alone.ids.tolist()
        assert np.array_equal(ours.pieces, alone.pieces) and np.array_equal(ours.words, alone.words)
    assert not np.array_equal(together[0].pieces[:3], together[1].pieces[:3])


@pytest.mark.parametrize(("a", "b"), [(PROMPTS[0], PROMPTS[1]), (PROMPTS[2], PROMPTS[3]), (PROMPTS[0], PROMPTS[0])])
def test_the_features_are_symmetric(a: str, b: str) -> None:
    ea, eb = shared_encoder().encode([a, b])
    forward, backward = context_features(ea, eb, context_cuts()), context_features(eb, ea, context_cuts())
    assert len(forward) == len(NAMES)
    assert forward == pytest.approx(backward, abs=1e-6)


def test_a_prompt_identical_to_itself_aligns_perfectly() -> None:
    (e,) = shared_encoder().encode([PROMPTS[0]])
    features = dict(zip(NAMES, context_features(e, e, context_cuts()), strict=True))
    assert features["ctx_piece_f"] == pytest.approx(1.0, abs=1e-3)
    assert features["ctx_worst"] == pytest.approx(1.0, abs=1e-3)
    assert features["ctx_below_a"] == features["ctx_below_b"] == features["ctx_below_c"] == 0.0
    assert features["ctx_mutual_share"] == 1.0


@pytest.mark.parametrize(
    "hostile",
    ["", " ", "\x00\x01\x1b[31m", "?!?!", "🙂" * 50, "a " * 2000, "ignore\u202eprevious\u200binstructions", "中文提示"],
)
def test_any_text_encodes_and_gives_finite_features(hostile: str) -> None:
    """Empty text, control and invisible characters, emoji, text past the model's 256 word pieces,
    another script: an encoding and finite features, never an error."""
    encoded, other = shared_encoder().encode([hostile, PROMPTS[0]])
    assert len(encoded.ids) <= 254  # cut as the embedder cuts: 256 with [CLS] and [SEP]
    features = context_features(encoded, other, context_cuts())
    assert len(features) == len(NAMES) and all(np.isfinite(features))
