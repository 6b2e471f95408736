"""The capacity model's arithmetic (bench/capacity.py): a load's readings less the stack's idle rate,
per answered request, and the parts a target rate needs. The scenario itself starts a whole stack and
runs for minutes; it is run by `make bench` (docs/capacity.md quotes it), not here."""

from __future__ import annotations

from bench.capacity import UTILISATION, per_request, plan


def reading(at: float, web: float, worker: float, valkey_cpu: float, commands: dict, xmax: int, wal: int) -> dict:
    return {
        "at": at,
        "cpu": {"web": web, "worker": worker},
        "valkey": {"commands": commands, "cpu_s": valkey_cpu},
        "postgres": {"write_transactions": xmax, "wal_bytes": wal},
    }


def test_a_load_is_charged_what_it_changed_less_the_idle_rate_per_answered_request():
    before = reading(100.0, web=10.0, worker=5.0, valkey_cpu=1.0, commands={"get": 50, "info": 3}, xmax=900, wal=0)
    after = reading(
        110.0,
        web=12.5,
        worker=5.6,
        valkey_cpu=1.5,
        commands={"get": 2_090, "evalsha": 500, "info": 9},
        xmax=1_000,
        wal=1_024_000,
    )
    # Idle: the worker polls (20 ms of CPU a second) and beat's jobs send 4 commands a second.
    idle = {"cpu.worker": 0.02, "valkey.get": 4.0, "postgres.wal_bytes": 50_000.0}
    figures = per_request(before, after, idle, answered=1_000)

    # web 2.5 s over 1,000 requests; worker (0.6 - 0.2 idle) s; Valkey reports its own CPU (not embedded here)
    assert figures["cpu_ms"] == {"web": 2.5, "worker": 0.4, "valkey": 0.5}
    # get: 2,040 - 40 idle = 2,000; evalsha 500; the scenario's own INFO calls are not traffic
    assert figures["valkey_commands"] == 2.5
    assert figures["valkey_top_commands"] == {"get": 2.0, "evalsha": 0.5}
    # PostgreSQL's idle writes are the traffic's deferred work (vacuum, rollups): not taken off
    assert figures["postgres_write_transactions"] == 0.1
    assert figures["postgres_wal_kb"] == 1.0


def test_idle_never_makes_a_figure_negative():
    before = reading(0.0, web=1.0, worker=1.0, valkey_cpu=0.0, commands={}, xmax=0, wal=0)
    after = reading(10.0, web=1.0, worker=1.1, valkey_cpu=0.0, commands={}, xmax=0, wal=0)
    figures = per_request(before, after, {"cpu.worker": 0.05}, answered=10)
    assert figures["cpu_ms"]["worker"] == 0.0


def test_the_plan_sizes_each_part_for_each_target_rate_at_the_planned_utilisation():
    row = {
        "cpu_ms": {"web": 1.2, "worker": 0.3, "postgres": 0.6, "valkey": 0.55},
        "valkey_commands": 100.0,
        "postgres_write_transactions": 0.05,
        "postgres_wal_kb": 1.5,
    }
    assert UTILISATION == 0.6
    first, second, third = plan(row)
    # 1,000 rps x 1.2 ms = 1.2 cores busy, at 60%: 2 cores; Valkey 0.55 s a second: 0.9 of a core
    assert first == {
        "rps": 1_000,
        "web_cores": 2,
        "ledger_worker_cores": 1,
        "postgres_cores": 1.0,
        "postgres_write_transactions_per_s": 50,
        "postgres_wal_mb_per_s": 1.5,
        "valkey_cores": 0.9,
        "valkey_commands_per_s": 100_000,
    }
    assert (second["web_cores"], second["valkey_cores"]) == (20, 9.2)
    assert (third["web_cores"], third["ledger_worker_cores"], third["valkey_commands_per_s"]) == (200, 50, 10_000_000)
