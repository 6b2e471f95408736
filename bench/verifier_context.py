"""Offline experiment (issue #17): do contextual token features (BERTScore-like alignment of
MiniLM's hidden states, the last layer's and earlier ones') let the cache verifier's pair model
serve more paraphrases on topics it never saw, at the same share of wrong hits?

    .venv/bin/python -m bench.verifier_context [--layers 2 4 6] [--combine 2 4] [--no-boosting]
        [--show-wrong] [--rounds 20] [--reuse /tmp/encoded.pkl] [--out results.json]

(not a `python -m bench` scenario: an experiment, run on demand; about 5 minutes on 2 cores, most
of it encoding the 2,310 prompts with every hidden state, which --reuse keeps for the next run).

Nothing here is on the request path. It reuses `manage.py cache_verifier_train`'s labeled pairs,
its rows (pairs the cache would put to the pair model), its scikit-learn pipeline and its
leave-one-topic-out protocol and threshold rule, so its first line reproduces the figure in
docs/cache.md. For every variant it prints the pooled out-of-fold recall of paraphrases at the
lowest threshold whose hits stay within 1%, 2%, 5% and 10% wrong, and the time the contextual
features take per candidate given both prompts' token vectors. Results and the recommendation:
docs/cache.md, "Offline experiment: contextual token alignment".

The token vectors come from the same forward pass as the sentence embedding: the embedding is the
mean of the last hidden state over the prompt's word pieces, so one run of the transformer gives
both, the earlier layers' states included (checked below against the sentence embedding). Here
the model runs on torch with transformers from the packaged weights (HF_HUB_OFFLINE); in
production the ONNX export would need the chosen hidden state as a second output and the cache
would store the cached prompt's token vectors (float16, as they are stored here).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gateway.cache.verifier.context import NAMES
from gateway.cache.verifier.context import Encoded as GatewayEncoded
from gateway.cache.verifier.context import context_features as gateway_context_features

TARGETS = (0.01, 0.02, 0.05, 0.10)
# The features, as the gateway now computes them (gateway/cache/verifier/context.py).
CONTEXT_NAMES = NAMES


@dataclass
class Encoded:
    ids: np.ndarray  # word-piece ids, without [CLS] / [SEP]
    pieces: dict[int, np.ndarray]  # layer -> (pieces, 384) unit vectors, float16 as it would be stored
    words: dict[int, np.ndarray]  # layer -> (words, 384) unit vectors (mean of a word's pieces)
    word_rank: np.ndarray  # rarity of each word: log(1 + largest piece rank)
    content: np.ndarray  # bool per word
    sentence: np.ndarray  # mean-pooled last layer, normalised: the cache's embedding


Encoded.__module__ = "bench.verifier_context"  # so --reuse reads a pickle written under `python -m`


def setup() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("SENTINEL_DATA_DIR", "/tmp/sentinel-verifier-context")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sentinel.settings")
    import django

    django.setup()


class ContextualEncoder:
    """MiniLM on torch: the sentence embedding and per-token hidden states of one forward pass."""

    def __init__(self, layers: tuple[int, ...]) -> None:
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModel

        from gateway.cache.embedder import MAX_TOKENS, default_model_dir
        from gateway.cache.verifier.text import LIGHT_WORDS, STOPWORDS

        torch.set_num_threads(1)
        model_dir = default_model_dir()
        self.torch = torch
        self.model = AutoModel.from_pretrained(str(model_dir)).eval()
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.layers = layers
        self.skip = STOPWORDS | LIGHT_WORDS

    def encode(self, texts: list[str]) -> dict[str, Encoded]:
        torch = self.torch
        out: dict[str, Encoded] = {}
        for start in range(0, len(texts), 32):
            batch = texts[start : start + 32]
            encodings = self.tokenizer.encode_batch(batch)
            width = max(len(e.ids) for e in encodings)
            ids = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, e in enumerate(encodings):
                ids[row, : len(e.ids)] = e.ids
                mask[row, : len(e.ids)] = 1
            with torch.no_grad():
                result = self.model(
                    input_ids=torch.from_numpy(ids),
                    attention_mask=torch.from_numpy(mask),
                    token_type_ids=torch.zeros_like(torch.from_numpy(ids)),
                    output_hidden_states=True,
                )
            hidden = {layer: result.hidden_states[layer].numpy() for layer in self.layers}
            last = result.last_hidden_state.numpy()
            for row, (text, e) in enumerate(zip(batch, encodings, strict=True)):
                n = len(e.ids)
                sentence = last[row, :n].mean(axis=0)
                sentence /= np.linalg.norm(sentence)
                out[text] = self._tokens(text, e, {k: v[row, :n] for k, v in hidden.items()}, sentence)
        return out

    def _tokens(self, text: str, e, hidden: dict[int, np.ndarray], sentence: np.ndarray) -> Encoded:
        inner = slice(1, len(e.ids) - 1)  # drop [CLS] and [SEP]
        ids = np.array(e.ids[inner])
        word_ids = [w for w in e.word_ids[inner]]
        spans = [o for o in e.offsets[inner]]
        groups: dict[int, list[int]] = {}
        for i, w in enumerate(word_ids):
            groups.setdefault(w, []).append(i)
        order = sorted(groups)
        content = []
        rank = []
        for w in order:
            members = groups[w]
            surface = text[spans[members[0]][0] : spans[members[-1]][1]].lower()
            content.append(surface.isalnum() and surface not in self.skip)
            rank.append(math.log(1 + max(int(ids[i]) for i in members)))
        pieces, words = {}, {}
        for layer, h in hidden.items():
            p = h[inner].astype(np.float32)
            w = np.stack([p[groups[g]].mean(axis=0) for g in order]) if order else np.zeros((0, p.shape[1]))
            pieces[layer] = _unit(p).astype(np.float16)
            words[layer] = _unit(w).astype(np.float16)
        return Encoded(ids, pieces, words, np.array(rank, dtype=np.float32), np.array(content, dtype=bool), sentence)


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-6)


def context_features(a: Encoded, b: Encoded, layer: int, cuts: tuple[float, float, float]) -> list[float]:
    """BERTScore-like alignment of two prompts' token vectors at `layer`; every feature symmetric
    (the gateway's context_features, on this experiment's encodings)."""
    return gateway_context_features(_at(a, layer), _at(b, layer), cuts)


def _at(e: Encoded, layer: int) -> GatewayEncoded:
    return GatewayEncoded(
        e.ids, e.pieces[layer].astype(np.float32), e.words[layer].astype(np.float32), e.word_rank, e.content
    )


# --- the training command's protocol ---------------------------------------------------------------


def loto_scores(candidates: list[tuple[dict, np.ndarray]], fit: Callable) -> dict[int, float]:
    """Each topic scored by a model fitted on the other topics (cache_verifier_train's loop)."""
    held_out: dict[int, float] = {}
    for topic in sorted({p["domain"] for p, _ in candidates}):
        train = [(p, x) for p, x in candidates if p["domain"] != topic]
        test = [(p, x) for p, x in candidates if p["domain"] == topic]
        model = fit(np.array([x for _, x in train]), np.array([p["same"] for p, _ in train]))
        scores = model.predict_proba(np.array([x for _, x in test]))[:, 1]
        held_out.update({id(p): float(s) for (p, _), s in zip(test, scores, strict=True)})
    return held_out


def operating_point(rows: list[tuple[dict, object]], held_out: dict[int, float], target: float) -> dict:
    """The command's threshold rule (lowest held-out probability at which the pooled hits keep
    their wrong share within target), then recall over every paraphrase of the three sets."""
    candidates = [p for p, x in rows if x is not None]
    threshold, wrong = 1.0, 0
    for hits, pair in enumerate(sorted(candidates, key=lambda p: -held_out[id(p)]), 1):
        wrong += not pair["same"]
        if wrong / hits <= target:
            threshold = held_out[id(pair)]
    paraphrases = sum(p["same"] for p, _ in rows)
    hit = [p for p in candidates if held_out[id(p)] >= threshold]
    bad = sum(not p["same"] for p in hit)
    return {
        "target": target,
        "threshold": round(threshold, 4),
        "recall": round(sum(p["same"] for p in hit) / paraphrases, 4),
        "hits": len(hit),
        "wrong": bad,
        "wrong_share": round(bad / max(len(hit), 1), 4),
    }


def topic_bootstrap(rows: list[tuple[dict, object]], held_out: dict[int, float], rounds: int = 200) -> dict:
    """Recall at 1% and 2% wrong over topic resamples (topics drawn with replacement): how much of
    a difference between two variants is the luck of a handful of wrong hits."""
    rng = np.random.default_rng(0)
    by_topic: dict[str, list[tuple[bool, float | None]]] = {}
    for p, x in rows:
        by_topic.setdefault(p["domain"], []).append((p["same"], held_out[id(p)] if x is not None else None))
    topics = sorted(by_topic)
    out: dict[str, list[float]] = {"0.01": [], "0.02": []}
    for _ in range(rounds):
        sample = [r for t in rng.choice(topics, size=len(topics)) for r in by_topic[t]]
        paraphrases = sum(same for same, _ in sample)
        scored = sorted(((score, same) for same, score in sample if score is not None), key=lambda r: -r[0])
        labels = np.array([same for _, same in scored], dtype=bool)
        scores = np.array([score for score, _ in scored])
        hits = np.arange(1, len(labels) + 1)
        wrong_share = np.cumsum(~labels) / hits
        for target in (0.01, 0.02):
            ok = np.flatnonzero(wrong_share <= target)
            served = labels[scores >= scores[ok[-1]]].sum() if len(ok) else 0
            out[str(target)].append(served / max(paraphrases, 1))
    return {t: [round(float(np.percentile(v, q)), 3) for q in (5, 50, 95)] for t, v in out.items()}


def logistic(x: np.ndarray, y: np.ndarray):
    from gateway.management.commands.cache_verifier_train import fit

    return fit(x, y)


def boosting(x: np.ndarray, y: np.ndarray):
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(
        max_depth=3, learning_rate=0.05, max_iter=200, min_samples_leaf=20, l2_regularization=1.0, random_state=0
    ).fit(x, y)


def timing(pairs: list[tuple[Encoded, Encoded]], layer: int, cuts, rounds: int) -> dict:
    """Per-candidate time of context_features given both prompts' stored token vectors."""
    per_pair: list[list[float]] = [[] for _ in pairs]
    for a, b in pairs[:50]:
        context_features(a, b, layer, cuts)
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for timings, (a, b) in zip(per_pair, pairs, strict=True):
            started = clock()
            context_features(a, b, layer, cuts)
            timings.append((clock() - started) / 1e6)
    medians = sorted(statistics.median(t) for t in per_pair)
    calls = sorted(t for ts in per_pair for t in ts)
    return {
        "candidates": len(pairs),
        "p50_ms": round(medians[len(medians) // 2], 3),
        "p99_ms": round(medians[min(len(medians) - 1, int(0.99 * len(medians)))], 3),
        "max_ms": round(medians[-1], 3),
        "raw_p99_ms": round(calls[min(len(calls) - 1, int(0.99 * len(calls)))], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.verifier_context", description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4, 6], help="hidden states to try (6 = last)")
    parser.add_argument("--no-boosting", action="store_true", help="skip the gradient-boosting variants")
    parser.add_argument("--rounds", type=int, default=20, help="timing rounds per candidate")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--combine", type=int, nargs="*", default=[], help="also one variant with these layers' features together"
    )
    parser.add_argument("--show-wrong", action="store_true", help="print the wrong hits at ≤2%% of each variant")
    parser.add_argument(
        "--reuse", type=Path, default=None, help="pickle of the encoded prompts: read if present, else written"
    )
    args = parser.parse_args(argv)
    setup()
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # one BLAS thread: the timing is per request thread, and the host is shared

    from gateway.cache.acceptance import normalize_prompt
    from gateway.management.commands.cache_verifier_train import labeled_pairs, rows_for

    pairs = labeled_pairs()
    texts = sorted({normalize_prompt(p[k]) for p in pairs for k in "ab"})
    started = time.monotonic()
    if args.reuse and args.reuse.exists():
        with args.reuse.open("rb") as f:
            encoded = pickle.load(f)  # noqa: S301 (a file this script wrote)
    else:
        encoded = ContextualEncoder(tuple(range(7))).encode(texts)
        if args.reuse:
            with args.reuse.open("wb") as f:
                pickle.dump(encoded, f)
    print(f"encoded {len(texts)} prompts in {time.monotonic() - started:.0f} s", flush=True)
    vectors = {t: e.sentence for t, e in encoded.items()}
    # The pooled last layer is the cache's embedding (the ONNX graph pools the same hidden state).
    from gateway.cache.embedder import Embedder

    reference = Embedder(backend="torch", threads=1).embed(texts[:200])
    agreement = min(float(vectors[t] @ r) for t, r in zip(texts[:200], reference, strict=True))
    print(f"sentence embedding from the token pass vs sentence-transformers: min cosine {agreement:.5f}")

    rows = rows_for(pairs, vectors)
    candidates = [(p, np.array(x)) for p, x in rows if x is not None]
    print(f"{len(rows)} pairs, {sum(p['same'] for p, _ in rows)} paraphrases, {len(candidates)} put to the model")

    results: dict = {"variants": {}, "timing": {}}

    def run(name: str, cands: list[tuple[dict, np.ndarray]], fit: Callable) -> None:
        held_out = loto_scores(cands, fit)
        ids = {id(p) for p, _ in cands}
        these = [(p, x if id(p) in ids else None) for p, x in rows]
        points = [operating_point(these, held_out, t) for t in TARGETS]
        results["variants"][name] = points
        if args.show_wrong:
            cut = next(pt["threshold"] for pt in points if pt["target"] == 0.02)
            for p, _ in cands:
                if not p["same"] and held_out[id(p)] >= cut:
                    print(f"    wrong hit {held_out[id(p)]:.3f} [{p['domain']}] {p['a']!r} / {p['b']!r}")
        cells = "  ".join(f"{pt['recall'] * 100:5.1f}% ({pt['wrong']}/{pt['hits']})" for pt in points)
        spread = topic_bootstrap(these, held_out)
        results.setdefault("bootstrap", {})[name] = spread
        ranges = "  ".join(f"{t}: {lo:.0%}-{hi:.0%}" for t, (lo, _, hi) in spread.items())
        print(f"{name:<44}{cells}   topic bootstrap 90% ranges {ranges}", flush=True)

    print(f"{'variant':<44}" + "  ".join(f"{'≤' + format(t, '.0%') + ' wrong':<17}" for t in TARGETS))
    run("(a) 20 features, logistic", candidates, logistic)
    by_text = {normalize_prompt(p[k]): encoded[normalize_prompt(p[k])] for p, _ in candidates for k in "ab"}

    def encodings(p: dict) -> tuple[Encoded, Encoded]:
        return by_text[normalize_prompt(p["a"])], by_text[normalize_prompt(p["b"])]

    for layer in args.layers:
        # Thresholds for the counts: the 10th/25th/50th percentile of the worst-aligned word's match
        # over every candidate (no labels read, so no fold sees another's answers through them).
        worst = [context_features(*encodings(p), layer, (0, 0, 0))[5] for p, _ in candidates]
        cuts = tuple(float(np.percentile(worst, q)) for q in (10, 25, 50))
        extra = [(p, np.array(context_features(*encodings(p), layer, cuts))) for p, _ in candidates]
        both = [(p, np.concatenate([x, e])) for (p, x), (_, e) in zip(candidates, extra, strict=True)]
        run(f"(b) 20 + {len(CONTEXT_NAMES)} contextual (layer {layer}), logistic", both, logistic)
        cosine_only = [(p, np.concatenate([x[:1], e])) for (p, x), (_, e) in zip(candidates, extra, strict=True)]
        run(f"(c) cosine + contextual only (layer {layer})", cosine_only, logistic)
        if not args.no_boosting:
            run(f"(d) 20 + contextual (layer {layer}), boosting", both, boosting)
        results["timing"][f"layer {layer}"] = timing([encodings(p) for p, _ in candidates], layer, cuts, args.rounds)
        results.setdefault("cuts", {})[f"layer {layer}"] = cuts
    sizes = [len(e.ids) for e in by_text.values()]  # word pieces a cached prompt would store vectors for
    results["storage"] = {
        "median_pieces": statistics.median(sizes),
        "max_pieces": max(sizes),
        "median_bytes_float16": statistics.median(sizes) * 384 * 2,
    }
    if args.combine:  # layers also given to --layers (their count thresholds)

        def together(p: dict) -> np.ndarray:
            a, b = encodings(p)
            return np.concatenate(
                [context_features(a, b, layer, results["cuts"][f"layer {layer}"]) for layer in args.combine]
            )

        joined = [(p, np.concatenate([x, together(p)])) for p, x in candidates]
        label = "+".join(map(str, args.combine))
        run(f"(f) 20 + contextual (layers {label}), logistic", joined, logistic)
        if not args.no_boosting:
            run(f"(g) 20 + contextual (layers {label}), boosting", joined, boosting)
    if not args.no_boosting:
        run("(e) 20 features, boosting", candidates, boosting)
    print(json.dumps({k: results[k] for k in ("timing", "storage", "cuts") if k in results}))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n", "utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
