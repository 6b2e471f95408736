"""`model: "auto"`: the local classifier on its own and on the labeled set, and through the gateway
(the chosen model answers, the choice and its reason are in a header and on the ledger row)."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.mock_provider import answer_text
from gateway.upstream.autoroute import HEAD_CHARS, TAIL_CHARS, classify

EVAL = Path(__file__).resolve().parents[2] / "data" / "routing_eval.jsonl"


def route(prompt: str) -> str:
    return classify([{"role": "user", "content": prompt}]).route


@pytest.mark.parametrize(
    ("prompt", "expected", "reason"),
    [
        ("What is the capital of France?", "fast", "short or simple request"),
        ("Translate 'good night' into German.", "fast", "simple task"),
        ("Prove that there are infinitely many primes.", "smart", "multi-step reasoning"),
        ("Implement a thread-safe LRU cache in Go with unit tests.", "smart", "code task"),
        ("Find all real roots of x^3 - 6x^2 + 11x - 6 = 0.", "smart", "math"),
        (
            "Design a URL shortener for 10k writes per second and explain the trade-offs.",
            "smart",
            "design or analysis",
        ),
    ],
)
def test_the_classifier_separates_simple_from_demanding_prompts(prompt, expected, reason):
    choice = classify([{"role": "user", "content": prompt}])
    assert (choice.route, choice.reason) == (expected, reason)


def test_only_the_last_user_message_counts():
    history = [
        {"role": "user", "content": "Prove that the square root of 2 is irrational, step by step."},
        {"role": "assistant", "content": "Suppose it were rational..."},
        {"role": "user", "content": "Thanks! What's the capital of Peru?"},
    ]
    assert classify(history).route == "fast"
    parts = [{"role": "user", "content": [{"type": "text", "text": "Derive the integral of x^2 e^x step by step."}]}]
    assert classify(parts).route == "smart"
    assert classify([{"role": "system", "content": "Be brief."}]).route == "fast"  # no user text at all


def test_a_long_prompt_is_read_by_its_head_and_tail_only():
    """What keeps classifying cheap for any prompt (its speed is measured by `python -m bench routing`)."""
    middle = "lorem ipsum dolor sit amet " * 4000
    head = "Please summarize the following. " + "x " * (HEAD_CHARS // 2)
    tail = " y" * (TAIL_CHARS // 2)
    demanding = "Prove that the square root of 2 is irrational, step by step."
    plain = classify([{"role": "user", "content": head + middle + tail}])
    hidden = classify([{"role": "user", "content": head + middle + demanding + middle + tail}])
    assert hidden == plain  # a cue in the unread middle changes nothing
    shown = classify([{"role": "user", "content": demanding + middle + tail}])
    assert (shown.route, shown.reason) != (plain.route, plain.reason)  # the same cue in the head is read


def test_the_labeled_set_is_large_balanced_and_routed_accurately():
    rows = [json.loads(line) for line in EVAL.read_text().splitlines()]
    assert len(rows) >= 200
    assert {row["label"] for row in rows} == {"fast", "smart"}
    assert min(sum(row["label"] == label for row in rows) for label in ("fast", "smart")) >= 80
    held_out = [row for row in rows if row["split"] == "test"]
    assert len(held_out) >= 100
    correct = sum(route(row["prompt"]) == row["label"] for row in held_out)
    assert correct / len(held_out) >= 0.9  # the weights were set on the dev half only


def test_route_eval_reports_accuracy_and_the_modeled_saving(live_db):
    out = StringIO()
    call_command("route_eval", "--split", "test", stdout=out)
    result = json.loads(out.getvalue().splitlines()[-1])
    assert result["prompts"] == sum(json.loads(line)["split"] == "test" for line in EVAL.read_text().splitlines())
    assert result["accuracy"] >= 0.9
    assert 0 < result["saving"] < 1
    assert float(result["cost_routed_usd"]) < float(result["cost_all_smart_usd"])
    assert "saved" in out.getvalue()


@pytest.fixture
def auto_tenant(make_tenant, make_key, make_model):
    """A tenant whose fast and smart models are two aliases of its own, on separate mock providers."""
    fast, (fast_provider,) = make_model()
    smart, (smart_provider,) = make_model(litellm_model="openai/gpt-4o")
    tenant = make_tenant(auto_fast_model=fast, auto_smart_model=smart)
    return tenant, make_key(tenant), fast_provider, smart_provider


def ask(gateway, key: str, prompt: str, **body) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "auto", "messages": [{"role": "user", "content": prompt}], **body},
        timeout=30,
    )


def test_auto_sends_each_prompt_to_the_tenants_fast_or_smart_model(gateway, auto_tenant):
    tenant, key, fast_provider, smart_provider = auto_tenant
    simple = ask(gateway, key, "Who wrote Hamlet?")
    hard = ask(gateway, key, "Prove by induction that 1 + 2 + ... + n = n(n+1)/2, step by step.")
    streamed = ask(gateway, key, "Explain why quicksort is O(n log n) on average, step by step.", stream=True)

    assert simple.status_code == hard.status_code == streamed.status_code == 200
    assert simple.headers["x-sentinel-provider"] == fast_provider
    assert simple.headers["x-sentinel-route"] == "fast; reason=short or simple request"
    assert simple.json()["choices"][0]["message"]["content"] == answer_text("Who wrote Hamlet?")
    assert hard.headers["x-sentinel-provider"] == smart_provider
    assert hard.headers["x-sentinel-route"] == "smart; reason=multi-step reasoning"
    assert streamed.headers["x-sentinel-route"].startswith("smart; ")

    drain()
    rows = {
        row.request_id: row
        for row in LedgerEntry.objects.filter(tenant=tenant).only(
            "request_id", "route", "route_reason", "provider", "model_requested"
        )
    }
    assert len(rows) == 3
    first = rows[simple.headers["x-sentinel-request-id"]]
    second = rows[hard.headers["x-sentinel-request-id"]]
    assert (first.model_requested, first.route, first.route_reason, first.provider) == (
        "auto",
        "fast",
        "short or simple request",
        fast_provider,
    )
    assert (second.route, second.route_reason, second.provider) == ("smart", "multi-step reasoning", smart_provider)


def test_auto_may_only_use_models_the_key_may_use(gateway, make_tenant, make_key, make_model):
    fast, _ = make_model()
    smart, (smart_provider,) = make_model()
    tenant = make_tenant(auto_fast_model=fast, auto_smart_model=smart, allowed_models=[fast])
    key = make_key(tenant)
    assert ask(gateway, key, "Hi!").status_code == 200
    refused = ask(gateway, key, "Derive the derivative of x^x and prove it step by step.")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "model_not_allowed"
    assert smart in refused.json()["error"]["message"]
    drain()
    assert LedgerEntry.objects.filter(tenant=tenant, provider=smart_provider).count() == 0
