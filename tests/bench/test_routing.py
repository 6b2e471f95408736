"""bench/routing.py runs on the labeled set and reports per-prompt timings."""

import json

from bench import routing


def test_the_routing_benchmark_reports_per_prompt_timings():
    result = routing.main(["--quick"])
    assert result["prompts"] >= 200
    assert result["calls"] == 5 * result["prompts"]
    assert 0 < result["p50_us"] <= result["p99_us"] <= result["max_us"]
    assert json.loads(routing.RESULTS.read_text()) == result
