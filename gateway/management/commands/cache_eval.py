"""Measure the semantic cache's precision on labeled prompt pairs, through the real cache code path.

For each pair, prompt `a` is stored with an answer (embedding, pgvector row, exact key in Redis),
then prompt `b` is looked up, in a tenant created for the run and a namespace of the pair's own (so
pairs never see each other's entries). A hit on a pair labeled `same: false` is a wrong answer
served. The last line printed is JSON: {"pairs": N, "recall": R, "wrong_hit_share": W}.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from gateway.cache import engine as cache
from gateway.cache.keys import cache_key
from gateway.mock_provider import answer_text
from gateway.models import CacheEntry
from sentinel.jsonl import read_jsonl
from tenants.models import Tenant

MODEL_IDENTITY = ("cache-eval", ("openai/gpt-4o-mini",))


def load_pairs(path: Path) -> list[dict]:
    return read_jsonl(
        path,
        valid=lambda pair: isinstance(pair["a"], str) and isinstance(pair["b"], str) and isinstance(pair["same"], bool),
        expected="{'a': str, 'b': str, 'same': bool, ...}",
        what="pairs",
    )


def request_for(prompt: str) -> dict:
    return {"model": MODEL_IDENTITY[0], "messages": [{"role": "user", "content": prompt}]}


async def evaluate(pairs: list[dict], tenant_id: int, threshold: float | None) -> list[tuple[dict, bool, float | None]]:
    await asyncio.get_running_loop().run_in_executor(None, cache.shared_embedder)
    try:
        return [await evaluate_pair(pair, tenant_id, threshold) for pair in pairs]
    finally:
        await cache.close_pool()


async def evaluate_pair(pair: dict, tenant_id: int, threshold: float | None) -> tuple[dict, bool, float | None]:
    namespace = f"eval-{uuid.uuid4().hex}"

    def key(prompt: str, namespace: str = namespace):
        return cache_key(
            tenant_id=tenant_id, namespace=namespace, model_identity=MODEL_IDENTITY, body=request_for(prompt)
        )

    stored = key(pair["a"])
    answer = {"content": answer_text(pair["a"]), "finish_reason": "stop", "usage": {}, "model": "eval"}
    await cache.store(
        stored,
        tenant_id=tenant_id,
        model=MODEL_IDENTITY[0],
        answer=answer,
        cost_usd=Decimal("0.001"),
        ttl=3600,
        max_entries=10**9,
        semantic=True,
    )
    found = await cache.lookup(key(pair["b"]), tenant_id=tenant_id, semantic=True, threshold=threshold)
    hit = found.hit is not None
    return pair, hit, found.hit.similarity if hit else None


class Command(BaseCommand):
    help = "Semantic cache precision on labeled pairs (JSONL: a, b, same, kind, domain)."

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument("--threshold", type=float, help="Cosine threshold (default: the built-in one).")
        parser.add_argument("--show-wrong", action="store_true", help="List wrong hits and missed paraphrases.")

    def handle(self, *args, file: Path, threshold: float | None, show_wrong: bool, **options):
        if not file.exists():
            raise CommandError(f"{file}: no such file")
        pairs = load_pairs(file)
        call_command("migrate", verbosity=0)  # a fresh clone's embedded database starts empty
        tenant = Tenant.objects.create(name="cache_eval run", slug=f"cache-eval-{uuid.uuid4().hex[:12]}")
        try:
            outcomes = asyncio.run(evaluate(pairs, tenant.pk, threshold))
        finally:
            CacheEntry.objects.filter(tenant=tenant).delete()
            tenant.delete()
        self.report(outcomes, show_wrong)

    def report(self, outcomes, show_wrong: bool) -> None:
        same = [o for o in outcomes if o[0]["same"]]
        hits = [o for o in outcomes if o[1]]
        wrong = [o for o in hits if not o[0]["same"]]
        recall = sum(1 for o in same if o[1]) / len(same) if same else 0.0
        wrong_share = len(wrong) / len(hits) if hits else 0.0

        by_kind: dict[str, Counter] = defaultdict(Counter)
        for pair, hit, _ in outcomes:
            counts = by_kind[pair.get("kind", "?")]
            counts["pairs"] += 1
            counts["hits"] += hit
        self.stdout.write(f"{'kind':<16}{'pairs':>7}{'hits':>7}{'hit rate':>10}")
        for kind, counts in sorted(by_kind.items()):
            self.stdout.write(
                f"{kind:<16}{counts['pairs']:>7}{counts['hits']:>7}{counts['hits'] / counts['pairs']:>10.1%}"
            )
        by_domain: dict[str, Counter] = defaultdict(Counter)
        for pair, hit, _ in outcomes:
            counts = by_domain[pair.get("domain", "?")]
            counts["same"] += pair["same"]
            counts["recalled"] += hit and pair["same"]
            counts["wrong"] += hit and not pair["same"]
        self.stdout.write(f"\n{'domain':<16}{'paraphrases':>12}{'recalled':>10}{'wrong hits':>12}")
        for domain, counts in sorted(by_domain.items()):
            self.stdout.write(f"{domain:<16}{counts['same']:>12}{counts['recalled']:>10}{counts['wrong']:>12}")
        if show_wrong:
            for pair, _, similarity in wrong:
                self.stdout.write(f"WRONG {similarity:.3f} {pair['a']!r} ~ {pair['b']!r}")
            for pair, hit, _ in same:
                if not hit:
                    self.stdout.write(f"MISSED {pair['a']!r} ~ {pair['b']!r}")
        self.stdout.write(
            f"\nparaphrase recall {recall:.1%} ({sum(1 for o in same if o[1])}/{len(same)}), "
            f"hits {len(hits)}, wrong {len(wrong)} ({wrong_share:.1%} of hits)"
        )
        self.stdout.write(
            json.dumps({"pairs": len(outcomes), "recall": round(recall, 4), "wrong_hit_share": round(wrong_share, 4)})
        )
