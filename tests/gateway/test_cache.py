"""The semantic cache end to end: the official SDK against a real gateway, pgvector in the embedded
PostgreSQL, the exact tier in Valkey. Cache stores happen after the response, so tests wait for them."""

from __future__ import annotations

import time
from decimal import Decimal

import httpx
import openai
import pytest
from openai import OpenAI

from billing.ledger import drain
from billing.models import LedgerEntry
from gateway.mock_provider import REFUSAL_TEXT, answer_text
from gateway.models import CacheEntry
from sentinel import redis_keys
from sentinel.redis_clients import sync_redis
from tests.servers import scrape_metrics, start_gateway, wait_semantic_ready

PARAPHRASES = [
    ("How do I reset my password?", "how do i reset my password"),
    ("What is the capital of Australia?", "whats the capital of australia?"),
]


@pytest.fixture
def served(gateway, tenant, make_key, make_model):
    model, (provider,) = make_model()
    return model, provider, OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)


def wait_stored(tenant, count: int, timeout: float = 10.0) -> None:
    """Until the tenant's `count`th answer is stored: its row in PostgreSQL, then its exact key in Redis
    (a store inserts the row first and sets the key after it, in a pipeline that also counts the
    tenant's entries; a repeat asked between the two is a miss)."""
    deadline = time.monotonic() + timeout
    counter = redis_keys.cache_tenant_count(tenant.pk)
    while CacheEntry.objects.filter(tenant=tenant).count() < count or int(sync_redis().get(counter) or 0) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {count} cache entries")
        time.sleep(0.05)


def ask(client, model: str, prompt: str, **extra):
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": prompt}], **extra
    )


def test_exact_repeat_is_served_from_cache(served, gateway, tenant, mock_provider, live_db):
    model, provider, client = served

    def tiers() -> tuple[float, float]:
        scrape = scrape_metrics(gateway.url)
        return tuple(scrape.value("sentinel_cache_requests_total", tier=t) for t in ("miss", "hit-exact"))

    before = tiers()
    first = ask(client, model, "Exact repeat please")
    assert first.headers["x-sentinel-cache"] == "miss"
    wait_stored(tenant, 1)
    second = ask(client, model, "Exact repeat please")
    assert second.headers["x-sentinel-cache"] == "hit-exact"
    assert second.headers["x-sentinel-cost-usd"] == "0.0000000000"
    assert second.headers["x-sentinel-provider"] == "cache"
    assert second.parse().choices[0].message.content == answer_text("Exact repeat please")
    assert second.parse().usage.completion_tokens == 40
    assert mock_provider.stats(provider)["calls"] == 1
    # whitespace that cannot change the answer does not defeat the exact tier
    assert ask(client, model, "  Exact   repeat please ").headers["x-sentinel-cache"] == "hit-exact"
    # ... and /metrics counts them by tier: one miss, two exact hits.
    after = tiers()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 2)
    # The hits are written to the entry (in one statement, a moment later): its use count and time.
    time.sleep(0.6)
    entry = CacheEntry.objects.get(tenant=tenant)
    assert entry.hits == 2 and entry.last_hit_at is not None and entry.last_hit_at > entry.created_at


@pytest.mark.parametrize(("stored", "asked"), PARAPHRASES)
def test_paraphrase_is_served_from_the_semantic_tier(served, tenant, mock_provider, live_db, stored, asked):
    model, provider, client = served
    ask(client, model, stored)
    wait_stored(tenant, 1)
    hit = ask(client, model, asked)
    assert hit.headers["x-sentinel-cache"] == "hit-semantic"
    assert 0.5 < float(hit.headers["x-sentinel-cache-similarity"]) <= 1.0
    assert hit.parse().choices[0].message.content == answer_text(stored)
    assert mock_provider.stats(provider)["calls"] == 1


@pytest.mark.parametrize(
    ("stored", "asked"),
    [
        ("Convert 5 km to miles", "Convert 5 miles to km"),
        ("How do I reverse a list in Python?", "How do I reverse a list in JavaScript?"),
        ("Are grapes safe for dogs?", "Are grapes toxic to dogs?"),
    ],
)
def test_near_misses_are_not_served(served, tenant, mock_provider, live_db, stored, asked):
    model, provider, client = served
    ask(client, model, stored)
    wait_stored(tenant, 1)
    response = ask(client, model, asked)
    assert response.headers["x-sentinel-cache"] == "miss"
    assert response.parse().choices[0].message.content == answer_text(asked)
    assert mock_provider.stats(provider)["calls"] == 2


