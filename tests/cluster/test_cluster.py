"""Sentinel on a real Valkey Cluster (three primaries, three replicas; tests/valkey_cluster.py), with
REDIS_URL naming it (redis+cluster://): keys shard by tenant, admission stays exact across processes,
breakers, the cache's Redis tier, the ledger stream and the Channels layer work there, and a primary
that dies loses nothing its replica had (docs/cluster.md)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import redis

from sentinel import redis_keys
from tenants.periods import period_bounds
from tests.valkey_cluster import FAST_FAILOVER_MS, ValkeyCluster, start_cluster

pytestmark = pytest.mark.cluster

BASE_DIR = Path(__file__).resolve().parents[2]


def wait_for_condition(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def slot_of(client, key: str) -> int:
    return int(client.cluster("keyslot", key))


def test_tenants_keys_share_their_tenants_slot_and_tenants_spread_over_every_primary(valkey_cluster):
    """Everything one tenant's admission step touches is in one slot (so one script may take it all);
    different tenants land on different primaries (so load shards), and so do deployments."""
    from datetime import date

    client = valkey_cluster.nodes[0].client()
    tag = redis_keys.tenant_tag(7)
    own = [
        redis_keys.rate_log("key:70", "rpm", tag=tag),
        redis_keys.rate_log("team:71", "concurrency", tag=tag),
        redis_keys.rate_log("tenant:7", "tpm", tag=tag) + ":sum",
        redis_keys.budget_period(3, date(2026, 12, 1), tenant_id=7) + ":res",
        redis_keys.audience_period(4, "someone", "daily", date(2026, 12, 5), "usd", tenant_id=7) + ":spent",
        redis_keys.blocked_key("abc", tenant_id=7),
        redis_keys.blocked_tenant(7),
        redis_keys.void("step", tag=tag),
        redis_keys.batch_pace(7),
    ]
    assert len({slot_of(client, key) for key in own}) == 1
    assert {slot_of(client, key) for key in (redis_keys.breaker(5), redis_keys.deployment_slots(5))} == {
        slot_of(client, redis_keys.deployment_load(5))
    }
    primaries = {valkey_cluster.node_for(redis_keys.blocked_tenant(t)).port for t in range(1, 31)}
    assert len(primaries) == 3
    deployments = {valkey_cluster.node_for(redis_keys.breaker(d)).port for d in range(1, 31)}
    assert len(deployments) == 3


def test_four_processes_of_500_concurrent_requests_admit_exactly_100(valkey_cluster):
    """Four OS processes each send 500 admissions at once against a deployment with 100 concurrency
    slots; the tenant allows 150 a minute and the model 120 (both in other slots than the
    deployment's). Exactly 100 are admitted; every other is refused; and what the refused took in
    the tenant's and the model's logs was given back: each holds exactly the 100 admitted."""
    spec = {
        "tenant_id": 9001,
        "key_id": 90010,
        "deployment_id": 9002,
        "provider_id": 9003,
        "model": "cluster-model",
        "tenant_rpm": 150,
        "model_rpm": 120,
        "max_concurrent": 100,
        "requests": 500,
    }
    env = {
        **os.environ,
        "REDIS_URL": valkey_cluster.url,
        "SENTINEL_BROKER_URL": "redis://127.0.0.1:9/0",  # never used here
        "DJANGO_SETTINGS_MODULE": "sentinel.settings",
        # Two cores serve 2000 requests and six Valkeys: a slow answer is waited for, not taken for
        # an outage (which would refuse with 503, failing the count).
        "SENTINEL_REDIS_TIMEOUT_MS": "20000",
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.admit_worker", json.dumps({**spec, "name": f"w{n}"})],
            cwd=BASE_DIR,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    try:
        for worker in workers:
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:  # all four start at once
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outcomes: Counter = Counter()
        logged: list[str] = []
        seconds: list[float] = []  # each worker's admissions took
        for worker in workers:
            # The worker's log lines (JSON, on stdout like every Sentinel process's) come before its
            # outcomes, the last line.
            output, _ = worker.communicate(timeout=60)
            assert worker.returncode == 0
            *logs, last = output.splitlines()
            logged += logs
            ended = json.loads(last)
            seconds.append(ended.pop("seconds"))
            outcomes.update(ended)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    diagnosis = (outcomes, seconds, logged, valkey_cluster.warnings())
    assert outcomes.pop("given back later") == 0, diagnosis
    assert outcomes["admitted"] == 100, diagnosis
    assert sum(outcomes.values()) == 2000, diagnosis
    assert set(outcomes) <= {"admitted", "429:rate_limit_exceeded", "503:overloaded"}, diagnosis
    cluster = redis.RedisCluster.from_url(valkey_cluster.url.replace("redis+cluster", "redis"))
    tenant_log = redis_keys.rate_log("tenant:9001", "rpm", tag=redis_keys.tenant_tag(9001))
    model_log = redis_keys.rate_log("model:cluster-model", "rpm", tag=redis_keys.model_tag("cluster-model"))
    held = {
        "tenant": set(cluster.zrange(tenant_log, 0, -1)),
        "model": set(cluster.zrange(model_log, 0, -1)),
        "deployment": set(cluster.zrange(redis_keys.deployment_slots(9002), 0, -1)),
    }
    counts = {name: len(members) for name, members in held.items()}
    assert counts == {"tenant": 100, "model": 100, "deployment": 100}, (counts, *diagnosis)
    # ... and they are one set of requests: the same 100 hold a place in each.
    assert held["tenant"] == held["deployment"] == held["model"], (counts, *diagnosis)


# --- in this process, on the cluster ------------------------------------------------------------


def key_info(tenant_id: int, **fields):
    from gateway.auth import KeyInfo

    return KeyInfo(
        key_id=tenant_id * 10,
        digest=f"digest-{tenant_id}",
        key_name="k",
        tenant_id=tenant_id,
        tenant_slug="t",
        key_active=True,
        tenant_active=True,
        expires_at=None,
        allowed_models=None,
        fail_open=False,
        **fields,
    )


def target(deployment_id: int, **fields):
    """A deployment of its own provider, never retried (tests.gateway.upstream.targets otherwise)."""
    from tests.gateway.upstream.targets import target as plain_target

    return plain_target(
        deployment_id=deployment_id,
        deployment=f"d{deployment_id}",
        provider_id=deployment_id,
        max_retries=0,
        **fields,
    )


async def admit(key, deployments, request_id: str, model: str = "m", model_limits=None):
    from gateway.limits import admission

    return await admission.admit(
        key=key,
        model=model,
        model_limits=model_limits or {},
        deployments=deployments,
        request_id=request_id,
        tokens=10,
        worst_cost=Decimal("0.001"),
        lease_seconds=60,
    )


def cluster_client(cluster) -> redis.RedisCluster:
    return redis.RedisCluster.from_url(cluster.url.replace("redis+cluster", "redis"))


def test_a_breaker_opens_and_closes_on_the_cluster(on_cluster, live_db):
    """Two failures open the breaker (settle.lua in the deployment's slot), admission then reads it
    open (claim.lua), its open time over a probe is granted (probe.lua) and its success closes it."""
    from gateway.limits import admission
    from gateway.upstream import breakers
    from gateway.upstream.breakers import Attempt, Policy

    # Open for 3 s: the steps between its opening and the second admission must fit inside (0.5 s did
    # not once, on a loaded CI host, and the breaker was already half-open).
    policy = Policy(minimum_calls=2, failure_rate_percent=50, open_seconds=3, max_open_seconds=6, half_open_probes=1)
    deployment = target(9201, policy=policy)
    key = key_info(9200)
    state_key = breakers.keys_for(9201)[0]
    client = cluster_client(on_cluster)

    async def scenario() -> list:
        seen = []
        first = await admit(key, [deployment], "b-1")
        seen.append(first.breaker_states[9201])
        await admission.settle(
            first,
            attempts=[Attempt(deployment, "fail", False), Attempt(deployment, "fail", False)],
            tokens_used=0,
            cost=Decimal(0),
            ledger_record=b'{"probe": "b-1"}',
        )
        seen.append(client.hget(state_key, "state"))
        second = await admit(key, [deployment], "b-2")
        seen.append(second.breaker_states[9201])
        seen.append(await breakers.permit(deployment, second.breaker_states[9201], local=False))
        await asyncio.sleep(3.1)  # the open time is over
        third = await admit(key, [deployment], "b-3")
        seen.append(third.breaker_states[9201])
        allowed, probe = await breakers.permit(deployment, third.breaker_states[9201], local=False)
        seen.append((allowed, probe))
        await admission.settle(
            third,
            attempts=[Attempt(deployment, "ok", probe)],
            tokens_used=0,
            cost=Decimal(0),
            ledger_record=b'{"probe": "b-3"}',
        )
        seen.append(client.hget(state_key, "state"))
        await asyncio.sleep(0.2)  # the transitions' audit tasks (no such deployment row: nothing written)
        return seen

    assert asyncio.run(scenario()) == ["closed", b"open", "open", (False, False), "probe", (True, True), b"closed"]


def test_the_cache_s_redis_tier_serves_a_hit_from_the_cluster(on_cluster, tenant):
    """An answer stored goes to the cluster (exact key and partition counts under the partition's
    tag: one MGET reads them); with this process's memory cleared, the lookup is served from it."""
    from gateway.cache import engine
    from gateway.cache.keys import CacheKey

    key = CacheKey(partition=f"part-{tenant.pk}", exact=f"exact-{tenant.pk}", prompt="what is two plus two")
    answer = {"choices": [{"message": {"content": "four"}}]}
    client = cluster_client(on_cluster)

    async def scenario():
        before = await engine.lookup(key, tenant_id=tenant.pk, semantic=False, threshold=None)
        await engine.store(
            key,
            tenant_id=tenant.pk,
            model="m",
            answer=answer,
            cost_usd=Decimal("0.01"),
            ttl=600,
            max_entries=100,
            semantic=True,
        )
        engine._exact_local._data.clear()  # only Redis can serve it now
        hit, partition, _ = await engine._exact(key, count_partition=True)
        await engine.close_pool()
        return before, hit, partition

    before, hit, partition = asyncio.run(scenario())
    assert before.hit is None
    assert hit is not None and hit.tier == "hit-exact" and hit.answer == answer
    assert (partition.entries, partition.misses) == (1, 1)
    assert client.exists(engine.exact_redis_key(key.exact, key.partition)) == 1


def test_the_ledger_stream_on_the_cluster_is_written_and_drained_into_postgres(on_cluster, tenant):
    from billing import ledger
    from billing.models import LedgerEntry
    from tests.billing.conftest import record

    records = [record(tenant, request_id=f"cluster-ledger-{i}") for i in range(3)]

    async def hand_off() -> None:
        for one in records:
            await ledger.hand_off(one)

    asyncio.run(hand_off())
    assert cluster_client(on_cluster).xlen(ledger.STREAM) >= 3
    while ledger.drain():
        pass
    rows = LedgerEntry.objects.filter(tenant=tenant, request_id__startswith="cluster-ledger-")
    assert sorted(rows.values_list("request_id", flat=True)) == [f"cluster-ledger-{i}" for i in range(3)]
    assert ledger.pending_count() == 0


def test_the_channels_layer_on_the_cluster_delivers_a_group_message_published_on_another_node(on_cluster):
    """The pub/sub layer: a consumer subscribed through one node receives what was sent through
    another (a cluster forwards every PUBLISH to every node), and a group it left is not delivered."""
    from channels_redis.pubsub import RedisPubSubChannelLayer

    first, second = (node for node in on_cluster.nodes[:2])
    layers = [
        RedisPubSubChannelLayer(hosts=[f"redis://127.0.0.1:{node.port}"], prefix="sentinel:channels")
        for node in (first, second)
    ]

    async def scenario():
        receiver, sender = layers
        channel = await receiver.new_channel()
        await receiver.group_add("circuits", channel)
        await asyncio.sleep(0.2)  # the subscription is in place
        await sender.group_send("circuits", {"type": "circuit.transition", "to": "open"})
        got = await asyncio.wait_for(receiver.receive(channel), 5)
        await receiver.group_discard("circuits", channel)
        await asyncio.sleep(0.2)
        await sender.group_send("circuits", {"type": "circuit.transition", "to": "closed"})
        try:
            late = await asyncio.wait_for(receiver.receive(channel), 1)
        except TimeoutError:
            late = None
        for layer in layers:
            await layer.flush()
        return got, late

    got, late = asyncio.run(scenario())
    assert got == {"type": "circuit.transition", "to": "open"}
    assert late is None


def test_block_markers_refuse_on_the_cluster_in_admission_and_outside_it(on_cluster):
    """The markers carry the tenant's tag: admission checks them in the tenant's step (nothing
    taken), and the check for requests that never reach admission reads them beside the generation
    (another slot) without CROSSSLOT."""
    from gateway.auth import ensure_not_blocked
    from gateway.errors import GatewayError
    from sentinel.localstate import blocked_key_marker, blocked_tenant_marker

    key = key_info(9400, tenant_limits=(("rpm", 5),))
    client = cluster_client(on_cluster)
    log = redis_keys.rate_log("tenant:9400", "rpm", tag=redis_keys.tenant_tag(9400))

    async def outcome(request_id: str) -> tuple[object, object]:
        results = []
        for check in (admit(key, [target(9401)], request_id), ensure_not_blocked(key)):
            try:
                await check
                results.append("ok")
            except GatewayError as error:
                results.append(error.status)
        return tuple(results)

    assert asyncio.run(outcome("blk-1")) == ("ok", "ok")
    client.set(blocked_tenant_marker(9400), 1)
    assert asyncio.run(outcome("blk-2")) == (403, 403)
    client.delete(blocked_tenant_marker(9400))
    client.set(blocked_key_marker(key.digest, 9400), 1)
    assert asyncio.run(outcome("blk-3")) == (401, 401)
    assert client.zrange(log, 0, -1) == [b"blk-1"]  # the refused took nothing


def test_django_s_cache_on_the_cluster_reads_and_writes_keys_of_many_slots(on_cluster):
    """Django's cache (django-ratelimit's counters) through the cluster client: many keys at once
    are sent key by key, as a cluster refuses MGET and MSET across slots."""
    from django.core.cache import caches

    cache = caches["default"]
    names = [f"cluster-cache-{i}" for i in range(20)]
    node = on_cluster.nodes[0].client()
    slots = {slot_of(node, cache.make_and_validate_key(name)) for name in names}
    assert len(slots) > 1  # the test means something: the keys are in several slots
    cache.set_many({name: i for i, name in enumerate(names)}, 60)
    assert cache.get_many(names) == {name: i for i, name in enumerate(names)}
    assert cache.incr(names[3]) == 4
    cache.delete_many(names[:10])
    assert cache.get_many(names) == {name: i for i, name in enumerate(names) if i >= 10}


def moved_replies(cluster: ValkeyCluster) -> int:
    """MOVED redirections the cluster's nodes have answered, all told (INFO errorstats)."""
    return sum(node.client().info("errorstats").get("errorstat_MOVED", {}).get("count", 0) for node in cluster.nodes)


def test_a_first_burst_and_one_after_the_map_is_dropped_go_straight_to_each_key_s_node(on_cluster):
    """redis-py routes a command before it learns the slots: unfixed, a process's first burst (and any
    after its map is dropped) went to random nodes, each MOVED, and every fifth MOVED dropped the map
    and closed every connection, those in use included, so a burst of admissions could keep it up
    past the client's retries (a 503 in CI). Here 300 commands on 30 keys of every primary are sent
    at once by a new client, then again once it has dropped its map: every answer is right and no
    node answers MOVED."""
    from sentinel.redis_clients import async_redis

    keys = [f"{{t{tenant}}}:burst" for tenant in range(30)]
    assert len({on_cluster.node_for(key).port for key in keys}) == 3  # the keys are on every primary
    cluster_client(on_cluster).mset_nonatomic({key: key for key in keys})
    moved = moved_replies(on_cluster)

    async def burst() -> list:
        client = async_redis()
        first = await asyncio.gather(*(client.get(keys[i % 30]) for i in range(300)))
        await client.aclose()  # the map dropped (as a ClusterDownError does)
        again = await asyncio.gather(*(client.get(keys[i % 30]) for i in range(300)))
        return first + again

    answers = asyncio.run(burst())
    assert answers == [keys[i % 30].encode() for i in range(300)] * 2
    assert moved_replies(on_cluster) == moved


def test_a_node_s_idle_connections_are_not_closed_under_a_command_that_takes_one(on_cluster):
    """After a connection error redis-py drops a node's idle connections: unfixed, it scheduled their
    closing and left them free meanwhile, so a command that took one had it closed under it
    ("Connection closed by server"). Now they are marked, and the command that takes one reconnects
    it before it sends."""
    from sentinel.redis_clients import async_redis

    key = "{t77}:idle"
    cluster_client(on_cluster).set(key, "here")

    async def scenario() -> tuple:
        client = async_redis()
        assert await client.get(key) == b"here"  # one connection to the key's node, now idle
        node = client.get_node_from_key(key)
        (idle,) = node._free
        closing = asyncio.create_task(node.disconnect_free_connections())
        await asyncio.sleep(0)  # it has run up to its await: any closing it schedules has not run
        answer = await node.execute_command("GET", key)  # the node itself: no retry to hide a failure
        await closing
        return answer, list(node._connections), idle.is_connected

    answer, connections, connected = asyncio.run(scenario())
    assert answer == b"here"
    assert len(connections) == 1 and connected  # the one connection, reconnected before the GET


def test_a_tenant_step_sent_twice_takes_nothing_twice_and_a_voided_one_takes_nothing(on_cluster):
    """The cluster client resends a command whose connection failed: a step that ran but whose
    answer was lost runs again. The tenant's step answers as before and takes nothing twice (with a
    limit of 1, a second take would have refused it); once voided, sent again, it takes nothing."""
    from gateway.lua import scripts

    tag = redis_keys.tenant_tag(9500)
    log = redis_keys.rate_log("tenant:9500", "rpm", tag=tag)
    marker = redis_keys.void("step-1", tag=tag)
    keys = [marker, redis_keys.blocked_key("d", tenant_id=9500), redis_keys.blocked_tenant(9500), log]

    def step(rid: str, marker_key: str = marker) -> list:
        args = [rid, 10, 0, 60_000, 1, "r", 1, 60_000, 0, 0, "*"]
        return asyncio.run(scripts.admission(keys=[marker_key, *keys[1:]], args=args))

    client = cluster_client(on_cluster)
    assert step("r-1")[0] == b"ok"
    assert step("r-1")[0] == b"ok"  # the same step again: its marker says it took its holds
    assert client.zrange(log, 0, -1) == [b"r-1"]
    assert step("r-2", redis_keys.void("step-2", tag=tag))[0] == b"limit"  # the limit of 1 is taken
    void_args = ["r-1", 10, 0, 60, 1, "r", 0]
    asyncio.run(scripts.void(keys=[marker, log], args=void_args))
    assert client.zcard(log) == 0
    assert step("r-1")[0] == b"void"  # sent again after it was voided: nothing taken
    assert client.zcard(log) == 0


def test_budgets_start_from_the_ledger_and_model_slots_are_freed_across_slots(on_cluster, tenant):
    """A tenant budget whose period has no counter starts from the ledger (the tenant's step answers
    init, the caller reads Postgres and asks again); a model's concurrency limit of 1 (the model's
    slot) holds one request until it settles, which frees it and turns the reservation into spend."""
    from gateway.errors import GatewayError
    from gateway.limits import admission

    # Worst case $0.001 a request, a hard budget of $0.0025: two fit, a third does not.
    key = key_info(tenant.pk, budgets=((9601, None, "daily", "0.0025", None, True, None),))
    deployment = target(9602)

    async def scenario() -> list:
        seen: list = []
        first = await admit(key, [deployment], "bud-1", model="mc", model_limits={"concurrency": 1})
        try:
            await admit(key, [deployment], "bud-2", model="mc", model_limits={"concurrency": 1})
        except GatewayError as error:
            seen.append(error.status)  # the model's one slot is held
        await admission.settle(first, attempts=[], tokens_used=5, cost=Decimal("0.0004"), ledger_record=b"{}")
        second = await admit(key, [deployment], "bud-3", model="mc", model_limits={"concurrency": 1})
        await admission.settle(second, attempts=[], tokens_used=5, cost=Decimal("0.0004"), ledger_record=b"{}")
        third = await admit(key, [deployment], "bud-4", model="mc", model_limits={"concurrency": 1})
        try:
            await admit(key, [deployment], "bud-5", model="other")  # $0.0008 spent + $0.001 held
        except GatewayError as error:
            seen.append(error.status)
        seen.append(third.request_id)
        return seen

    assert asyncio.run(scenario()) == [429, 402, "bud-4"]
    client = cluster_client(on_cluster)
    start, _ = period_bounds("daily", datetime.now(UTC))
    base = redis_keys.budget_period(9601, start, tenant_id=tenant.pk)
    assert int(client.get(base + ":spent")) == admission.to_units(Decimal("0.0008"))
    assert client.zrange(base + ":res", 0, -1) == [b"bud-4|" + str(admission.to_units(Decimal("0.001"))).encode()]
    model_slots = redis_keys.rate_log("model:mc", "concurrency", tag=redis_keys.model_tag("mc"))
    assert client.zrange(model_slots, 0, -1) == [b"bud-4"]


def test_a_teams_limits_and_budgets_are_taken_in_its_tenants_step(on_cluster, tenant):
    """A team's rate log and budget carry the tenant's tag, so the tenant's one step checks and takes
    them with the tenant's own: a team limit of 2 requests admits two, a team budget refuses the
    request that could pass it, and a refusal takes nothing."""
    from gateway.errors import GatewayError

    limited = key_info(tenant.pk, team_id=9711, team_name="search", team_limits=(("rpm", 2),))
    budgeted = key_info(
        tenant.pk,
        team_id=9712,
        team_name="support",
        budgets=((9713, None, "daily", "0.0015", None, True, 9712),),  # worst case $0.001: one fits
    )
    deployment = target(9714)

    async def scenario() -> list:
        seen: list = []
        for key, rid in ((limited, "a-1"), (limited, "a-2"), (limited, "a-3"), (budgeted, "b-1"), (budgeted, "b-2")):
            try:
                seen.append((await admit(key, [deployment], rid)).request_id)
            except GatewayError as error:
                seen.append((error.status, error.headers.get("x-sentinel-limit") or error.message[:32]))
        return seen

    assert asyncio.run(scenario()) == [
        "a-1",
        "a-2",
        (429, "Rate limit reached: team-rpm all"),
        "b-1",
        (402, "team-daily-budget"),
    ]
    client = cluster_client(on_cluster)
    tag = redis_keys.tenant_tag(tenant.pk)
    team_log = redis_keys.rate_log("team:9711", "rpm", tag=tag)
    assert client.zrange(team_log, 0, -1) == [b"a-1", b"a-2"]  # the refused one took no place in it
    start, _ = period_bounds("daily", datetime.now(UTC))
    base = redis_keys.budget_period(9713, start, tenant_id=tenant.pk)
    assert client.zrange(base + ":res", 0, -1) == [b"b-1|" + str(admission_units("0.001")).encode()]
    assert client.keyslot(team_log) == client.keyslot(base + ":res") == client.keyslot(tag)


def admission_units(amount: str) -> int:
    from gateway.limits.admission import to_units

    return to_units(Decimal(amount))


# --- a primary dies ----------------------------------------------------------------------------


@pytest.fixture
def own_cluster() -> Iterator[ValkeyCluster]:
    """A cluster of the test's own: it loses a node. The process's configuration generation is the
    new cluster's (none) meanwhile, as a fresh process's would be (see on_cluster)."""
    from sentinel.localstate import current_generation, observe_generation

    before = current_generation() or None
    cluster = start_cluster(node_timeout_ms=FAST_FAILOVER_MS)
    observe_generation(None)
    try:
        yield cluster
    finally:
        cluster.stop()
        observe_generation(before)


def caught_up(cluster: ValkeyCluster, primary) -> bool:
    """Whether the primary's replica has everything the primary wrote (Valkey replicates
    asynchronously: what a primary acknowledged but had not sent yet dies with it)."""
    replica = cluster.replica_of(primary)
    return (
        replica.client().info("replication")["slave_repl_offset"]
        == primary.client().info("replication")["master_repl_offset"]
    )


def test_a_primary_killed_its_replica_takes_over_and_no_admission_or_ledger_record_is_lost(own_cluster, tenant):
    """A tenant whose slot shares a primary with the ledger stream: 30 admissions (of 50 a minute)
    and 10 settled requests' records; once the replica has them the primary is killed (SIGKILL), the
    replica is promoted on its own (cluster-node-timeout 1 s). Then the tenant's log still holds the
    30, so of 30 more exactly 20 are admitted, and the 10 records reach Postgres."""
    from django.test import override_settings

    from billing import ledger
    from billing.models import LedgerEntry
    from gateway.errors import GatewayError
    from gateway.limits import admission
    from sentinel.redis_clients import reset_clients
    from tests.billing.conftest import record

    ledger_node = own_cluster.node_for(ledger.STREAM)
    # Tenant ids are the database's: the test keys its counters by an id whose slot is the stream's node.
    tenant_id = next(
        t for t in range(100_000, 200_000) if own_cluster.node_for(redis_keys.blocked_tenant(t)) is ledger_node
    )
    key = key_info(tenant_id, tenant_limits=(("rpm", 50),))
    deployment = target(9301)

    async def admit_many(prefix: str, count: int) -> tuple[list, int]:
        admitted, refused = [], 0
        for i in range(count):
            try:
                admitted.append(await admit(key, [deployment], f"{prefix}-{i}"))
            except GatewayError as error:
                assert error.status == 429, error.code
                refused += 1
        return admitted, refused

    async def before_the_kill() -> int:
        admitted, _ = await admit_many("before", 30)
        for i, ticket in enumerate(admitted[:10]):
            one = record(tenant, request_id=f"failover-{i}")
            await admission.settle(
                ticket, attempts=[], tokens_used=5, cost=Decimal("0.001"), ledger_record=one.encode()
            )
        return len(admitted)

    with override_settings(REDIS_URL=own_cluster.url, REDIS_TIMEOUT_MS=3000):
        reset_clients()
        try:
            assert asyncio.run(before_the_kill()) == 30
            wait_for_condition(lambda: caught_up(own_cluster, ledger_node), "the replica to catch up")
            replica = own_cluster.replica_of(ledger_node)
            own_cluster.kill(ledger_node)
            wait_for_condition(
                lambda: replica.client().info("replication")["role"] == "master", "the replica's promotion"
            )
            wait_for_condition(own_cluster.healthy, "cluster_state:ok")
            reset_clients()  # (a process that lived through it keeps its clients: they follow the slots)
            with override_settings(REDIS_URL=own_cluster.url):
                log = redis_keys.rate_log(f"tenant:{tenant_id}", "rpm", tag=redis_keys.tenant_tag(tenant_id))
                assert cluster_client(own_cluster).zcard(log) == 30
                after, refused = asyncio.run(admit_many("after", 30))
                assert (len(after), refused) == (20, 10)
                assert cluster_client(own_cluster).zcard(log) == 50
                while ledger.drain():
                    pass
            rows = LedgerEntry.objects.filter(tenant=tenant, request_id__startswith="failover-")
            assert sorted(rows.values_list("request_id", flat=True)) == [f"failover-{i}" for i in range(10)]
        finally:
            reset_clients()


def test_a_stalled_primary_costs_one_request_the_timeout_then_requests_stop_waiting(own_cluster):
    """The guarded cluster client keeps the single-node client's outage behaviour: a primary that
    stops answering (SIGSTOP) costs the first request the request path's timeout, the next ones
    nothing while one of them checks whether it answers again (a fail-closed tenant's get 503 at
    once); once it answers again (SIGCONT) the next
    admission goes through Redis, after voiding the step given up on, which took nothing."""
    import signal

    from django.test import override_settings

    from gateway.errors import GatewayError
    from sentinel.redis_clients import reset_clients

    tenant_id = 9700
    node = own_cluster.node_for(redis_keys.blocked_tenant(tenant_id))
    key = key_info(tenant_id, tenant_limits=(("rpm", 50),))
    log = redis_keys.rate_log(f"tenant:{tenant_id}", "rpm", tag=redis_keys.tenant_tag(tenant_id))

    async def attempt(request_id: str) -> tuple[object, float]:
        started = time.monotonic()
        try:
            await admit(key, [target(9701)], request_id)
            outcome: object = "ok"
        except GatewayError as error:
            outcome = (error.status, error.code)
        return outcome, time.monotonic() - started

    async def scenario() -> list:
        seen = [(await attempt("st-1"))[0]]
        os.kill(node.process.pid, signal.SIGSTOP)
        try:
            seen.append(await attempt("st-2"))
            seen.append(sorted(await asyncio.gather(attempt("st-3"), attempt("st-4")), key=lambda r: r[1]))
        finally:
            os.kill(node.process.pid, signal.SIGCONT)
        for i in range(100):  # each admission checks whether Redis answers again
            outcome, _ = await attempt(f"st-back-{i}")
            if outcome == "ok":
                seen.append(f"st-back-{i}")
                break
            await asyncio.sleep(0.1)
        return seen

    with override_settings(REDIS_URL=own_cluster.url, REDIS_TIMEOUT_MS=300):
        reset_clients()
        try:
            first, (stalled, stalled_for), together, back = asyncio.run(scenario())
        finally:
            reset_clients()
    assert first == "ok"
    (fast, fast_for), (checking, checking_for) = together
    assert stalled == fast == checking == (503, "admission_unavailable")
    assert 0.3 <= stalled_for < 2.5  # waited for the timeout (and the loop's verdict), not the socket's
    assert 0.3 <= checking_for < 2.5  # the one checking whether it answers again waits as long ...
    assert fast_for < 0.1  # ... the other does not wait at all
    members = set(cluster_client(own_cluster).zrange(log, 0, -1))
    assert members == {b"st-1", back.encode()}  # the step given up on took nothing
