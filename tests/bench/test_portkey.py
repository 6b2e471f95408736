"""The second peer's harness (bench/portkey.py): what it sends and when it stands aside. The install
itself (npm, the registry) is exercised by `python -m bench overhead`, not here."""

from __future__ import annotations

import pytest

from bench import portkey
from bench.overhead import LABELS, Load, takes_part


def test_requests_name_the_provider_and_the_mock_as_its_host():
    assert portkey.headers("http://127.0.0.1:9") == {
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": "http://127.0.0.1:9/p/bench/v1",
        "authorization": "Bearer sk-mock-peer",
    }


def test_without_node_the_peer_stands_aside_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no node, no npm
    with pytest.raises(portkey.PeerUnavailable, match="node and npm are needed"):
        portkey.ensure_installed(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half-installed
    assert portkey.version(tmp_path) == ""


def test_portkey_is_measured_on_non_streamed_single_turn_loads_only():
    plain = Load("c32-nonstream", "c=32 non-stream", "zero", False, 32, None, 10, 0)
    streamed = Load("c32-stream", "c=32 stream", "zero", True, 32, None, 10, 0)
    turns = Load("c32-multiturn", "c=32 multi-turn", "zero", False, 32, None, 10, 0, turns=True)
    assert [takes_part(load, "portkey") for load in (plain, streamed, turns)] == [True, False, False]
    assert [takes_part(load, "sentinel") for load in (plain, streamed, turns)] == [True, True, True]
    assert [takes_part(load, "sentinel-bypass") for load in (plain, streamed, turns)] == [True, True, True]
    assert LABELS["portkey"] == "Portkey gateway"
