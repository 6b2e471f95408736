"""The verifier's cross-encoder (gateway/cache/verifier/cross.py): the shipped update merged into the
packaged weights and exported gives the scores the model had in training, read in one order (so a
verdict is symmetric), for any text a caller sends."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gateway.cache.verifier import cross

PAIRS = [
    ("How do I reset my router to factory settings?", "how do i factory reset my router"),
    ("How do I reset my router to factory settings?", "How do I reset my modem to factory settings?"),
    ("What is the capital of Australia?", "whats the capital of australia?"),
    ("tcp vs udp", "What's the difference between TCP and UDP?"),
]


def _torch_scores(model, pairs: list[tuple[str, str]]) -> list[float]:
    from gateway.management.commands.cache_cross_train import _inputs

    tokenizer = cross.tokenizer()
    with torch.no_grad():
        return [float(model(*_inputs(tokenizer, [cross.ordered(a, b)]))[0]) for a, b in pairs]


def test_the_shipped_update_as_trained_equals_the_merged_model_and_its_export(tmp_path) -> None:
    """The adapters as training ran them (W x + B A x), loaded from cross.npz, score every pair as
    the merged weights (W + B A) do, and so does their ONNX export."""
    weights = cross.load(cross.WEIGHTS)
    trained = cross.pair_model().eval()
    made = cross.adapters(trained.bert, cross.meta().rank, cross.meta().alpha)
    with torch.no_grad():
        for i, adapter in enumerate(made):
            adapter.a.copy_(torch.from_numpy(weights[f"a{i}"].astype(np.float32)))
            adapter.b.copy_(torch.from_numpy(weights[f"b{i}"].astype(np.float32)))
        trained.head.weight.copy_(torch.from_numpy(weights["head_weight"]))
        trained.head.bias.copy_(torch.from_numpy(weights["head_bias"]))
    as_trained = _torch_scores(trained, PAIRS)
    merged = _torch_scores(cross.merged(), PAIRS)
    exported = cross.CrossScorer(tmp_path, quantized=False).score(PAIRS)
    assert np.allclose(as_trained, merged, atol=1e-4)
    assert np.allclose(merged, exported, atol=1e-3)
    # The int8 graph the gateway runs stays near it, and separates the pairs: the rewording above
    # the threshold (chosen on the int8 scores), the changed subject under it.
    shipped = cross.shared_scorer().score(PAIRS)
    assert np.allclose(exported, shipped, atol=0.5)
    threshold = cross.meta().threshold
    assert shipped[0] >= threshold > shipped[1]


def test_save_writes_what_merged_reads(tmp_path) -> None:
    """cache_cross_train's save() and the gateway's merged() agree on the file's layout: a model
    whose update is zero but for one adapter scores as the packaged weights with that change."""
    model = cross.pair_model().eval()
    made = cross.adapters(model.bert)
    with torch.no_grad():
        made[0].a.fill_(0.01)
        made[0].b.fill_(0.02)
    target = tmp_path / "cross.npz"
    meta = {"threshold": 0.0, "gate": 0.0, "rank": cross.RANK, "alpha": cross.ALPHA, "trained": {}}
    cross.save(model, made, target, meta)
    loaded = cross.load(target)
    assert len([name for name in loaded if name.startswith("a")]) == 6 * len(cross.TARGETS)
    reread = cross.merged(weights=loaded)
    # float16 on disk: the same scores to three decimals.
    assert np.allclose(_torch_scores(model, PAIRS), _torch_scores(reread, PAIRS), atol=2e-3)


def test_a_pair_scores_the_same_in_either_order() -> None:
    scorer = cross.shared_scorer()
    for a, b in PAIRS:
        assert scorer.score([(a, b)]) == scorer.score([(b, a)])


@pytest.mark.parametrize(
    "hostile",
    [
        "",
        " ",
        "\x00\x01\x1b[31m\u202e\ufeff",
        "🙂" * 300,
        "word " * 5000,
        "a" * 20000,
        "{" * 1000 + "}" * 1000,
        "\u0645\u0631\u062d\u0628\u0627 " * 200,
    ],
)
def test_any_text_scores_finitely_within_the_token_bound(hostile: str) -> None:
    """Whatever a caller sends, the pair is cut to MAX_TOKENS word pieces and scores a finite number."""
    scorer = cross.shared_scorer()
    encoded = scorer.tokenizer.encode(*cross.ordered(hostile, "How do I reset my router?"))
    assert len(encoded.ids) <= cross.MAX_TOKENS
    (score,) = scorer.score([(hostile, "How do I reset my router?")])
    assert np.isfinite(score)
