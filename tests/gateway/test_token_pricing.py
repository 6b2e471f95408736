"""Money for every kind of token, end to end: the official OpenAI SDK against the real gateway, the
mock provider reporting cached and reasoning tokens as OpenAI does (within prompt_tokens and
completion_tokens), cache reads and writes as Anthropic does (besides input_tokens) and cached tokens
as Gemini does (within promptTokenCount), the last two read back by litellm's translation. Each
answer's cost is computed here by hand from the providers' published rates (litellm's price map, as
the price table was seeded from it) or the deployment's own, and the ledger row, the
`x-sentinel-cost-usd` header (a stream: `usage.cost_usd`) and the spend report's exports must hold
exactly that."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from decimal import Decimal as D

import pytest
from openai import OpenAI

from billing.exports import report_columns, report_csv, report_xlsx, request_log_csv
from billing.models import LedgerEntry
from billing.prices import price_at
from billing.selectors import spend_report
from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
from tests.conftest import unique
from tests.gateway.test_dialect_chains import NO_CACHE, ledger_rows

# The conversation every case sends: OpenAI counts it as PROMPT tokens, and so does the mock in
# every format; the answer is the mock's 40 words, a token each.
MESSAGES = [{"role": "user", "content": "Price each kind of token: " + "ledger " * 30}]
PROMPT = 44
ANSWER = 40

# litellm's published prices (USD per token), as its bundled map has them.
O4_MINI = {"input": D("0.0000011"), "output": D("0.0000044"), "cache_read": D("0.000000275")}
O4_MINI_BATCH = {"input": D("0.00000055"), "output": D("0.0000022")}  # the Batch API's half price
HAIKU_4_5 = {
    "input": D("0.000001"),
    "output": D("0.000005"),
    "cache_read": D("0.0000001"),
    "cache_write": D("0.00000125"),
}

CASES = {
    # OpenAI's rule: 6 of the 44 prompt tokens were cached, billed at the cached rate instead of the
    # input rate; 12 reasoning tokens are part of the 52 completion tokens, at the output rate (o4-mini
    # has no rate of its own for them).
    "openai-cached-and-reasoning": {
        "kind": "openai",
        "model": "openai/o4-mini",
        "faults": {"cache_read_tokens": 6, "reasoning_tokens": 12},
        "tokens": (PROMPT, ANSWER + 12, 6, 0, 12),
        "cost": (PROMPT - 6) * O4_MINI["input"]
        + 6 * O4_MINI["cache_read"]
        + ANSWER * O4_MINI["output"]
        + 12 * O4_MINI["output"],
        "parts": (6 * O4_MINI["cache_read"], D(0), 12 * O4_MINI["output"]),
    },
    # Anthropic's rule: 5 tokens read from the cache and 7 written to it come besides input_tokens
    # (32 here), each kind at its own rate; litellm counts all 44 as prompt tokens.
    "anthropic-cache-read-and-write": {
        "kind": "anthropic",
        "model": "anthropic/claude-haiku-4-5",
        "faults": {"cache_read_tokens": 5, "cache_creation_tokens": 7},
        "tokens": (PROMPT, ANSWER, 5, 7, 0),
        "cost": 32 * HAIKU_4_5["input"]
        + 5 * HAIKU_4_5["cache_read"]
        + 7 * HAIKU_4_5["cache_write"]
        + ANSWER * HAIKU_4_5["output"],
        "parts": (5 * HAIKU_4_5["cache_read"], 7 * HAIKU_4_5["cache_write"], D(0)),
    },
    # Gemini's rule is OpenAI's: cachedContentTokenCount is part of promptTokenCount.
    "gemini-cached": {
        "kind": "gemini",
        "model": "gemini/gemini-2.5-flash",
        "faults": {"cache_read_tokens": 9},
        "tokens": (PROMPT, ANSWER, 9, 0, 0),
        "cost": (PROMPT - 9) * D("0.0000003") + 9 * D("0.00000003") + ANSWER * D("0.0000025"),
        "parts": (9 * D("0.00000003"), D(0), D(0)),
    },
    # A deployment's own price for one kind wins over the map's, the rest still the map's.
    "override-of-one-kind": {
        "kind": "openai",
        "model": "openai/o4-mini",
        "overrides": {"cache_read_price_override": D("0.0000001"), "reasoning_price_override": D("0.00002")},
        "faults": {"cache_read_tokens": 6, "reasoning_tokens": 12},
        "tokens": (PROMPT, ANSWER + 12, 6, 0, 12),
        "cost": (PROMPT - 6) * O4_MINI["input"] + 6 * D("0.0000001") + ANSWER * O4_MINI["output"] + 12 * D("0.00002"),
        "parts": (6 * D("0.0000001"), D(0), 12 * D("0.00002")),
    },
    # A deployment with its own input and output prices is off the table: its cached tokens fall
    # back to its own input price, never to the map's cached rate.
    "own-prices": {
        "kind": "openai",
        "model": "openai/o4-mini",
        "overrides": {
            "input_price_override": D("0.000002"),
            "output_price_override": D("0.000008"),
            "reasoning_price_override": D("0.00001"),
        },
        "faults": {"cache_read_tokens": 6, "reasoning_tokens": 12},
        "tokens": (PROMPT, ANSWER + 12, 6, 0, 12),
        "cost": PROMPT * D("0.000002") + ANSWER * D("0.000008") + 12 * D("0.00001"),
        "parts": (6 * D("0.000002"), D(0), 12 * D("0.00001")),
    },
}


@pytest.fixture
def priced_model(live_db, mock_provider):
    """A model served by one deployment of the case on its own virtual provider of the mock, which
    reports the case's kinds of token. Returns the alias."""

    def make(case: dict) -> str:
        name = unique(case["kind"])
        provider = Provider(name=name, kind=case["kind"], api_base=mock_provider.api_base(name, case["kind"]))
        provider.set_api_key("sk-test-" + name)
        provider.save()
        deployment = Deployment.objects.create(
            name=name, provider=provider, litellm_model=case["model"], **case.get("overrides", {})
        )
        alias = ModelAlias.objects.create(name=unique("priced"))
        ChainEntry.objects.create(alias=alias, deployment=deployment, position=0)
        mock_provider.control(name, **case["faults"])
        return alias.name

    return make


