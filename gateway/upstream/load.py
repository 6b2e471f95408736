"""The load of self-hosted deployments (vLLM and other servers an operator runs), as the servers
themselves report it, and whether each one is saturated.

One process samples: the Celery beat task `gateway.tasks.sample_deployment_load`, every
SENTINEL_LOAD_SAMPLE_SECONDS. Beat is already the one scheduler of a Sentinel installation and each
tick runs on one worker, so no leader election is needed, and a web process never spends its event
loop on scraping. It reads each deployment's load URL through the egress guard (the URL is
set in the console), judges saturation with hysteresis (saturated at a threshold, back only when
every signal is below `recover_percent` of its threshold) and writes both to one Redis hash per
deployment that expires after a few sample intervals: a sampler that stops leaves no deployment
marked saturated forever (its breaker still guards it against real failures).

The request path reads the flags of a chain's self-hosted deployments in one Redis round trip
(`saturated`), and a tenant that queues waits in a bounded per-deployment queue (`queue_for`).
Three load sources: vLLM's Prometheus metrics (parsed by prometheus_client's parser), Ollama's
/api/ps, and a generic JSON endpoint whose fields the operator names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import orjson
from django.conf import settings
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from sentinel import redis_keys
from sentinel.redis_clients import UNREACHABLE

log = logging.getLogger(__name__)

# vLLM's gauges (v1 engine); gpu_cache_usage_perc is the older, deprecated name of kv_cache_usage_perc.
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_CACHE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
SCRAPE_TIMEOUT_SECONDS = 1.0
MAX_METRICS_BYTES = 2 * 1024 * 1024
QUEUE_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Load:
    running: float
    waiting: float
    kv_cache_percent: float


@dataclass(frozen=True)
class Thresholds:
    running: int | None
    waiting: int | None
    kv_cache_percent: float | None
    recover_percent: int = 80

    @classmethod
    def of(cls, deployment) -> Thresholds:
        return cls(
            running=deployment.saturated_running,
            waiting=deployment.saturated_waiting,
            kv_cache_percent=deployment.saturated_kv_cache_percent,
            recover_percent=deployment.recover_percent,
        )

    def pairs(self, load: Load) -> list[tuple[float, float]]:
        """(value, threshold) for every signal with a threshold."""
        found = (
            (load.running, self.running),
            (load.waiting, self.waiting),
            (load.kv_cache_percent, self.kv_cache_percent),
        )
        return [(value, float(limit)) for value, limit in found if limit is not None]


def parse_vllm(text: str) -> Load:
    """vLLM's load from its /metrics: requests running and waiting summed over its engines and
    models, the KV cache's usage at its fullest engine (in percent)."""
    running = waiting = kv = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in RUNNING:
                running += sample.value
            elif sample.name in WAITING:
                waiting += sample.value
            elif sample.name in KV_CACHE:
                kv = max(kv, sample.value * 100)
    return Load(running=running, waiting=waiting, kv_cache_percent=kv)


def parse_ollama(body: bytes) -> Load:
    """Ollama's load from its GET /api/ps, which lists the models it holds in memory, not the requests
    it serves or queues (it reports none): `running` counts the models loaded, `kv_cache_percent` is
    the share of their memory outside VRAM (in system memory: run on the CPU, many times slower)."""
    models = _json_object(body).get("models")
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise ValueError("no list of models")
    size = sum(_number(m.get("size", 0), "size") for m in models)
    in_vram = sum(_number(m.get("size_vram", 0), "size_vram") for m in models)
    offloaded = (size - in_vram) / size * 100 if size > 0 else 0.0
    return Load(running=float(len(models)), waiting=0.0, kv_cache_percent=max(0.0, offloaded))


def parse_queue_depth(body: bytes, *, running_field: str, waiting_field: str) -> Load:
    """A generic endpoint's load: the numbers at the operator's dotted paths of its JSON document
    (`{"queue_depth": 12, "running": 4}` with `queue_depth` and `running`); a field not set reads 0."""
    document = _json_object(body)

    def read(path: str) -> float:
        value: object = document
        for part in path.split(".") if path else ():
            if not isinstance(value, dict) or part not in value:
                raise ValueError(f"no field {path}")
            value = value[part]
        return _number(value, path) if path else 0.0

    return Load(running=read(running_field), waiting=read(waiting_field), kv_cache_percent=0.0)


def _json_object(body: bytes) -> dict:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    return document


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} is not a number")
    return float(value)


def parse(deployment, body: bytes) -> Load:
    """The load in what the deployment's load URL answered, as its load source says to read it."""
    from gateway.models import Deployment

    if deployment.load_source == Deployment.LoadSource.OLLAMA:
        return parse_ollama(body)
    if deployment.load_source == Deployment.LoadSource.JSON:
        return parse_queue_depth(
            body, running_field=deployment.load_running_field, waiting_field=deployment.load_waiting_field
        )
    return parse_vllm(body.decode(errors="replace"))


