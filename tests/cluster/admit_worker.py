"""One OS process of the concurrency test (tests/cluster/test_cluster.py): N admissions at once,
through gateway.limits.admission against REDIS_URL, started when the test writes "go"; prints how each
ended as JSON. Run as `python -m tests.cluster.admit_worker '<json>'`."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from decimal import Decimal

import django


def main() -> None:
    spec = json.loads(sys.argv[1])
    django.setup()
    from gateway.auth import KeyInfo
    from gateway.errors import GatewayError
    from gateway.limits import admission
    from tests.gateway.upstream.targets import target as make_target

    key = KeyInfo(
        key_id=spec["key_id"],
        digest=f"digest-{spec['key_id']}",
        key_name="k",
        tenant_id=spec["tenant_id"],
        tenant_slug="t",
        key_active=True,
        tenant_active=True,
        expires_at=None,
        allowed_models=None,
        tenant_limits=(("rpm", spec["tenant_rpm"]),),
        fail_open=False,  # an unreachable Redis refuses (503 admission_unavailable), never admits locally
    )
    target = make_target(
        deployment_id=spec["deployment_id"],
        provider_id=spec["provider_id"],
        max_concurrent=spec["max_concurrent"],
        max_retries=0,
    )

    async def one(i: int) -> str:
        for _ in range(3):
            try:
                ticket = await admission.admit(
                    key=key,
                    model=spec["model"],
                    model_limits={"rpm": spec["model_rpm"]},
                    deployments=[target],
                    request_id=f"{spec['name']}-{i}",
                    tokens=10,
                    worst_cost=Decimal("0.001"),
                    lease_seconds=600,
                )
            except admission.StaleConfiguration:
                continue
            except GatewayError as error:
                return f"{error.status}:{error.code}"
            return "local" if ticket.local else "admitted"
        return "stale"

    async def run() -> Counter:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        started = time.monotonic()
        outcomes = Counter(await asyncio.gather(*(one(i) for i in range(spec["requests"]))))
        outcomes["given back later"] = len(admission._voids)  # steps whose give-back waits for Redis
        outcomes["seconds"] = round(time.monotonic() - started, 3)  # (a rate log keeps a minute)
        return outcomes

    print(json.dumps(asyncio.run(run())), flush=True)


if __name__ == "__main__":
    main()