def test_no_tenant_ever_gets_another_tenants_entry(gateway, make_tenant, make_key, make_model, mock_provider, live_db):
    model, (provider,) = make_model()
    tenant_a, tenant_b = make_tenant(), make_tenant()
    a = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant_a), max_retries=0)
    b = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant_b), max_retries=0)
    ask(a, model, "Shared question across tenants")
    wait_stored(tenant_a, 1)
    for prompt in ("Shared question across tenants", "shared question across tenants?"):
        # B stores nothing of its own, so any hit here could only be A's entry.
        response = ask(b, model, prompt, extra_body={"cache": {"no-store": True}})
        assert response.headers["x-sentinel-cache"] == "miss"
    assert mock_provider.stats(provider)["calls"] == 3


def test_another_model_or_system_prompt_or_parameter_never_hits(served, make_model, tenant, live_db):
    model, _, client = served
    other_model, _ = make_model()
    prompt = "What is the boiling point of water?"
    ask(client, model, prompt)
    wait_stored(tenant, 1)
    assert ask(client, other_model, prompt).headers["x-sentinel-cache"] == "miss"
    with_system = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "system", "content": "Answer in French."}, {"role": "user", "content": prompt}],
    )
    assert with_system.headers["x-sentinel-cache"] == "miss"
    assert ask(client, model, prompt, temperature=1.5).headers["x-sentinel-cache"] == "miss"
    assert ask(client, model, prompt, max_tokens=7).headers["x-sentinel-cache"] == "miss"
    assert ask(client, model, prompt).headers["x-sentinel-cache"] == "hit-exact"


def test_earlier_conversation_is_part_of_the_partition(served, tenant, live_db):
    model, _, client = served

    def converse(history: str, question: str):
        return client.chat.completions.with_raw_response.create(
            model=model,
            messages=[
                {"role": "user", "content": history},
                {"role": "assistant", "content": "Sure."},
                {"role": "user", "content": question},
            ],
        )

    converse("Let's talk about Python.", "How do I sort a list?")
    wait_stored(tenant, 1)
    assert converse("Let's talk about Rust.", "How do I sort a list?").headers["x-sentinel-cache"] == "miss"
    assert converse("Let's talk about Python.", "How do I sort a list?").headers["x-sentinel-cache"] == "hit-exact"


def test_streamed_replay_is_what_the_sdk_expects(served, tenant, mock_provider, live_db):
    model, provider, client = served
    ask(client, model, "Replay me as a stream")
    wait_stored(tenant, 1)
    live = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Live stream"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    replayed = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Replay me as a stream"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    for chunks, prompt in ((live, "Live stream"), (replayed, "Replay me as a stream")):
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer_text(prompt)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
        assert {c.object for c in chunks} == {"chat.completion.chunk"}
        assert len({c.id for c in chunks}) == 1
    assert len(replayed) > 10  # chunked like a live stream, not one blob
    assert mock_provider.stats(provider)["calls"] == 2


def test_a_streamed_answer_is_stored_when_it_completes(served, tenant, live_db):
    model, _, client = served
    list(
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "stream then plain"}], stream=True
        )
    )
    wait_stored(tenant, 1)
    hit = ask(client, model, "stream then plain")
    assert hit.headers["x-sentinel-cache"] == "hit-exact"
    assert hit.parse().choices[0].message.content == answer_text("stream then plain")


