"""The load generator against the real mock provider: counts, first-token times read from the SSE
events, truncated streams and wrong answers caught, and a fixed arrival rate kept."""

from __future__ import annotations

import orjson
import pytest

from bench import loadgen
from gateway.mock_provider import answer_text
from tests.conftest import unique


def body_for(stream: bool):
    def body(i: int) -> dict:
        return {"model": "m", "messages": [{"role": "user", "content": f"load {i}"}], "stream": stream}

    return body


def answer_of(raw: bytes, stream: bool) -> str:
    return loadgen.stream_text(raw) if stream else orjson.loads(raw)["choices"][0]["message"]["content"]


@pytest.mark.parametrize("stream", [False, True])
def test_closed_loop_counts_every_request_and_checks_every_answer(mock_provider, stream):
    provider = unique("lg")
    mock_provider.control(provider, ttft_ms=30, tokens=5)
    url = mock_provider.api_base(provider) + "/chat/completions"

    result = loadgen.run(
        loadgen.run_load(
            url,
            body_for(stream),
            concurrency=4,
            total=20,
            validate=lambda i, raw, s: answer_of(raw, s) == answer_text(f"load {i}", 5),
        )
    )

    assert (result.requests, result.errors, result.wrong, result.truncated) == (20, 0, 0, 0)
    assert result.statuses == {200: 20}
    assert mock_provider.stats(provider)["completed"] == 20
    # libuv's timers count whole milliseconds from a clock cached at the top of each loop turn, so
    # the mock's 30 ms sleep can end up to 1 ms early.
    assert len(result.latencies) == 20 and min(result.latencies) >= 0.029
    if stream:
        # The first content token comes after the mock's 30 ms, never before (the role-only chunk is
        # not a token).
        assert len(result.ttfts) == 20 and min(result.ttfts) >= 0.029
        assert all(t <= total for t, total in zip(result.ttfts, result.latencies, strict=True))
    else:
        assert result.ttfts == []


def test_wrong_answers_are_errors_not_successes(mock_provider):
    url = mock_provider.api_base(unique("lg")) + "/chat/completions"

    result = loadgen.run(
        loadgen.run_load(url, body_for(True), concurrency=2, total=6, validate=lambda i, raw, s: i % 2 == 0)
    )

    assert (result.requests, result.wrong, result.errors) == (6, 3, 3)
    assert len(result.latencies) == 3 and result.summary()["ok"] == 3


def test_a_stream_cut_before_done_counts_as_truncated(mock_provider):
    provider = unique("lg")
    mock_provider.control(provider, drop_after=3)
    url = mock_provider.api_base(provider) + "/chat/completions"

    result = loadgen.run(loadgen.run_load(url, body_for(True), concurrency=2, total=4))

    assert (result.requests, result.truncated, result.errors) == (4, 4, 4)
    assert result.latencies == [] and result.rps == 0


def test_error_statuses_are_counted_by_status(mock_provider):
    provider = unique("lg")
    mock_provider.control(provider, error_rate=0.5, error_status=503)
    url = mock_provider.api_base(provider) + "/chat/completions"

    result = loadgen.run(loadgen.run_load(url, body_for(False), concurrency=1, total=10))

    assert result.statuses == {200: 5, 503: 5}
    assert (result.errors, len(result.latencies)) == (5, 5)


def test_duration_bounds_a_closed_loop_run(mock_provider):
    provider = unique("lg")
    mock_provider.control(provider, ttft_ms=50)
    url = mock_provider.api_base(provider) + "/chat/completions"

    result = loadgen.run(loadgen.run_load(url, body_for(False), concurrency=2, duration=0.5))

    # Two workers, 50 ms a request, half a second: about 20 requests, never more than 2 per 50 ms.
    assert 8 <= result.requests <= 22 and result.errors == 0
    assert 0.5 <= result.wall < 1.5


def test_open_loop_keeps_the_rate_and_sheds_over_the_in_flight_cap(mock_provider):
    provider = unique("lg")
    url = mock_provider.api_base(provider) + "/chat/completions"

    steady = loadgen.run(loadgen.run_rate(url, body_for(False), rate=40, duration=1.0))
    assert (steady.requests, steady.errors, steady.shed) == (40, 0, 0)

    mock_provider.control(provider, stall_ms=1000)
    capped = loadgen.run(loadgen.run_rate(url, body_for(False), rate=40, duration=0.375, max_in_flight=5))
    # 15 arrivals within 350 ms, none answered before a second: only the first 5 fit under the cap.
    assert (capped.requests, capped.shed, capped.errors) == (5, 10, 0)


def test_alternating_sends_one_request_to_each_target_in_turn_starting_one_further_each_round(mock_provider):
    providers = [unique("alt") for _ in range(3)]
    urls = [mock_provider.api_base(p) + "/chat/completions" for p in providers]
    sent: list[tuple[int, int]] = []

    def body(n: int):
        def make(i: int) -> dict:
            sent.append((i, n))
            return {"model": "m", "messages": [{"role": "user", "content": f"alt {n} {i}"}]}

        return make

    results = loadgen.run(
        loadgen.run_alternating([loadgen.Target(url, body(n)) for n, url in enumerate(urls)], total=4)
    )

    assert [(r.requests, r.errors, len(r.latencies)) for r in results] == [(4, 0, 4)] * 3
    assert [mock_provider.stats(p)["completed"] for p in providers] == [4, 4, 4]
    # Round i starts at target i mod 3: each target follows each other one as often.
    assert [n for _, n in sent] == [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]
    assert [i for i, _ in sent] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
