"""The runner: scenarios come from the registry, a scenario not written yet is said to be so (not a
crash), and `--list` shows what one run would do."""

from __future__ import annotations

from bench.__main__ import BY_NAME, REGISTRY, Scenario, main, run_one


def test_a_scenario_whose_module_is_missing_is_not_available_yet(capsys):
    outcome = run_one(Scenario("later", "bench.no_such_scenario", "written later"), [])

    assert outcome == "not available yet"
    assert capsys.readouterr().out == "later: not available yet (no module bench.no_such_scenario)\n"


def test_list_names_every_registered_scenario_with_its_state(capsys):
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()

    assert [line.split()[0] for line in lines] == [s.name for s in REGISTRY]
    assert "overhead     available " in lines[0]
    assert {"overhead", "soak", "ledger", "relay_mix", "failover", "admission", "cache_scale", "durability"} <= set(
        BY_NAME
    )
    assert [s.name for s in REGISTRY if not s.in_all] == ["profile"]


def test_unknown_scenario_is_refused(capsys):
    assert main(["no-such"]) == 2
    assert "Unknown scenario 'no-such'; choose from: overhead," in capsys.readouterr().err


def test_a_scenario_gets_its_own_arguments(capsys):
    assert main(["overhead", "--definitely-not-an-option"]) == 1
    assert "unrecognized arguments: --definitely-not-an-option" in capsys.readouterr().err
