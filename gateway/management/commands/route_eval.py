"""How well `model: "auto"` routes: accuracy of the local classifier on a labeled set of prompts, and
the provider cost it saves against sending everything to the smart model.

The modeled cost of a prompt is its prompt tokens (as admission bounds them, with the models'
tokenizer) at the input price of the model it is routed to, plus an answer length that depends on
the task, not on the route (the labeled class: --fast-answer-tokens or --smart-answer-tokens) at
that model's output price. Prices come from the price table. A smart prompt routed to fast is a
quality risk the saving does not count: it is reported on its own line. The last line printed is JSON.
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from billing.prices import price_at
from gateway.limits.tokens import prompt_bound
from gateway.upstream.autoroute import FAST, SMART, classify
from sentinel.jsonl import read_jsonl

DEFAULT_DATA = Path(settings.BASE_DIR) / "tests" / "data" / "routing_eval.jsonl"


def load_prompts(path: Path) -> list[dict]:
    return read_jsonl(
        path,
        valid=lambda row: isinstance(row["prompt"], str) and row["label"] in (FAST, SMART),
        expected="{'prompt': str, 'label': 'fast'|'smart', ...}",
        what="prompts",
    )


def evaluate(
    rows: list[dict], prices: dict[str, tuple[Decimal, Decimal]], answer_tokens: dict[str, int], models: list[str]
) -> dict:
    confusion: Counter = Counter()
    routed_cost = smart_cost = perfect_cost = Decimal(0)
    for row in rows:
        messages = [{"role": "user", "content": row["prompt"]}]
        route = classify(messages).route
        confusion[(row["label"], route)] += 1
        prompt, answer = prompt_bound({"messages": messages}, models), answer_tokens[row["label"]]
        routed_cost += prompt * prices[route][0] + answer * prices[route][1]
        smart_cost += prompt * prices[SMART][0] + answer * prices[SMART][1]
        perfect_cost += prompt * prices[row["label"]][0] + answer * prices[row["label"]][1]
    total = sum(confusion.values())
    correct = confusion[(FAST, FAST)] + confusion[(SMART, SMART)]
    smart_total = confusion[(SMART, FAST)] + confusion[(SMART, SMART)]
    fast_total = confusion[(FAST, FAST)] + confusion[(FAST, SMART)]
    return {
        "prompts": total,
        "accuracy": round(correct / total, 4),
        "smart_recall": round(confusion[(SMART, SMART)] / smart_total, 4) if smart_total else None,
        "fast_recall": round(confusion[(FAST, FAST)] / fast_total, 4) if fast_total else None,
        "smart_sent_to_fast": confusion[(SMART, FAST)],
        "fast_sent_to_smart": confusion[(FAST, SMART)],
        "cost_all_smart_usd": str(smart_cost.quantize(Decimal("1e-6"))),
        "cost_routed_usd": str(routed_cost.quantize(Decimal("1e-6"))),
        "saving": round(float(1 - routed_cost / smart_cost), 4) if smart_cost else None,
        "saving_if_every_label_were_followed": round(float(1 - perfect_cost / smart_cost), 4) if smart_cost else None,
    }


class Command(BaseCommand):
    help = 'Accuracy and modeled cost saving of `model: "auto"` routing on a labeled prompt set.'

    def add_arguments(self, parser):
        parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="JSONL: prompt, label, split.")
        parser.add_argument("--split", default="", help="Only prompts of this split (dev, test); default: all.")
        parser.add_argument("--fast-model", default="openai/gpt-4o-mini", help="Priced as the fast route.")
        parser.add_argument("--smart-model", default="openai/gpt-4o", help="Priced as the smart route.")
        parser.add_argument("--fast-answer-tokens", type=int, default=150)
        parser.add_argument("--smart-answer-tokens", type=int, default=600)

    def handle(self, *args, data: Path, split: str, fast_model: str, smart_model: str, **options):
        rows = [row for row in load_prompts(data) if not split or row.get("split") == split]
        if not rows:
            raise CommandError(f"no prompts in split {split!r}")
        prices = {}
        for route, model in ((FAST, fast_model), (SMART, smart_model)):
            price = price_at(model)
            if price.id is None:
                raise CommandError(f"no price for {model} in the price table")
            prices[route] = (price.input_per_token, price.output_per_token)
        answers = {FAST: options["fast_answer_tokens"], SMART: options["smart_answer_tokens"]}
        models = [fast_model, smart_model]
        result = {
            "split": split or "all",
            "fast_model": fast_model,
            "smart_model": smart_model,
            **evaluate(rows, prices, answers, models),
        }
        for split_name in ("dev", "test") if not split else ():
            part = [row for row in rows if row.get("split") == split_name]
            if part:
                result[f"accuracy_{split_name}"] = evaluate(part, prices, answers, models)["accuracy"]
        self.stdout.write(f"prompts:               {result['prompts']}")
        self.stdout.write(f"accuracy:              {result['accuracy']:.1%}")
        for split_name in ("dev", "test"):
            if f"accuracy_{split_name}" in result:
                self.stdout.write(f"  {split_name + ':':20} {result[f'accuracy_{split_name}']:.1%}")
        self.stdout.write(f"smart prompts to fast: {result['smart_sent_to_fast']} (quality risk)")
        self.stdout.write(f"fast prompts to smart: {result['fast_sent_to_smart']} (overspend)")
        self.stdout.write(
            f"modeled cost:          ${result['cost_routed_usd']} routed vs ${result['cost_all_smart_usd']} all to "
            f"{smart_model}: {result['saving']:.1%} saved "
            f"(a perfect router: {result['saving_if_every_label_were_followed']:.1%})"
        )
        self.stdout.write(json.dumps(result))