def test_the_price_table_has_every_kind_from_litellms_map(live_db):
    """Seeded from the bundled map (billing/migrations): the rates the cases below are computed with."""
    o4 = price_at("openai/o4-mini")
    assert (o4.input_per_token, o4.output_per_token, o4.cache_read_per_token) == (
        O4_MINI["input"],
        O4_MINI["output"],
        O4_MINI["cache_read"],
    )
    assert (o4.cache_write_per_token, o4.reasoning_per_token) == (None, None)
    assert (o4.batch_input_per_token, o4.batch_output_per_token) == (O4_MINI_BATCH["input"], O4_MINI_BATCH["output"])
    haiku = price_at("anthropic/claude-haiku-4-5")
    assert (
        haiku.input_per_token,
        haiku.output_per_token,
        haiku.cache_read_per_token,
        haiku.cache_write_per_token,
        haiku.batch_cache_read_per_token,
        haiku.batch_cache_write_per_token,
    ) == (*HAIKU_4_5.values(), D("0.00000005"), D("0.000000625"))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case_name", list(CASES))
def test_each_kind_of_token_is_billed_at_its_rate(gateway, api_key, priced_model, case_name, stream):
    case = CASES[case_name]
    alias = priced_model(case)
    client = OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0, timeout=30, default_headers=NO_CACHE)
    if stream:
        raw = client.chat.completions.with_raw_response.create(
            model=alias, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        usage = [chunk.usage for chunk in raw.parse() if chunk.usage][-1]
        billed = usage.model_extra["cost_usd"]
    else:
        raw = client.chat.completions.with_raw_response.create(model=alias, messages=MESSAGES)
        usage = raw.parse().usage
        billed = raw.headers["x-sentinel-cost-usd"]
    expected = case["cost"].quantize(D("1e-10"))
    assert D(billed) == expected
    assert (usage.prompt_tokens, usage.completion_tokens) == case["tokens"][:2]

    row = ledger_rows([raw.headers["x-sentinel-request-id"]])[raw.headers["x-sentinel-request-id"]]
    assert (
        row.prompt_tokens,
        row.completion_tokens,
        row.cache_read_tokens,
        row.cache_write_tokens,
        row.reasoning_tokens,
    ) == case["tokens"]
    assert row.cost_usd == expected
    assert (row.cache_read_cost_usd, row.cache_write_cost_usd, row.reasoning_cost_usd) == case["parts"]
    assert row.batch is False
    own_prices = "input_price_override" in case.get("overrides", {})
    assert row.price_id == (None if own_prices else price_at(case["model"]).id)


def test_the_spend_report_and_the_request_log_show_every_kind(gateway, make_tenant, make_key, priced_model):
    """The kinds' tokens and costs in the spend report (CSV and XLSX, totals included), the prices
    of each kind with the price version, and the request log's export."""
    from openpyxl import load_workbook

    tenant = make_tenant()
    key = make_key(tenant)
    client = OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30, default_headers=NO_CACHE)
    request_ids = []
    for case_name in ("openai-cached-and-reasoning", "anthropic-cache-read-and-write"):
        alias = priced_model(CASES[case_name])
        raw = client.chat.completions.with_raw_response.create(model=alias, messages=MESSAGES)
        request_ids.append(raw.headers["x-sentinel-request-id"])
    ledger_rows(request_ids)
    today = datetime.now(UTC).date()
    report = spend_report(tenants=[tenant], start=today, end=today, group_by=["price"])

    table = list(csv.DictReader(io.StringIO(report_csv(report).decode())))
    assert report_columns(report)[:5] == [
        "price_id",
        "price_model",
        "price_effective_from",
        "input_usd_per_token",
        "output_usd_per_token",
    ]
    by_model = {line["price_model"]: line for line in table[:-1]}
    o4, haiku = by_model["o4-mini"], by_model["claude-haiku-4-5"]
    assert (o4["cache_read_usd_per_token"], o4["cache_write_usd_per_token"], o4["batch_input_usd_per_token"]) == (
        "0.000000275000000",
        "",
        "0.000000550000000",
    )
    assert (haiku["cache_write_usd_per_token"], haiku["batch_cache_write_usd_per_token"]) == (
        "0.000001250000000",
        "0.000000625000000",
    )
    assert [o4[c] for c in ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens")] == ["6", "0", "12"]
    assert [haiku[c] for c in ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens")] == ["5", "7", "0"]
    assert D(o4["reasoning_cost_usd"]) == 12 * O4_MINI["output"]
    assert D(haiku["cache_write_cost_usd"]) == 7 * HAIKU_4_5["cache_write"]
    totals = table[-1]
    assert totals["price_id"] == "TOTAL"
    assert D(totals["cost_usd"]) == (
        CASES["openai-cached-and-reasoning"]["cost"] + CASES["anthropic-cache-read-and-write"]["cost"]
    ).quantize(D("1e-10"))
    assert (totals["cache_read_tokens"], totals["cache_write_tokens"], totals["reasoning_tokens"]) == ("11", "7", "12")
    assert D(totals["cache_read_cost_usd"]) == 6 * O4_MINI["cache_read"] + 5 * HAIKU_4_5["cache_read"]

    sheet = load_workbook(io.BytesIO(report_xlsx(report)), read_only=True)["Spend"]
    header, *_, last = list(sheet.values)
    assert dict(zip(header, last, strict=True))["cache_write_tokens"] == 7

    lines = list(
        csv.DictReader(io.StringIO(b"".join(request_log_csv(LedgerEntry.objects.filter(tenant=tenant))).decode()))
    )
    assert sorted(
        (line["cache_read_tokens"], line["cache_write_tokens"], line["reasoning_tokens"]) for line in lines
    ) == [
        ("5", "7", "0"),
        ("6", "0", "12"),
    ]
    assert {line["batch"] for line in lines} == {"False"}
