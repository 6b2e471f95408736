"""Identical requests in flight ask the provider once: the first to miss the exact tier takes the
lead on its key (cache_lookup.lua), the others wait for its answer and are served it from the exact
tier. Real gateways (two processes, so the lead is shared through Valkey, not process memory), the
mock provider over HTTP through litellm, the official SDK as the client."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from openai import OpenAI

from gateway import metrics
from gateway.mock_answers import Faults
from gateway.mock_provider import answer_text
from gateway.models import CacheEntry
from sentinel.redis_clients import sync_redis
from tests.conftest import wait_for
from tests.servers import scrape_metrics, start_gateway

COALESCED = "sentinel_cache_coalesced_waits_total"


@pytest.fixture(scope="module")
def second_gateway(test_database_name):
    """A second web process on the same database and Valkey: the lead must hold across processes."""
    server = start_gateway(test_database_name)
    yield server
    server.stop()


def waits(*gateways) -> dict[str, float]:
    """The coalesced waits counted by these gateways, by outcome."""
    scrapes = [scrape_metrics(g.url) for g in gateways]
    return {o: sum(s.value(COALESCED, outcome=o) for s in scrapes) for o in ("served", "released", "timeout")}


def leads_held_by(request_ids) -> list[str]:
    """The leads on exact keys that these requests still hold (a lead's value is its holder's id)."""
    held = [sync_redis().get(key) for key in sync_redis().scan_iter(match="*:cache:lead:*", count=1000)]
    return [h.decode() for h in held if h is not None and h.decode() in set(request_ids)]


def at_provider(mock_provider, provider: str, calls: int = 1) -> None:
    """Until `calls` requests have reached the provider."""
    wait_for(lambda: mock_provider.stats(provider)["calls"] >= calls, what=f"{calls} requests at the provider")


def asked_while_the_first_is_at_the_provider(mock_provider, provider: str, first, others, **faults) -> list:
    """Calls `first`, then, once its request is at the provider (made slow by `faults`), each of
    `others`, all at once: their results in that order (a call that raises raises here). The faults
    are set back to the mock's defaults after."""
    mock_provider.control(provider, **faults)
    try:
        with ThreadPoolExecutor(1 + len(others)) as pool:
            started = pool.submit(first)
            at_provider(mock_provider, provider)
            rest = [pool.submit(call) for call in others]
            return [started.result(timeout=60)] + [future.result(timeout=60) for future in rest]
    finally:
        defaults = Faults()
        undone = {name: getattr(defaults, name) for name in faults if name != "reset_counters"}
        mock_provider.control(provider, **undone)


def burst(ids: list, model: str, prompt: str, *, stream_every: int = 0, **extra):
    """One request of a burst of the same request ((its index, the client) → (its cache tier, the
    answer)); the request ids of those answered go to `ids`."""

    def one(index_client):
        index, client = index_client
        messages = [{"role": "user", "content": prompt}]
        if stream_every and index % stream_every == 1:
            with client.chat.completions.with_streaming_response.create(
                model=model, messages=messages, stream=True, **extra
            ) as response:
                text = "".join(chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices)
                ids.append(response.headers["x-sentinel-request-id"])
                return response.headers["x-sentinel-cache"], text
        try:
            reply = client.chat.completions.with_raw_response.create(model=model, messages=messages, **extra)
        except openai.APIStatusError as error:
            ids.append(error.response.headers["x-sentinel-request-id"])
            raise
        ids.append(reply.headers["x-sentinel-request-id"])
        return reply.headers["x-sentinel-cache"], reply.parse().choices[0].message.content

    return one


def test_identical_requests_in_flight_ask_the_provider_once(
    gateway, second_gateway, tenant, make_key, make_model, mock_provider, live_db
):
    """Eight identical requests spread over two gateway processes while the first is at a slow
    provider: one provider call, one miss, seven exact hits with the same answer (streamed ones as a
    stream), one entry stored, no lead left behind."""
    model, (provider,) = make_model()
    key = make_key(tenant)
    clients = [OpenAI(base_url=g.base_url, api_key=key, max_retries=0) for g in (gateway, second_gateway)]
    prompt = f"What is asked eight times at once? {time.time_ns()}"
    before = waits(gateway, second_gateway)
    ids: list[str] = []
    ask = burst(ids, model, prompt, stream_every=3)
    results = asked_while_the_first_is_at_the_provider(
        mock_provider,
        provider,
        lambda: ask((0, clients[0])),
        [lambda i=i: ask((i, clients[i % 2])) for i in range(1, 8)],
        slow_ms=1500,
    )
    assert mock_provider.stats(provider)["calls"] == 1
    assert results[0] == ("miss", answer_text(prompt))
    assert results[1:] == [("hit-exact", answer_text(prompt))] * 7
    after = waits(gateway, second_gateway)
    assert (after["served"] - before["served"], after["released"] - before["released"]) == (7, 0)
    assert after["timeout"] == before["timeout"]
    assert CacheEntry.objects.filter(tenant=tenant, prompt=prompt).count() == 1
    assert len(ids) == 8 and leads_held_by(ids) == []
    # ... and the counter is among the names /metrics is documented to export (a full run caught it
    # missing: test_metrics' check sees it only when a wait happened before it).
    shown = {name for name, _ in scrape_metrics(gateway.url).samples if name.startswith(COALESCED[:-6])}
    assert shown and shown <= metrics.exported_names()