def test_errors_refusals_tool_calls_and_broken_streams_are_never_stored(served, tenant, mock_provider, live_db):
    model, provider, client = served
    ask(client, model, "Please [[refuse]] this")
    mock_provider.control(provider, error_rate=1.0)
    with pytest.raises(openai.APIStatusError):
        ask(client, model, "this one fails")
    mock_provider.control(provider, error_rate=0.0, drop_after=3, tpt_ms=5)
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "broken"}], stream=True))
    mock_provider.control(provider, drop_after=None)
    tools = [{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}]
    called = ask(client, model, "[[tool]] where is my order", tools=tools).parse()
    assert called.choices[0].message.tool_calls[0].function.name == "lookup_order"
    streamed = list(
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "[[tool]] where is it now"}], tools=tools, stream=True
        )
    )
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "tool_calls"
    time.sleep(1.0)
    assert CacheEntry.objects.filter(tenant=tenant).count() == 0
    assert ask(client, model, "[[tool]] where is my order", tools=tools).headers["x-sentinel-cache"] == "miss"
    again = ask(client, model, "Please [[refuse]] this")
    assert again.headers["x-sentinel-cache"] == "miss"
    assert again.parse().choices[0].message.content == REFUSAL_TEXT


def test_ttl_expiry(served, tenant, live_db):
    model, _, client = served
    ask(client, model, "short lived", extra_body={"cache": {"ttl": 1}})
    wait_stored(tenant, 1)
    assert ask(client, model, "short lived").headers["x-sentinel-cache"] == "hit-exact"
    time.sleep(1.2)
    assert ask(client, model, "short lived").headers["x-sentinel-cache"] == "miss"


def test_size_cap_evicts_the_least_recently_used(served, tenant, live_db):
    model, _, client = served
    tenant.cache_max_entries = 2
    tenant.save()
    from sentinel.localstate import announce_change

    announce_change()
    for i, prompt in enumerate(("first entry alpha", "second entry bravo")):
        ask(client, model, prompt)
        wait_stored(tenant, i + 1)
    assert ask(client, model, "first entry alpha").headers["x-sentinel-cache"] == "hit-exact"  # now most recent
    time.sleep(0.3)
    ask(client, model, "third entry charlie")
    time.sleep(1.0)
    prompts = set(CacheEntry.objects.filter(tenant=tenant).values_list("prompt", flat=True))
    assert prompts == {"first entry alpha", "third entry charlie"}
    assert ask(client, model, "second entry bravo").headers["x-sentinel-cache"] == "miss"


def test_a_new_partition_is_neither_embedded_nor_searched_until_it_is_asked_again(
    served, gateway, tenant, mock_provider, live_db
):
    """The first question in a new partition (one system prompt's) has nothing to find: it is not
    embedded and not searched, and its answer is stored with the static first stage's vector only. A paraphrase
    asked next is found by that vector, and MiniLM embeds it and the first one in one run (the entry
    has no MiniLM vector yet) before it is served; a question the verifier would refuse whatever
    MiniLM said (another number) is searched but never embedded."""
    model, provider, client = served
    system = {"role": "system", "content": f"You answer questions about order {time.time_ns()}."}

    def counters() -> tuple[float, ...]:
        scrape = scrape_metrics(gateway.url)
        return (
            scrape.value("sentinel_cache_semantic_lookups_total", outcome="skipped_empty"),
            scrape.value("sentinel_cache_semantic_lookups_total", outcome="searched"),
            scrape.value("sentinel_cache_embedded_prompts_total", kind="query"),
            scrape.value("sentinel_cache_embedded_prompts_total", kind="deferred"),
            scrape.value("sentinel_cache_embed_runs_total"),
        )

    def converse(question: str):
        return client.chat.completions.with_raw_response.create(
            model=model, messages=[system, {"role": "user", "content": question}]
        )

    start = counters()
    first = converse("How do I reset my password?")
    assert first.headers["x-sentinel-cache"] == "miss"
    wait_stored(tenant, 1)
    entry = CacheEntry.objects.get(tenant=tenant)
    assert entry.embedding is None and len(entry.static_embedding) == 256
    assert [b - a for a, b in zip(start, counters(), strict=True)] == [1, 0, 0, 0, 0]

    hit = converse("how do i reset my password")
    assert hit.headers["x-sentinel-cache"] == "hit-semantic"
    assert hit.parse().choices[0].message.content == answer_text("How do I reset my password?")
    assert [b - a for a, b in zip(start, counters(), strict=True)] == [1, 1, 1, 1, 1]
    deadline = time.monotonic() + 10  # its vector is written after that response
    while entry.embedding is None:
        assert time.monotonic() < deadline, "the entry's MiniLM vector was never written"
        time.sleep(0.05)
        entry.refresh_from_db()
    assert len(entry.embedding) == 384

    # Only a number differs from the entry: the verifier would refuse it at any cosine, so no MiniLM.
    assert converse("How do I reset my password on 3 devices?").headers["x-sentinel-cache"] == "miss"
    assert [b - a for a, b in zip(start, counters(), strict=True)] == [1, 2, 1, 1, 1]
    assert mock_provider.stats(provider)["calls"] == 2


