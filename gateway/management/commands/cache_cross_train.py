"""Train the semantic cache verifier's cross-encoder (gateway/cache/verifier/cross.py) on the labeled
pairs in the repository and choose its threshold and gate on sets it was not trained on.

Training: every labeled pair of `manage.py cache_verifier_train`'s SOURCES except VALIDATION (the
last two sets written; each a different eight topics), and reworded hard negatives built from them
(a paraphrase of a prompt against a hard negative of it; at most --reworded, a random sample), each
pair in a random order; a low-rank update (cross.RANK) of MiniLM's linear layers and a linear head,
binary cross-entropy, AdamW with warm-up and linear decay, --epochs passes. About 17 minutes on two
cores with torch (30 on one). Deterministic for a seed on one machine, not bit-identical across machines.

Validation: the VALIDATION pairs that reach the verifier's last step (cosine at least the floor, no
explicit check against them: cache_verifier_train.rows_for), scored by the trained model in the
gateway's order. For each gate in GATES (the pair-model probability under which the cross-encoder is
not asked: a cheap first cut) the lowest score at which the validation hits keep their wrong share
within --target; the gate and threshold that serve the most paraphrases are kept (the higher gate on
a tie: fewer pairs to score). Written to --out with the figures; the last line printed is JSON.
--validate-only does only this, for the update already in --out.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
from django.conf import settings
from django.core.management.base import BaseCommand

from gateway.cache.acceptance import normalize_prompt
from gateway.cache.verifier import cross
from gateway.cache.verifier.model import pair_model
from gateway.management.commands.cache_eval import load_pairs
from gateway.management.commands.cache_verifier_train import (
    SOURCES,
    prompt_vectors,
    reworded_negatives,
    rows_for,
)

VALIDATION = ("tests/data/cache_pairs_fresh16.jsonl", "tests/data/cache_pairs_fresh17.jsonl")
GATES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
BATCH = 32


def served_within(scored: list[tuple[bool, float, float]], gate: float, target: float) -> tuple[float, int, int, int]:
    """(threshold, paraphrases served, hits, wrong) at the lowest score whose hits among the pairs
    at or above `gate` keep their wrong share within `target`; scored = (same, pair-model
    probability, score)."""
    asked = sorted((score, same) for same, probability, score in scored if probability >= gate)
    wrong = 0
    best = (math.inf, 0, 0, 0)
    # Walk down from the highest score: each prefix is what a threshold at its last score serves.
    for hits, i in enumerate(range(len(asked) - 1, -1, -1), start=1):
        score, same = asked[i]
        wrong += not same
        if (i == 0 or asked[i - 1][0] < score) and wrong <= target * hits:
            best = (score, hits - wrong, hits, wrong)
    return best


class Command(BaseCommand):
    help = "Train the semantic cache verifier's cross-encoder; choose its threshold and gate on held-out sets."

    def add_arguments(self, parser):
        parser.add_argument("--epochs", type=float, default=2.0)
        parser.add_argument("--reworded", type=int, default=8000)
        parser.add_argument("--learning-rate", type=float, default=5e-4)
        parser.add_argument("--target", type=float, default=0.01, help="Largest share of wrong hits (default 0.01).")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--out", type=Path, default=cross.WEIGHTS)
        parser.add_argument(
            "--validate-only",
            action="store_true",
            help="Train nothing: choose the gate and threshold of the update already in --out again.",
        )

    def handle(self, *args, epochs, reworded, learning_rate, target, seed, out, validate_only, **options):
        import torch

        if validate_only:
            trained = json.loads(str(cross.load(out)["meta"]))["trained"]
            kept = {k: v for k, v in trained.items() if k not in ("target_wrong_hit_share", "validation")}
            self.validate(out, target, kept)
            return
        random.seed(seed)
        torch.manual_seed(seed)
        torch.set_num_threads(len(os.sched_getaffinity(0)))  # training: every core (the gateway's embedder uses one)
        training_sources = [s for s in SOURCES if s not in VALIDATION]
        train = [p for s in training_sources for p in load_pairs(settings.BASE_DIR / s)]
        extra = reworded_negatives(train)
        random.shuffle(extra)
        extra = extra[:reworded]
        data = [(p["a"], p["b"], float(p["same"])) for p in train] + [(p["a"], p["b"], 0.0) for p in extra]
        self.stdout.write(f"training on {len(train)} labeled pairs and {len(extra)} reworded negatives")

        model = cross.pair_model()
        made = cross.adapters(model.bert)
        tokenizer = cross.tokenizer()
        steps = int(math.ceil(len(data) / BATCH) * epochs)
        optimizer = torch.optim.AdamW(
            [
                {"params": [p for a in made for p in (a.a, a.b)], "lr": learning_rate},
                {"params": model.head.parameters(), "lr": 1e-3},
            ],
            weight_decay=0.01,
        )
        warm = max(1, int(0.06 * steps))
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, s / warm) * max(0.0, (steps - s) / steps)
        )
        loss_of = torch.nn.BCEWithLogitsLoss()
        model.train()
        step, started = 0, time.monotonic()
        while step < steps:
            for batch in _batches(data):
                if step >= steps:
                    break
                pairs = [(a, b) if random.random() < 0.5 else (b, a) for a, b, _ in batch]
                inputs = _inputs(tokenizer, pairs)
                loss = loss_of(model(*inputs), torch.tensor([same for _, _, same in batch]))
                loss.backward()
                torch.nn.utils.clip_grad_norm_([p for a in made for p in (a.a, a.b)], 1.0)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
                step += 1
                if step % 200 == 0:
                    self.stdout.write(f"step {step}/{steps} loss {loss.item():.4f} {time.monotonic() - started:.0f} s")

        settings_for = {"rank": cross.RANK, "alpha": cross.ALPHA}
        cross.save(model, made, out, {**settings_for, "threshold": 0.0, "gate": 0.0, "trained": {}})
        trained = {
            "on": [*training_sources, f"{len(extra)} reworded hard negatives built from them"],
            "epochs": epochs,
            "learning_rate": learning_rate,
            "seed": seed,
        }
        self.validate(out, target, trained)

    def validate(self, weights: Path, target: float, trained: dict) -> None:
        """Choose the gate and threshold of the update in `weights` on the VALIDATION pairs that reach
        the last step, scored by the export the gateway runs (merged, exported, quantized), in its
        order; write them into the file with the figures."""
        from gateway.cache.embedder import Embedder

        with tempfile.TemporaryDirectory() as scratch:
            scorer = cross.CrossScorer(Path(scratch), weights=weights, threads=max(1, settings.EMBEDDER_THREADS))
            held = [p for s in VALIDATION for p in load_pairs(settings.BASE_DIR / s)]
            embedder = Embedder(cache_dir=settings.DATA_DIR / "models", threads=settings.EMBEDDER_THREADS)
            rows = [(p, x) for p, x in rows_for(held, prompt_vectors(held, embedder)) if x is not None]
            scores = scorer.score([(normalize_prompt(p["a"]), normalize_prompt(p["b"])) for p, _ in rows])
        words = pair_model()
        scored = [(p["same"], words.probability(x), s) for (p, x), s in zip(rows, scores, strict=True)]
        paraphrases = sum(p["same"] for p in held)
        choices = {gate: served_within(scored, gate, target) for gate in GATES}
        gate = max(GATES, key=lambda g: (choices[g][1], g))
        threshold, recalled, hits, wrong = choices[gate]
        validation = {
            "sets": list(VALIDATION),
            "paraphrases": paraphrases,
            "recall": round(recalled / paraphrases, 4),
            "hits": hits,
            "wrong": wrong,
            "per_gate": {
                str(g): {"threshold": round(c[0], 4), "recalled": c[1], "hits": c[2], "wrong": c[3]}
                for g, c in choices.items()
            },
        }
        for g, c in choices.items():
            self.stdout.write(
                f"gate {g:.1f}: threshold {c[0]:.4f}, {c[1]} of {paraphrases} paraphrases, {c[3]} of {c[2]} hits wrong"
            )
        arrays = {name: array for name, array in cross.load(weights).items() if name != "meta"}
        cross.save_arrays(
            arrays,
            weights,
            {
                "rank": cross.RANK,
                "alpha": cross.ALPHA,
                "threshold": round(threshold, 6),
                "gate": gate,
                "trained": {**trained, "target_wrong_hit_share": target, "validation": validation},
            },
        )
        self.stdout.write(json.dumps({"threshold": round(threshold, 6), "gate": gate, **validation}))


def _batches(data: list) -> list[list]:
    """Shuffled batches of pairs of similar length (less padding), in a random order."""
    items = list(data)
    random.shuffle(items)
    out = []
    for start in range(0, len(items), BATCH * 50):
        chunk = sorted(items[start : start + BATCH * 50], key=lambda x: len(x[0]) + len(x[1]))
        out += [chunk[i : i + BATCH] for i in range(0, len(chunk), BATCH)]
    random.shuffle(out)
    return out


def _inputs(tokenizer, pairs: list[tuple[str, str]]):
    import torch

    encodings = tokenizer.encode_batch(pairs)
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, e in enumerate(encodings):
        ids[row, : len(e.ids)] = e.ids
        mask[row, : len(e.ids)] = 1
        types[row, : len(e.ids)] = e.type_ids
    return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types)
