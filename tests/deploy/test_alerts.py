"""The Prometheus alert rules in deploy/prometheus: every expression parses (promql-parser, and
promtool where it is installed: CI installs it), uses only metrics the gateway exports, and each
alert fires on the series it is meant for (promtool's rule unit tests, alerts.test.yml)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import promql_parser
import pytest
import yaml

from gateway.metrics import exported_names

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
PROMTOOL = shutil.which("promtool")


def rules(path: Path) -> list[dict]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    names = set()

    def visit(node) -> bool:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def problems(path: Path) -> list[str]:
    """What is wrong with a rule file: expressions that do not parse, metrics nobody exports."""
    found = []
    exported = exported_names()
    for rule in rules(path):
        name = rule.get("alert") or rule.get("record")
        try:
            used = metric_names(rule["expr"])
        except ValueError as exc:
            found.append(f"{name}: {exc}")
            continue
        found += [f"{name}: {metric} is not a metric Sentinel exports" for metric in sorted(used - exported)]
    return found


def test_every_expression_parses_and_uses_only_exported_metrics():
    assert problems(ALERTS) == []
    used = set().union(*(metric_names(rule["expr"]) for rule in rules(ALERTS)))
    assert "sentinel_time_to_first_token_seconds_bucket" in used
    assert "sentinel_breaker_state" in used


def test_the_sla_alerts_are_there():
    by_name = {rule["alert"]: rule for rule in rules(ALERTS)}
    assert by_name["SentinelTimeToFirstTokenSlow"]["for"] == "2m"
    assert by_name["SentinelLatencySlow"]["for"] == "2m"
    assert "histogram_quantile(0.99" in by_name["SentinelTimeToFirstTokenSlow"]["expr"]
    assert "histogram_quantile(0.99" in by_name["SentinelLatencySlow"]["expr"]
    assert 'status=~"5.."' in by_name["SentinelErrorRateHigh"]["expr"]
    assert "sentinel_breaker_state" in by_name["SentinelBreakerOpen"]["expr"]


def test_the_ledger_alerts_are_there():
    """A dead letter warns at once; a ledger queue whose oldest record keeps ageing (the drain fails or
    does not run) pages."""
    by_name = {rule["alert"]: rule for rule in rules(ALERTS)}
    dead_letters = by_name["SentinelLedgerDeadLetters"]
    assert "increase(sentinel_ledger_dead_letters_total[15m])" in dead_letters["expr"]
    assert "for" not in dead_letters
    assert by_name["SentinelLedgerStalled"]["expr"] == "max(sentinel_ledger_oldest_record_age_seconds) > 120"
    assert by_name["SentinelLedgerStalled"]["labels"]["severity"] == "page"


BROKEN = {
    "a broken expression": "sum(rate(sentinel_requests_total[5m])",
    "an unknown metric": "sum(rate(sentinel_requests_totl[5m])) > 1",
}


@pytest.mark.parametrize("expr", BROKEN.values(), ids=BROKEN.keys())
def test_a_bad_rule_is_caught(tmp_path, expr):
    path = tmp_path / "alerts.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"alert": "Bad", "expr": expr}]}]}))
    assert len(problems(path)) == 1


needs_promtool = pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("SENTINEL_REQUIRE_PROMTOOL"),
    reason="promtool is not installed (Debian's `prometheus` package has it; .ci/run installs it)",
)


def promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess:
    assert PROMTOOL, "promtool is required here (SENTINEL_REQUIRE_PROMTOOL) but not installed"
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_rules_and_the_prometheus_config():
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


@needs_promtool
def test_promtool_unit_tests_fire_each_alert_when_it_should():
    result = promtool("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    tested = {
        line.split(":", 1)[1].strip()
        for line in (PROMETHEUS_DIR / "alerts.test.yml").read_text().splitlines()
        if line.strip().startswith("alertname:")
    }
    assert tested == {rule["alert"] for rule in rules(ALERTS)}


@needs_promtool
def test_promtool_refuses_a_broken_expression(tmp_path):
    path = tmp_path / "alerts.yml"
    rule = {"alert": "Bad", "expr": BROKEN["a broken expression"]}
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
    result = promtool("check", "rules", str(path), cwd=tmp_path)
    assert result.returncode != 0
    assert "unclosed left parenthesis" in result.stdout + result.stderr