def test_a_conversations_first_answer_is_filed_without_a_vector_and_still_found(
    served, gateway, tenant, mock_provider, live_db
):
    """A turn of a conversation (an answer before the prompt) is its own partition, seldom asked
    again: its answer is filed with no vector at all. A paraphrase asked in the same conversation
    finds it among the entries filed without one, gives it its static vector (written after the
    response) and is served it."""
    model, provider, client = served
    turns = [
        {"role": "system", "content": f"You answer questions about order {time.time_ns()}."},
        {"role": "user", "content": "Where is my parcel?"},
        {"role": "assistant", "content": "It left the depot this morning."},
    ]

    def converse(question: str):
        return client.chat.completions.with_raw_response.create(
            model=model, messages=[*turns, {"role": "user", "content": question}]
        )

    first = converse("How do I reset my password?")
    assert first.headers["x-sentinel-cache"] == "miss"
    wait_stored(tenant, 1)
    entry = CacheEntry.objects.get(tenant=tenant)
    assert (entry.embedding, entry.static_embedding) == (None, None)

    hit = converse("how do i reset my password")
    assert hit.headers["x-sentinel-cache"] == "hit-semantic"
    assert hit.parse().choices[0].message.content == answer_text("How do I reset my password?")
    assert mock_provider.stats(provider)["calls"] == 1
    deadline = time.monotonic() + 10  # written after that response
    while entry.static_embedding is None:
        assert time.monotonic() < deadline, "the entry's static vector was never written"
        time.sleep(0.05)
        entry.refresh_from_db()
    assert len(entry.static_embedding) == 256
    assert CacheEntry.objects.filter(tenant=tenant).count() == 1


