"""Reading py-spy's raw stacks into cost centres: inclusive shares count a stack once however many of
its frames match, self time goes to the innermost frame's package."""

from __future__ import annotations

from bench.profile import cost_centres, package_of, parse_raw
from bench.stack import BASE_DIR

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
UVICORN = f"run (/x/{SITE}/uvicorn/server.py)"
HANDLE = f"handle ({SITE}/django/core/handlers/asgi.py)"
PATH = f"chat_completions ({BASE_DIR}/gateway/pipeline.py)"
RAW = "\n".join(
    [
        f"{UVICORN};{HANDLE};{PATH};complete ({BASE_DIR}/gateway/upstream/transport.py);"
        f"_request ({SITE}/aiohttp/client.py) 30",
        f"{UVICORN};{HANDLE};{PATH};finish ({BASE_DIR}/gateway/settlement.py);hand_off ({BASE_DIR}/billing/ledger.py);"
        f"execute_command ({SITE}/redis/asyncio/client.py) 10",
        f"{UVICORN};_run_once ({STDLIB}/asyncio/base_events.py) 60",
    ]
)


def test_packages_of_frames():
    assert package_of(f"{SITE}/django/core/handlers/asgi.py") == "django"
    assert package_of(f"{STDLIB}/asyncio/base_events.py") == "stdlib:asyncio"
    assert package_of(f"{BASE_DIR}/gateway/pipeline.py") == "sentinel:gateway"


def test_cost_centres_from_raw_stacks():
    stacks = parse_raw(RAW)
    assert [count for _, count in stacks] == [30, 10, 60]
    assert stacks[1][0][-1] == ("execute_command", f"{SITE}/redis/asyncio/client.py")

    found = cost_centres(stacks, possible=200)

    assert (found["samples"], found["gil_held_pct"]) == (100, 50.0)
    centres = found["centres_inclusive_pct"]
    assert centres["Django ASGI handler (the whole request, Sentinel's view included)"] == 40.0
    assert centres["Sentinel request path (pipeline.chat_completions)"] == 40.0
    assert centres["  upstream call (gateway.upstream.transport, fast path)"] == 30.0
    assert centres["    ledger hand-off (XADD)"] == 10.0
    assert centres["redis-py (all Redis calls)"] == 10.0
    assert centres["uvicorn HTTP protocol (httptools parsing, RequestResponseCycle)"] == 0.0
    assert found["self_by_package_pct"] == {"stdlib:asyncio": 60.0, "aiohttp": 30.0, "redis": 10.0}
    assert found["top_functions_inclusive_pct"]["chat_completions (sentinel:gateway)"] == 40.0
