"""Every Redis key Sentinel writes, in one place (docs/architecture.md, "Redis keys", describes each).

Every key a Lua script or a multi-key command touches carries a hash tag naming the one thing it
belongs to, so that on a Valkey/Redis Cluster the keys one atomic step touches share a slot and
different tenants', deployments' and providers' keys spread over the cluster (docs/cluster.md):

- `{t<tenant id>}`: everything one tenant's admission takes atomically (its keys' and its own rate
  logs, budgets, end-user limits, block markers, the admission step's void marker) and its batch pace;
- `{m<digest of the model name>}`: a model's global rate logs (shared by every tenant);
- `{d<deployment id>}`: a deployment's breaker, concurrency slots, load sample and saturation queue;
- `{p<provider id>}`: a provider's daily spend;
- `{c<digest of the partition>}`: a cache partition's exact entries and counts (read in one MGET).

The Lua scripts receive keys through KEYS and never build one themselves. The configuration
generation, the ledger stream and Django's and Channels' keys are plain `sentinel:` keys, each in a
slot of its own.
"""

from __future__ import annotations

import hashlib
from datetime import date

# --- hash tags ---------------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tenant_tag(tenant_id: int) -> str:
    return f"{{t{tenant_id}}}"


def model_tag(model: str) -> str:
    """A model's tag: the name's digest, so no character of a name can end the tag early."""
    return f"{{m{_digest(model)}}}"


def deployment_tag(deployment_id: int) -> str:
    return f"{{d{deployment_id}}}"


def provider_tag(provider_id: int) -> str:
    return f"{{p{provider_id}}}"


def cache_tag(partition: str) -> str:
    return f"{{c{_digest(partition)}}}"


# --- touched by the Lua scripts ------------------------------------------------------------------


def rate_log(ident: str, kind: str, *, tag: str) -> str:
    """A sliding log of one limit: `ident` is `<scope>:<id>` (key, tenant, model), `kind` one of
    rpm, tpm, concurrency; `tag` the tenant's (key and tenant limits) or the model's. The tpm log's
    running sum is this key + ":sum"."""
    return f"{tag}:rl:{ident}:{kind}"


def budget_period(budget_id: int, start: date, *, tenant_id: int) -> str:
    """The prefix of a budget period's keys: + ":spent", ":res" and ":res:sum"."""
    return f"{tenant_tag(tenant_id)}:budget:{budget_id}:{start.isoformat()}"


def audience_period(limit_id: int, subject: str, period: str, start: date, measure: str, *, tenant_id: int) -> str:
    """The prefix of the keys counting what one end user or session (`subject`) spent (`measure` usd)
    or used (tok) in a period under an end-user limit (tenants.EndUserLimit, which names the key and
    the scope): + ":spent", ":res" and ":res:sum", as a budget's. `subject` is the client's string:
    only its digest goes into the name, so no id can change the key's shape or its hash slot."""
    digest = hashlib.sha256(subject.encode()).hexdigest()[:32]
    return f"{tenant_tag(tenant_id)}:aud:{limit_id}:{digest}:{period}:{start.isoformat()}:{measure}"


def provider_spend(provider_id: int, day: date) -> str:
    """A provider's spend on one UTC day, in units."""
    return f"{provider_tag(provider_id)}:pspend:{provider_id}:{day.isoformat()}"


def deployment_slots(deployment_id: int) -> str:
    """The requests holding one of a deployment's concurrency slots (scored by lease end)."""
    return f"{deployment_tag(deployment_id)}:dc"


def breaker(deployment_id: int) -> str:
    """A deployment's breaker (a hash); its sliding window is this key + ":w"."""
    return f"{deployment_tag(deployment_id)}:cb"


def batch_pace(tenant_id: int) -> str:
    """The next free moment of a tenant's batch schedule."""
    return f"{tenant_tag(tenant_id)}:batchpace"