def test_an_answer_that_is_not_stored_lets_the_waiting_requests_ask(
    test_database_name, tenant, make_key, make_model, mock_provider, live_db
):
    """The first request's provider call fails: the lead is let go at once, and each request that
    waited asks the provider itself (with a wait bound of ten minutes, so a lead left held would
    show as requests that never end). Then the same with an answer that is never stored (a tool
    call): nothing stored, every request answered, no lead left; and with a leader whose client
    goes away before its answer."""
    gateway = start_gateway(test_database_name, env={"SENTINEL_CACHE_COALESCE_MS": "600000"})
    try:
        model, (provider,) = make_model()
        client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0, timeout=60)
        prompt = f"Which request fails first? {time.time_ns()}"
        before = waits(gateway)
        ids: list[str] = []
        ask = burst(ids, model, prompt)

        def failing(index: int):
            with pytest.raises(openai.APIStatusError):
                ask((index, client))
            return True

        results = asked_while_the_first_is_at_the_provider(
            mock_provider,
            provider,
            lambda: failing(0),
            [lambda i=i: failing(i) for i in range(1, 4)],
            stall_ms=1000,
            error_rate=1.0,
            error_status=400,
        )
        assert results == [True] * 4
        assert mock_provider.stats(provider)["calls"] == 4
        after = waits(gateway)
        assert (after["served"] - before["served"], after["released"] - before["released"]) == (0, 3)
        assert len(ids) == 4 and leads_held_by(ids) == []

        # A tool call is answered but never stored: the waiting requests are let go the same way.
        from gateway.mock_answers import TOOL_TRIGGER

        prompt = f"{TOOL_TRIGGER} call the tool, all of you {time.time_ns()}"
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
        ids = []
        ask = burst(ids, model, prompt, tools=tools)
        results = asked_while_the_first_is_at_the_provider(
            mock_provider,
            provider,
            lambda: ask((0, client)),
            [lambda i=i: ask((i, client)) for i in range(1, 4)],
            reset_counters=True,
            slow_ms=1000,
        )
        assert [tier for tier, _ in results] == ["miss"] * 4
        assert mock_provider.stats(provider)["calls"] == 4
        assert CacheEntry.objects.filter(tenant=tenant, prompt=prompt).count() == 0
        assert waits(gateway)["released"] - after["released"] == 3
        assert len(ids) == 4 and leads_held_by(ids) == []

        # The leader's client goes away while its request is at the provider: the lead goes with it.
        # (Its client gives up at 2 s, the provider takes 5: the others are asked well before it goes.)
        prompt = f"Who leaves before the answer? {time.time_ns()}"
        impatient = OpenAI(base_url=gateway.base_url, api_key=client.api_key, max_retries=0, timeout=2.0)
        released = waits(gateway)["released"]
        ids = []
        ask = burst(ids, model, prompt)

        def leaves() -> None:
            with pytest.raises(openai.APITimeoutError):
                ask((0, impatient))

        _, *results = asked_while_the_first_is_at_the_provider(
            mock_provider,
            provider,
            leaves,
            [lambda i=i: ask((i, client)) for i in range(1, 4)],
            reset_counters=True,
            slow_ms=5000,
        )
        # Each that waited asked for itself (nothing of the first was stored to serve them).
        assert results == [("miss", answer_text(prompt))] * 3
        assert mock_provider.stats(provider)["calls"] == 4
        assert waits(gateway)["released"] - released == 3
    finally:
        gateway.stop()


def test_what_the_request_allows_decides_whether_it_leads_or_waits(
    gateway, tenant, make_key, make_model, mock_provider, live_db
):
    """A request that may not read the cache (no-cache) never waits: it asks the provider beside the
    one in flight. A request that may read but not store (no-store) takes no lead: an identical one
    after it is not made to wait for an answer that will not be stored."""
    model, (provider,) = make_model()
    client = OpenAI(base_url=gateway.base_url, api_key=make_key(tenant), max_retries=0)
    prompt = f"Who decides whether to wait? {time.time_ns()}"
    before = waits(gateway)
    mock_provider.control(provider, slow_ms=1000)
    try:
        ids: list[str] = []
        ask = burst(ids, model, prompt)

        def ask_with(headers: dict):
            reply = client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": prompt}], extra_headers=headers
            )
            ids.append(reply.headers["x-sentinel-request-id"])
            return reply.headers["x-sentinel-cache"], reply.parse().choices[0].message.content

        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(ask_with, {"x-sentinel-cache-control": "no-store"})
            at_provider(mock_provider, provider)
            # no lead was taken by the no-store request: this one leads, and is not served its answer
            second = pool.submit(ask, (0, client))
            at_provider(mock_provider, provider, 2)
            # this one may not read: it asks too, though the second holds the lead
            third = pool.submit(ask_with, {"x-sentinel-cache-control": "no-cache"})
            results = [first.result(timeout=60), second.result(timeout=60), third.result(timeout=60)]
    finally:
        mock_provider.control(provider, slow_ms=0)
    assert results == [("miss", answer_text(prompt)), ("miss", answer_text(prompt)), ("bypass", answer_text(prompt))]
    assert mock_provider.stats(provider)["calls"] == 3
    assert waits(gateway) == before
    assert len(ids) == 3 and leads_held_by(ids) == []