def wait_for_prompt(tenant, prompt: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not CacheEntry.objects.filter(tenant=tenant, prompt=prompt).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{prompt!r} was never stored")
        time.sleep(0.05)


def test_the_cap_holds_exactly_with_the_count_kept_in_redis(served, tenant, live_db):
    """Stores count a tenant's entries in Redis and count the database only past the cap (or when
    the counter is new): the cap still holds exactly, and a lost counter is rebuilt from the rows."""
    from gateway.cache.engine import tenant_redis_key
    from sentinel.localstate import announce_change
    from sentinel.redis_clients import sync_redis

    model, _, client = served
    tenant.cache_max_entries = 3
    tenant.save()
    announce_change()
    counter = tenant_redis_key(tenant.pk)
    for i in range(5):
        ask(client, model, f"capped entry {i}")
        wait_for_prompt(tenant, f"capped entry {i}")
        time.sleep(0.2)  # the eviction runs after the row is written
        assert CacheEntry.objects.filter(tenant=tenant).count() == min(i + 1, 3)
    assert int(sync_redis().get(counter)) == 3
    sync_redis().delete(counter)  # Redis lost it: the next store counts the rows again
    ask(client, model, "capped entry 5")
    wait_for_prompt(tenant, "capped entry 5")
    time.sleep(0.2)
    assert CacheEntry.objects.filter(tenant=tenant).count() == 3
    assert int(sync_redis().get(counter)) == 3


def test_per_request_controls(served, tenant, mock_provider, live_db):
    model, provider, client = served
    ask(client, model, "controlled", extra_body={"cache": {"no-store": True}})
    time.sleep(0.5)
    assert CacheEntry.objects.filter(tenant=tenant).count() == 0
    ask(client, model, "controlled")
    wait_stored(tenant, 1)
    bypass = ask(client, model, "controlled", extra_headers={"x-sentinel-cache-control": "no-cache"})
    assert bypass.headers["x-sentinel-cache"] == "bypass"
    other_space = ask(client, model, "controlled", extra_body={"cache": {"namespace": "v2"}})
    assert other_space.headers["x-sentinel-cache"] == "miss"
    assert ask(client, model, "controlled").headers["x-sentinel-cache"] == "hit-exact"
    assert mock_provider.stats(provider)["calls"] == 4


def test_the_header_forms_of_the_controls(served, tenant, live_db):
    """no-store, ttl and the namespace given as headers act as their body forms do."""
    model, _, client = served
    ask(client, model, "headed", extra_headers={"x-sentinel-cache-control": "no-store"})
    time.sleep(0.5)
    assert CacheEntry.objects.filter(tenant=tenant).count() == 0
    ask(client, model, "headed", extra_headers={"x-sentinel-cache-control": "ttl=1"})
    wait_stored(tenant, 1)
    entry = CacheEntry.objects.get(tenant=tenant)
    assert 0.5 <= (entry.expires_at - entry.created_at).total_seconds() <= 1.5
    spaced = {"x-sentinel-cache-namespace": "v2"}
    assert ask(client, model, "headed", extra_headers=spaced).headers["x-sentinel-cache"] == "miss"
    wait_stored(tenant, 2)
    assert ask(client, model, "headed", extra_headers=spaced).headers["x-sentinel-cache"] == "hit-exact"
    time.sleep(1.2)  # the first entry's one-second TTL is over; the namespaced one lives on
    assert ask(client, model, "headed").headers["x-sentinel-cache"] == "miss"


@pytest.mark.parametrize(
    "control",
    [
        {"cache": "yes"},
        {"cache": {"ttl": -5}},
        {"cache": {"ttl": "soon"}},
        {"cache": {"ttl": "60"}},  # the body is JSON: a number, not text
        {"cache": {"ttl": True}},
        {"cache": {"ttl": 60.5}},
        {"cache": {"ttl": 1e300}},
        {"cache": {"nocache": True}},
        {"cache": {"no-cache": "maybe"}},
    ],
)
def test_bad_controls_are_400(gateway, api_key, model, mock_provider, control):
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {api_key}"},
        json={"model": model[0], "messages": [{"role": "user", "content": "x"}], **control},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"].startswith("cache")
    assert mock_provider.stats(model[1][0])["calls"] == 0


@pytest.mark.parametrize(
    "header",
    [
        "ttl=\u0666\u0660",
        "ttl=6_0",
        "ttl=+60",
        "ttl=-60",
        "ttl=60s",
        "ttl=0x3c",
        "ttl=\uff16\uff10",
        "ttl=" + "9" * 5000,
        "ttl",
    ],
)
def test_a_header_ttl_is_ascii_digits(gateway, api_key, model, mock_provider, tenant, live_db, header):
    """int() reads Arabic-Indic and full-width digits, underscores and a sign; the header's ttl is
    plain digits or a 400, and nothing is asked or stored."""
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers={"authorization": f"Bearer {api_key}", "x-sentinel-cache-control": header.encode()},
        json={"model": model[0], "messages": [{"role": "user", "content": "x"}]},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "cache.ttl"
    assert mock_provider.stats(model[1][0])["calls"] == 0
    assert CacheEntry.objects.filter(tenant=tenant).count() == 0


def test_a_ttl_written_as_a_whole_float_is_that_many_seconds(gateway, make_tenant, make_key, make_model, live_db):
    """60.0 is 60 in JSON Schema, as the served schema (and the fuzzer, which found this) reads it."""
    model, _ = make_model()
    tenant = make_tenant()
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
    reply = ask(client, model, "a float ttl", extra_body={"cache": {"ttl": 474.0}})
    assert reply.headers["x-sentinel-cache"] == "miss"
    wait_stored(tenant, 1)
    entry = CacheEntry.objects.get(tenant=tenant)
    assert 473 <= (entry.expires_at - entry.created_at).total_seconds() <= 475


def test_cache_off_for_a_tenant(gateway, make_tenant, make_key, make_model, mock_provider, live_db):
    model, (provider,) = make_model()
    tenant = make_tenant(cache_enabled=False)
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
    for _ in range(2):
        assert ask(client, model, "no cache here").headers["x-sentinel-cache"] == "bypass"
    assert mock_provider.stats(provider)["calls"] == 2


def test_the_semantic_tier_and_its_threshold_are_the_tenants_to_set(
    gateway, make_tenant, make_key, make_model, tenancy, live_db
):
    """Both are on the tenant's admin page; semantic off keeps exact hits and turns paraphrases into
    misses; a threshold above a paraphrase's similarity turns it away too."""
    from django.test import Client

    admin = Client()
    admin.force_login(tenancy.owner)
    page = admin.get(f"/admin/tenants/tenant/{tenancy.tenant.pk}/change/").content.decode()
    assert 'name="semantic_cache_enabled"' in page and 'name="semantic_threshold"' in page

    model, _ = make_model()
    stored, asked = PARAPHRASES[0]

    def tenant_with(**settings):
        tenant = make_tenant(**settings)
        client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
        ask(client, model, stored)
        wait_stored(tenant, 1)
        return client

    default = tenant_with()
    similarity = float(ask(default, model, asked).headers["x-sentinel-cache-similarity"])
    off = tenant_with(semantic_cache_enabled=False)
    assert ask(off, model, asked).headers["x-sentinel-cache"] == "miss"
    assert ask(off, model, stored).headers["x-sentinel-cache"] == "hit-exact"
    strict = tenant_with(semantic_threshold=min(0.999, similarity + 0.01))
    assert ask(strict, model, asked).headers["x-sentinel-cache"] == "miss"
    lenient = tenant_with(semantic_threshold=max(0.5, similarity - 0.05))
    assert ask(lenient, model, asked).headers["x-sentinel-cache"] == "hit-semantic"


def test_hits_are_recorded_with_their_tier_and_saving(served, tenant, live_db):
    model, _, client = served
    miss = ask(client, model, "record the saving")
    wait_stored(tenant, 1)
    ask(client, model, "record the saving")
    ask(client, model, "please record the saving")
    time.sleep(0.3)
    drain()
    rows = {row.cache_tier: row for row in LedgerEntry.objects.filter(tenant=tenant)}
    assert set(rows) == {"miss", "hit-exact", "hit-semantic"}
    paid = Decimal(miss.headers["x-sentinel-cost-usd"])
    assert rows["miss"].cost_usd == paid and rows["miss"].saved_cost_usd == 0
    for tier in ("hit-exact", "hit-semantic"):
        assert rows[tier].cost_usd == 0
        assert rows[tier].saved_cost_usd == paid
        assert rows[tier].provider == "cache"


def test_fails_open_when_the_vector_store_is_unreachable(
    test_database_name, gateway, tenant, make_key, make_model, mock_provider, live_db
):
    """The cache's own database connection points nowhere; requests still get answers, and every
    failure is counted (metrics), the store's after the response and the lookup's before the call."""
    model, (provider,) = make_model()
    key = make_key(tenant)
    # A working gateway files one entry, so the partition has something to search (a lookup in an
    # empty partition never reaches the database).
    ask(OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0), model, "seed question")
    wait_stored(tenant, 1)
    broken = start_gateway(
        test_database_name,
        env={"SENTINEL_CACHE_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"},
    )

    def failures(stage: str) -> float:
        return scrape_metrics(broken.url).value("sentinel_cache_failures_total", stage=stage)

    try:
        client = OpenAI(base_url=broken.base_url, api_key=key, max_retries=0)
        # Until its embedding model has loaded the process skips the semantic tier: ask until a
        # lookup has reached the database.
        deadline, warming = time.monotonic() + 60, 0
        while failures("lookup") < 1:
            assert time.monotonic() < deadline, "no lookup ever reached the semantic tier"
            response = ask(client, model, f"warming {warming}")
            assert response.parse().choices[0].message.content == answer_text(f"warming {warming}")
            warming += 1
            time.sleep(0.2)
        before = failures("lookup")
        for prompt in ("still answered", "and this one too"):
            response = ask(client, model, prompt)
            assert response.parse().choices[0].message.content == answer_text(prompt)
            assert response.headers["x-sentinel-cache"] == "miss"
        assert failures("lookup") == before + 2  # both reached the semantic tier's database, and went upstream
        while failures("store") < 1:  # the answers were not kept (after the responses)
            assert time.monotonic() < deadline + 30, "no failed store was counted"
            time.sleep(0.2)
        assert mock_provider.stats(provider)["calls"] == 1 + warming + 2
        assert CacheEntry.objects.filter(tenant=tenant).count() == 1
    finally:
        broken.stop()