def void(step: str, *, tag: str) -> str:
    """Set when an admission step was given up on: if it runs after that, it takes nothing. One per
    slot the step touched (`tag`: the tenant's, the model's, a deployment's)."""
    return f"{tag}:void:{step}"


# --- plain keys -------------------------------------------------------------------------------

CONFIG_GENERATION = "sentinel:config:generation"  # bumped on every configuration change


def blocked_key(digest: str, *, tenant_id: int) -> str:
    """A revoked key's marker, checked on every request (in the tenant's admission step: its tag)."""
    return f"{tenant_tag(tenant_id)}:blocked:key:{digest}"


def blocked_tenant(tenant_id: int) -> str:
    """A suspended tenant's marker, checked on every request (in the tenant's admission step)."""
    return f"{tenant_tag(tenant_id)}:blocked:tenant"


def key_info(generation: str, digest: str) -> str:
    """A key's settings as of a configuration generation, shared by the gateway processes."""
    return f"sentinel:keyinfo:{generation}:{digest}"


def key_info_last_known(digest: str) -> str:
    """A key's settings as last read from the database, whatever the generation: what the gateway
    serves a key by while the database is away."""
    return f"sentinel:keyinfo:last:{digest}"


def exact_cache(digest: str, partition: str) -> str:
    """An answer in the exact cache tier (tagged by its partition: read in one MGET with its counts)."""
    return f"{cache_tag(partition)}:cache:{digest}"


def cache_lead(digest: str, partition: str) -> str:
    """Held (SET NX, with a TTL) by the request asking the provider for an exact key's answer while it
    does: identical requests meanwhile wait for that answer instead of asking too. The store script
    deletes it with the answer's key set; a request that ends without storing one deletes it."""
    return f"{cache_tag(partition)}:cache:lead:{digest}"


def cache_partition_count(partition: str) -> str:
    """How many entries were stored in a cache partition (never fewer than it holds while Redis
    keeps it: evictions and invalidations do not count down, which only costs a needless search)."""
    return f"{cache_tag(partition)}:cache:part"


def cache_partition_misses(partition: str) -> str:
    """How many answers were stored in a cache partition since either tier last served one there
    (about: hits reset it only once it is a quarter of the way to cold). Past
    SENTINEL_CACHE_COLD_AFTER the partition is cold and most lookups skip the semantic tier."""
    return f"{cache_tag(partition)}:cache:part:misses"


def cache_tenant_count(tenant_id: int) -> str:
    """About how many cache entries a tenant holds: counted up on every store, set to the truth
    whenever the database is counted (past the cap, or when the counter is new)."""
    return f"sentinel:cache:tenant:{tenant_id}:entries"


def cache_tenant_trimming(tenant_id: int) -> str:
    """Held (redis-py's lock: a token, expiring) by the one process counting and trimming a tenant's
    cache: two at once would each take what they deleted off the count, and it would understate."""
    return f"sentinel:cache:tenant:{tenant_id}:trimming"


def cache_tenant_cleared(tenant_id: int) -> str:
    """When a tenant's cache was last cleared (unix time, set before its entries are deleted): an
    answer to a request received before then is not filed, or is taken out again (gateway.cache.engine)."""
    return f"sentinel:cache:tenant:{tenant_id}:cleared"


LEDGER_STREAM = "sentinel:ledger"  # the ledger queue (consumer group ledger-writers)
LEDGER_OLD_DEAD_LETTERS = "sentinel:ledger:dead"  # where refused records went before they moved to Postgres
DJANGO_CACHE_PREFIX = "sentinel:django"  # Django's cache
CHANNELS_PREFIX = "sentinel:channels"  # Channels' groups and messages


def deployment_load(deployment_id: int) -> str:
    """A self-hosted deployment's last sampled load and saturation (a hash, expiring with the sample)."""
    return f"{deployment_tag(deployment_id)}:load"


def saturation_queue(deployment_id: int) -> str:
    """The requests waiting for a saturated deployment (scored by when they give up)."""
    return f"{deployment_tag(deployment_id)}:loadq"
