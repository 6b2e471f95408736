"""The gateway's Lua scripts, run by EVALSHA (loaded once; reloaded if Redis forgot them, e.g. after
a restart). Scripts that need the circuit-breaker functions get breakers.lua prepended."""

from __future__ import annotations

import hashlib
from pathlib import Path

from redis import exceptions as redis_errors

from sentinel.redis_clients import async_redis

_HERE = Path(__file__).parent
_SOURCES = {
    "admission": ("breakers", "deployments", "admission"),
    "settle": ("breakers", "settle"),
    "probe": ("breakers", "probe"),
    "reserve": ("breakers", "deployments", "reserve"),
    "pace": ("pace",),
    "void": ("void",),
    "claim": ("breakers", "deployments", "claim"),
    "cache_store": ("cache_store",),
    "cache_lookup": ("cache_lookup",),
}


class Script:
    def __init__(self, name: str) -> None:
        self.source = "\n".join((_HERE / f"{part}.lua").read_text() for part in _SOURCES[name])
        self.sha = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()

    async def __call__(self, keys: list, args: list):
        client = async_redis()
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except redis_errors.NoScriptError:
            # EVAL caches the script on the node that runs it: on a cluster, the node owning the
            # keys' slot (a SCRIPT LOAD could land on another).
            return await client.eval(self.source, len(keys), *keys, *args)

    def queue(self, pipe, keys: list, args: list) -> None:
        """Add to a pipeline. A NOSCRIPT reply in its results means nothing of it ran: call the script
        for it then (EVAL loads it), or run `ensure_loaded` before the pipeline."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)

    async def ensure_loaded(self) -> None:
        client = async_redis()
        if not (await client.script_exists(self.sha))[0]:
            await client.script_load(self.source)


admission = Script("admission")
settle = Script("settle")
probe = Script("probe")
reserve = Script("reserve")
pace = Script("pace")
void = Script("void")
claim = Script("claim")
cache_store = Script("cache_store")
cache_lookup = Script("cache_lookup")