def test_invalidation_from_the_admin_reaches_every_tier(served, tenant, tenancy, live_db):
    from django.test import Client

    model, _, client = served
    for prompt in ("Explain photosynthesis briefly", "What year did the Berlin Wall fall?"):
        ask(client, model, prompt)
    wait_stored(tenant, 2)
    assert (
        ask(client, model, "Explain photosynthesis briefly").headers["x-sentinel-cache"] == "hit-exact"
    )  # now in the process's LRU too
    admin = Client()
    admin.force_login(tenancy.superuser)
    entry = CacheEntry.objects.get(tenant=tenant, prompt="Explain photosynthesis briefly")
    response = admin.post("/admin/gateway/cacheentry/", {"action": "invalidate", "_selected_action": [entry.pk]})
    assert response.status_code == 302
    assert ask(client, model, "Explain photosynthesis briefly").headers["x-sentinel-cache"] == "miss"
    wait_stored(tenant, 2)  # that miss's answer is filed again (stores are gathered for 20 ms): before the clear
    assert ask(client, model, "What year did the Berlin Wall fall?").headers["x-sentinel-cache"] == "hit-exact"
    admin.post("/admin/tenants/tenant/", {"action": "clear_cache", "_selected_action": [tenant.pk]})
    assert CacheEntry.objects.filter(tenant=tenant).count() == 0
    assert ask(client, model, "What year did the Berlin Wall fall?").headers["x-sentinel-cache"] == "miss"


