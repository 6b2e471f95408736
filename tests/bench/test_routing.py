"""bench/routing.py runs on the labeled set and reports per-prompt timings."""

import orjson

from bench import routing


def test_the_routing_benchmark_reports_per_prompt_timings(capsys, tmp_path):
    assert routing.main(["--quick", "--out", str(tmp_path)]) == 0
    saved = orjson.loads((tmp_path / "routing.json").read_bytes())
    result = saved["results"]
    assert (saved["scenario"], saved["quick"]) == ("routing", True)
    assert result["prompts"] >= 200
    assert result["calls"] == 5 * result["prompts"]
    assert 0 < result["p50_us"] <= result["p99_us"] <= result["max_us"]
    assert "classify() per prompt" in capsys.readouterr().out
