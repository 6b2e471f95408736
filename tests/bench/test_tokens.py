"""bench/tokens.py times prompt bounds without servers, and reports bounds that make sense."""

import orjson

from bench import tokens


def test_the_tokens_benchmark_reports_every_case(tmp_path, capsys):
    assert tokens.main(["--quick", "--out", str(tmp_path)]) == 0
    saved = orjson.loads((tmp_path / "tokens.json").read_bytes())
    assert (saved["scenario"], saved["quick"], saved["rounds"]) == ("tokens", True, 50)
    cases = saved["cases"]
    scripts = {f"{script} 3,000" for script in ("cjk", "arabic", "emoji", "code", "english")}
    assert set(cases) == {"short chat", "tools (6)", *scripts}
    for case in cases.values():
        assert 0 < case["bound_exact"] <= case["bound_bytes"]  # the cheap bound is never the lower one
        assert 0 < case["exact_p50_us"] <= case["exact_p99_us"]
    assert "Prompt bound per request" in capsys.readouterr().out