def test_an_answer_in_flight_when_the_cache_is_cleared_is_not_kept(served, tenant, tenancy, mock_provider, live_db):
    """The admin clears the tenant's cache while a request is waiting on the provider: its answer
    reaches the client but is not filed (the clear would otherwise be undone by it), and the cache
    works again for requests received after the clear."""
    from concurrent.futures import ThreadPoolExecutor

    from django.test import Client

    model, provider, client = served
    prompt = "Which answer was asked for before the clear?"
    admin = Client()
    admin.force_login(tenancy.superuser)
    mock_provider.control(provider, slow_ms=1500)
    try:
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(ask, client, model, prompt)
            deadline = time.monotonic() + 10
            while mock_provider.stats(provider)["calls"] < 1:  # the request is at the provider
                assert time.monotonic() < deadline
                time.sleep(0.02)
            response = admin.post("/admin/tenants/tenant/", {"action": "clear_cache", "_selected_action": [tenant.pk]})
            assert response.status_code == 302
            reply = in_flight.result(timeout=30)
    finally:
        mock_provider.control(provider, slow_ms=0)
    assert reply.headers["x-sentinel-cache"] == "miss"
    assert reply.parse().choices[0].message.content == answer_text(prompt)
    time.sleep(1.2)  # past the clock margin; and the store (gathered for 20 ms) has been written or dropped
    assert CacheEntry.objects.filter(tenant=tenant).count() == 0
    assert ask(client, model, prompt).headers["x-sentinel-cache"] == "miss"
    assert mock_provider.stats(provider)["calls"] == 2
    wait_stored(tenant, 1)
    assert ask(client, model, prompt).headers["x-sentinel-cache"] == "hit-exact"
    assert mock_provider.stats(provider)["calls"] == 2


