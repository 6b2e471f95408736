"""Every Redis key Sentinel writes, in one place (docs/architecture.md, "Redis keys", describes each).

Keys the admission, settle and breaker scripts touch in one call carry the hash tag `{sentinel}`, so
that a Redis Cluster would keep them on one node; the Lua scripts receive them through KEYS and never
build a key themselves. The others are plain `sentinel:` keys.
"""

from __future__ import annotations

import hashlib
from datetime import date

# --- touched by the Lua scripts (hash tag {sentinel}) ----------------------------------------------


def rate_log(ident: str, kind: str) -> str:
    """A sliding log of one limit: `ident` is `<scope>:<id>` (key, tenant, model), `kind` one of
    rpm, tpm, concurrency. The tpm log's running sum is this key + ":sum"."""
    return f"{{sentinel}}:rl:{ident}:{kind}"


def budget_period(budget_id: int, start: date) -> str:
    """The prefix of a budget period's keys: + ":spent", ":res" and ":res:sum"."""
    return f"{{sentinel}}:budget:{budget_id}:{start.isoformat()}"


def audience_period(limit_id: int, subject: str, period: str, start: date, measure: str) -> str:
    """The prefix of the keys counting what one end user or session (`subject`) spent (`measure` usd)
    or used (tok) in a period under an end-user limit (tenants.EndUserLimit, which names the key and
    the scope): + ":spent", ":res" and ":res:sum", as a budget's. `subject` is the client's string:
    only its digest goes into the name, so no id can change the key's shape or its hash slot."""
    digest = hashlib.sha256(subject.encode()).hexdigest()[:32]
    return f"{{sentinel}}:aud:{limit_id}:{digest}:{period}:{start.isoformat()}:{measure}"


def provider_spend(provider_id: int, day: date) -> str:
    """A provider's spend on one UTC day, in units."""
    return f"{{sentinel}}:pspend:{provider_id}:{day.isoformat()}"


def deployment_slots(deployment_id: int) -> str:
    """The requests holding one of a deployment's concurrency slots (scored by lease end)."""
    return f"{{sentinel}}:dc:{deployment_id}"


def breaker(deployment_id: int) -> str:
    """A deployment's breaker (a hash); its sliding window is this key + ":w"."""
    return f"{{sentinel}}:cb:{deployment_id}"


def batch_pace(tenant_id: int) -> str:
    """The next free moment of a tenant's batch schedule."""
    return f"{{sentinel}}:batchpace:{tenant_id}"


def void(step: str) -> str:
    """Set when an admission step was given up on: if it runs after that, it takes nothing."""
    return f"{{sentinel}}:void:{step}"


# --- plain keys -------------------------------------------------------------------------------

CONFIG_GENERATION = "sentinel:config:generation"  # bumped on every configuration change


def blocked_key(digest: str) -> str:
    """A revoked key's marker, checked on every request."""
    return f"sentinel:blocked:key:{digest}"


def blocked_tenant(tenant_id: int) -> str:
    """A suspended tenant's marker, checked on every request."""
    return f"sentinel:blocked:tenant:{tenant_id}"


def key_info(generation: str, digest: str) -> str:
    """A key's settings as of a configuration generation, shared by the gateway processes."""
    return f"sentinel:keyinfo:{generation}:{digest}"


def key_info_last_known(digest: str) -> str:
    """A key's settings as last read from the database, whatever the generation: what the gateway
    serves a key by while the database is away."""
    return f"sentinel:keyinfo:last:{digest}"


def exact_cache(digest: str) -> str:
    """An answer in the exact cache tier."""
    return f"sentinel:cache:{digest}"


def cache_partition_count(partition: str) -> str:
    """How many entries were stored in a cache partition (never fewer than it holds while Redis
    keeps it: evictions and invalidations do not count down, which only costs a needless search)."""
    return f"sentinel:cache:part:{partition}"


def cache_partition_misses(partition: str) -> str:
    """How many answers were stored in a cache partition since either tier last served one there
    (about: hits reset it only once it is a quarter of the way to cold). Past
    SENTINEL_CACHE_COLD_AFTER the partition is cold and most lookups skip the semantic tier."""
    return f"sentinel:cache:part:{partition}:misses"


def cache_tenant_count(tenant_id: int) -> str:
    """About how many cache entries a tenant holds: counted up on every store, set to the truth
    whenever the database is counted (past the cap, or when the counter is new)."""
    return f"sentinel:cache:tenant:{tenant_id}:entries"


LEDGER_STREAM = "sentinel:ledger"  # the ledger queue (consumer group ledger-writers)
LEDGER_OLD_DEAD_LETTERS = "sentinel:ledger:dead"  # where refused records went before they moved to Postgres
DJANGO_CACHE_PREFIX = "sentinel:django"  # Django's cache
CHANNELS_PREFIX = "sentinel:channels"  # Channels' groups and messages


def deployment_load(deployment_id: int) -> str:
    """A self-hosted deployment's last sampled load and saturation (a hash, expiring with the sample)."""
    return f"{{sentinel}}:load:{deployment_id}"


def saturation_queue(deployment_id: int) -> str:
    """The requests waiting for a saturated deployment (scored by when they give up)."""
    return f"{{sentinel}}:loadq:{deployment_id}"