def judge(load: Load, thresholds: Thresholds, *, was_saturated: bool) -> bool:
    """Saturated when any signal reaches its threshold; once saturated, until every signal is below
    recover_percent of its threshold (so a server hovering at its limit does not flap)."""
    pairs = thresholds.pairs(load)
    if not was_saturated:
        return any(value >= limit for value, limit in pairs)
    return not all(value < limit * thresholds.recover_percent / 100 for value, limit in pairs)


# --- the sampler (one process: the beat task) ----------------------------------------------------


async def _scrape(deployment, session) -> Load | str:
    """The server's load, or why it could not be read."""
    from sentinel import egress

    url = deployment.load_metrics_url
    try:
        reply = await egress.get(url, timeout=SCRAPE_TIMEOUT_SECONDS, max_bytes=MAX_METRICS_BYTES, session=session)
    except egress.EgressRefused as refused:
        return f"refused by the egress guard: {refused.reason}"
    except Exception as exc:  # noqa: BLE001 - any failure to read is reported, the others still sampled
        return f"unreadable: {type(exc).__name__}: {exc}"[:300]
    if reply.status != 200:
        return f"HTTP {reply.status}"
    try:
        return parse(deployment, reply.body)
    except ValueError as exc:
        return f"not {deployment.get_load_source_display()}: {exc}"[:300]


def sample_deployments() -> int:
    """Sample every enabled self-hosted deployment once, write what was read to Redis and announce
    saturation changes. Returns how many were read."""
    from gateway.models import Deployment
    from sentinel.redis_clients import sync_redis

    deployments = list(Deployment.objects.filter(self_hosted=True, enabled=True).exclude(load_metrics_url=""))
    if not deployments:
        return 0

    async def scrape_all() -> list[Load | str]:
        from sentinel import egress

        async with egress.new_session() as session:  # this run's loop's own, closed with it
            return await asyncio.gather(*(_scrape(d, session) for d in deployments))

    loads = asyncio.run(scrape_all())
    redis = sync_redis()
    events = []
    ttl_ms = int(max(3 * settings.LOAD_SAMPLE_SECONDS, 5.0) * 1000)
    read = 0
    for deployment, load in zip(deployments, loads, strict=True):
        key = redis_keys.deployment_load(deployment.pk)
        if isinstance(load, str):
            # Nothing new to judge by: the last sample stands until it expires.
            log.warning("load of %s not sampled: %s", deployment.name, load)
            pipe = redis.pipeline(transaction=True)  # (one deployment's keys: one slot on a cluster)
            pipe.hset(key, "error", load)
            pipe.pexpire(key, ttl_ms)
            pipe.execute()
            continue
        read += 1
        was = redis.hget(key, "saturated") == b"1"
        now_saturated = judge(load, Thresholds.of(deployment), was_saturated=was)
        pipe = redis.pipeline(transaction=True)
        pipe.hset(
            key,
            mapping={
                "running": load.running,
                "waiting": load.waiting,
                "kv_cache_percent": load.kv_cache_percent,
                "saturated": int(now_saturated),
                "sampled_at": time.time(),
                "error": "",
            },
        )
        pipe.pexpire(key, ttl_ms)
        pipe.execute()
        if now_saturated != was:
            load_transition(deployment, load, saturated=now_saturated)
        events.append({"deployment": deployment.name, "load": _describe(load, now_saturated, deployment.load_source)})
    _publish(events)
    return read