def test_a_partition_where_nothing_is_served_goes_cold_and_a_hit_warms_it(
    test_database_name, tenant, make_key, make_model, mock_provider, live_db, embedding_model
):
    """Past SENTINEL_CACHE_COLD_AFTER answers stored with no hit, a partition is cold: only one
    lookup in SENTINEL_CACHE_COLD_PROBE searches it. None of these questions could be served for
    another, so none is embedded by MiniLM; those answered while it was cold, but for the probes',
    are stored without a static vector (probes search only entries that have one). An exact hit warms the partition,
    and the next lookup gives them theirs and serves a paraphrase of a prompt stored while it was
    cold (MiniLM runs for that one)."""
    from gateway.cache.engine import partition_misses_redis_key
    from sentinel.redis_clients import sync_redis

    # The lookup's 500 ms bound is not what this test is about: on a loaded host a new process's first
    # MiniLM runs (the prompt and two entries, at the end) took longer, and the lookup failed open.
    env = {
        "SENTINEL_CACHE_COLD_AFTER": "3",
        "SENTINEL_CACHE_COLD_PROBE": "2",
        "SENTINEL_CACHE_LOOKUP_TIMEOUT_MS": "10000",
    }
    gateway = start_gateway(test_database_name, env=env)
    try:
        wait_semantic_ready(gateway)
        model, (provider,) = make_model()
        client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
        system = {"role": "system", "content": f"You answer questions about order {time.time_ns()}."}

        def converse(question: str, *answered_for: str) -> str:
            """The cache's header; the answer is the question's own, or one of `answered_for`'s."""
            reply = client.chat.completions.with_raw_response.create(
                model=model, messages=[system, {"role": "user", "content": question}]
            )
            expected = {answer_text(prompt) for prompt in answered_for or (question,)}
            assert reply.parse().choices[0].message.content in expected
            return reply.headers["x-sentinel-cache"]

        def counters() -> list[float]:
            scrape = scrape_metrics(gateway.url)
            return [
                scrape.value("sentinel_cache_semantic_lookups_total", outcome=outcome)
                for outcome in ("skipped_empty", "searched", "skipped_cold")
            ] + [scrape.value("sentinel_cache_embedded_prompts_total", kind="query")]

        def stored(prompt: str) -> CacheEntry:
            wait_for_prompt(tenant, prompt)
            return CacheEntry.objects.get(tenant=tenant, prompt=prompt)

        questions = [
            "How do I reset my password?",  # empty partition: not searched
            "Where is my parcel right now?",  # searched (1 since a hit)
            "Can I change the delivery address?",  # searched (2): the third store makes it cold
            "Why was my card declined at checkout?",  # cold, probe 0: searched
            "What is the capital of Australia?",  # cold: skipped
            "How long does a refund take?",  # cold, probe: searched
        ]
        start = counters()
        for question in questions:
            assert converse(question) == "miss"
            stored(question)
            time.sleep(0.1)  # the store's counts are written after the row
        assert [b - a for a, b in zip(start, counters(), strict=True)] == [1, 4, 1, 0]
        assert int(sync_redis().get(partition_misses_redis_key(stored(questions[0]).partition))) == 6
        # The first three were looked up while the partition was warm; of the last three, cold, two were probes.
        assert [stored(q).static_embedding is not None for q in questions] == [True] * 4 + [False] + [True]
        assert all(stored(question).embedding is None for question in questions)

        # Cold, not a probe: a paraphrase of a stored prompt is not looked for.
        assert converse("whats the capital of australia?") == "miss"
        assert [b - a for a, b in zip(start, counters(), strict=True)] == [1, 4, 2, 0]
        assert stored("whats the capital of australia?").static_embedding is None
        # An exact repeat is served, and warms the partition.
        assert converse("How do I reset my password?") == "hit-exact"
        deadline = time.monotonic() + 5
        while sync_redis().exists(partition_misses_redis_key(stored(questions[0]).partition)):
            assert time.monotonic() < deadline, "the hit never warmed the partition"
            time.sleep(0.05)
        # Warm again: searched, and MiniLM embeds the prompt (with the candidates it could be served from).
        # (Either prompt stored while cold may be the one served.)
        asked_while_cold = ("What is the capital of Australia?", "whats the capital of australia?")
        assert converse("what is the capital of australia", *asked_while_cold) == "hit-semantic"
        assert [b - a for a, b in zip(start, counters(), strict=True)] == [1, 5, 2, 1]
        assert mock_provider.stats(provider)["calls"] == 7
        # That lookup gave the two entries filed while cold their static vectors (written after it).
        deadline = time.monotonic() + 5
        while CacheEntry.objects.filter(tenant=tenant, static_embedding__isnull=True).exists():
            assert time.monotonic() < deadline, "the entries filed while cold never got their static vectors"
            time.sleep(0.05)
    finally:
        gateway.stop()