def _publish(events: list[dict]) -> None:
    """The samples to the console's live circuits view (best effort)."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from gateway.upstream.breakers import CIRCUITS_GROUP

    if not events:
        return
    try:
        async_to_sync(get_channel_layer().group_send)(CIRCUITS_GROUP, {"type": "circuit.load", "samples": events})
    except Exception:  # the live view is best effort; the samples are in Redis
        log.exception("could not publish deployment load to the live view")


def load_transition(deployment, load: Load, *, saturated: bool) -> None:
    """A deployment became saturated or recovered: logged and counted."""
    from gateway import metrics

    metrics.saturation_transition(deployment.name, saturated)
    log.warning(
        "deployment %s %s (%s)",
        deployment.name,
        "saturated" if saturated else "recovered",
        _describe(load, saturated, deployment.load_source),
    )


# --- the request path ----------------------------------------------------------------------------


async def saturated(deployment_ids: Iterable[int]) -> set[int]:
    """Which of these deployments are saturated now (one Redis round trip; none when Redis cannot
    be reached: saturation only steers traffic, it never blocks it)."""
    from sentinel.redis_clients import async_redis

    ids = list(deployment_ids)
    if not ids:
        return set()
    pipe = async_redis().pipeline(transaction=False)
    for deployment_id in ids:
        pipe.hget(redis_keys.deployment_load(deployment_id), "saturated")
    try:
        flags = await pipe.execute()
    except UNREACHABLE:
        return set()
    return {deployment_id for deployment_id, flag in zip(ids, flags, strict=True) if flag == b"1"}


async def queue_for(deployment_id: int, *, request_id: str, limit: int, wait_seconds: float) -> bool:
    """Wait, in the deployment's bounded queue, until it is no longer saturated: True when it
    recovered in time, False when the queue is full or the deadline passed."""
    from sentinel.redis_clients import async_redis

    redis = async_redis()
    key = redis_keys.saturation_queue(deployment_id)
    give_up = time.time() + wait_seconds
    try:
        # MULTI (said, for a cluster's client, whose pipelines are not transactions by default): prune
        # the ones gone, join, count.
        pipe = redis.pipeline(transaction=True)
        pipe.zremrangebyscore(key, "-inf", time.time())
        pipe.zadd(key, {request_id: give_up})
        pipe.pexpire(key, int(wait_seconds * 1000) + 1000)
        pipe.zcard(key)
        waiting = (await pipe.execute())[-1]
    except UNREACHABLE:
        return False
    try:
        if waiting > limit:
            return False
        while time.time() < give_up:
            await asyncio.sleep(QUEUE_POLL_SECONDS)
            if deployment_id not in await saturated([deployment_id]):
                return True
        return False
    finally:
        with contextlib.suppress(*UNREACHABLE):  # else it expires with its score
            await redis.zrem(key, request_id)


def load_snapshot(deployment_id: int) -> dict:
    """The last sample as stored (for the admin)."""
    from sentinel.redis_clients import sync_redis

    try:
        raw = sync_redis().hgetall(redis_keys.deployment_load(deployment_id))
    except UNREACHABLE:
        return {}
    return {k.decode(): v.decode() for k, v in raw.items()}


def describe_load(deployment) -> str:
    """A deployment's load as the admin and the console show it."""
    if not deployment.self_hosted:
        return "-"
    sample = load_snapshot(deployment.pk)
    if not sample.get("sampled_at"):
        return sample.get("error") or "not sampled"
    load = Load(float(sample["running"]), float(sample["waiting"]), float(sample["kv_cache_percent"]))
    return _describe(load, sample.get("saturated") == "1", deployment.load_source)


def _describe(load: Load, saturated: bool, source: str = "vllm") -> str:
    verdict = "saturated" if saturated else "ok"
    if source == "ollama":
        return f"{verdict}: {load.running:g} models loaded, {load.kv_cache_percent:.0f}% of their memory outside VRAM"
    if source == "json":
        return f"{verdict}: {load.running:g} running, {load.waiting:g} waiting"
    return f"{verdict}: {load.running:g} running, {load.waiting:g} waiting, KV cache {load.kv_cache_percent:.0f}%"


class DeploymentLoad(Collector):
    """sentinel_deployment_load and sentinel_deployment_saturated, read from Redis at scrape time
    for every self-hosted deployment."""

    def describe(self):
        return list(self._families())

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "sentinel_deployment_load",
                "A self-hosted deployment's last sampled load: requests running and waiting, KV-cache usage "
                "in percent.",
                labels=("deployment", "signal"),
            ),
            GaugeMetricFamily(
                "sentinel_deployment_saturated",
                "1 while a self-hosted deployment counts as saturated, 0 otherwise.",
                labels=("deployment",),
            ),
        )

    def collect(self):
        import redis

        from gateway.models import Deployment
        from sentinel.redis_clients import sync_redis

        load, saturation = self._families()
        deployments = list(Deployment.objects.filter(self_hosted=True).values_list("pk", "name"))
        pipe = sync_redis().pipeline(transaction=False)
        for pk, _ in deployments:
            pipe.hmget(redis_keys.deployment_load(pk), "running", "waiting", "kv_cache_percent", "saturated")
        try:
            rows = pipe.execute()
        except redis.RedisError:
            return [load, saturation]
        for (_, name), (running, waiting, kv, flag) in zip(deployments, rows, strict=True):
            if running is None:
                continue  # never sampled, or the sample expired: no figure rather than a zero
            for signal, value in (("running", running), ("waiting", waiting), ("kv_cache_percent", kv)):
                load.add_metric([name, signal], float(value))
            saturation.add_metric([name], 1.0 if flag == b"1" else 0.0)
        return [load, saturation]


# /metrics serves it (gateway.views), as the breakers' states.
LOAD_REGISTRY = CollectorRegistry(auto_describe=False)
LOAD_REGISTRY.register(DeploymentLoad())
