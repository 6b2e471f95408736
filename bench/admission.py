"""Scenario 4, admission: four gateway processes against one Valkey. A key limited to 100 requests a
minute gets 500 requests at once; a $1.00 budget gets 300 requests whose worst case is $0.01 each.
Admitted counts and overspend. Then the admission step's own cost: the one atomic Redis step a request
makes (limits on key, tenant and model; two budgets; breakers of a two-deployment chain) and its
settlement, timed in-process, p50 and p99.

    python -m bench admission [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import time
import uuid
from decimal import Decimal

import aiohttp

from bench import report
from bench.stack import _python_child as python_child
from bench.stack import add_stack_arguments, running_stack, wait_ready, web_server
from sentinel.startup import free_ports

SCENARIO = "admission"


def prepare(mock_url: str) -> dict:
    """A tenant with a 100/min key, a tenant with a $1.00 daily budget, and a model whose answer costs
    exactly its worst case ($0.01: 40 tokens at $0.00025, no charge for the prompt)."""
    from gateway.models import ChainEntry, Deployment, ModelAlias, Provider
    from sentinel.localstate import announce_change
    from tenants.models import Budget, Tenant
    from tenants.services import key_create

    run = uuid.uuid4().hex[:8]
    provider, _ = Provider.objects.update_or_create(
        name="admission-mock", defaults={"kind": "openai", "api_base": f"{mock_url}/p/admission/v1"}
    )
    provider.set_api_key("sk-mock-admission")
    provider.save()
    deployment = Deployment.objects.create(
        name=f"admission-{run}",
        provider=provider,
        litellm_model="openai/gpt-4o-mini",
        input_price_override=Decimal(0),
        output_price_override=Decimal("0.00025"),
    )
    alias = ModelAlias.objects.create(name=f"admission-{run}")
    ChainEntry.objects.create(alias=alias, deployment=deployment)
    limited = Tenant.objects.create(name="rate", slug=f"admission-rate-{run}")
    budgeted = Tenant.objects.create(name="budget", slug=f"admission-budget-{run}")
    Budget.objects.create(tenant=budgeted, period="daily", limit_usd=Decimal("1.00"))
    announce_change()
    return {
        "model": alias.name,
        "rate_key": key_create(tenant=limited, name="100/min", requests_per_minute=100)[1],
        "budget_key": key_create(tenant=budgeted, name="budget")[1],
        "budget_tenant": budgeted.pk,
    }


async def burst(urls: list[str], key: str, bodies: list[dict]) -> list[int]:
    rotation = itertools.cycle(urls)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(url: str, body: dict) -> int:
            async with session.post(
                f"{url}/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {key}", "x-sentinel-cache-control": "no-cache, no-store"},
            ) as response:
                await response.read()
                return response.status

        return await asyncio.gather(*(one(next(rotation), body) for body in bodies))


def settled_spend(tenant_id: int) -> Decimal:
    from django.db.models import Sum

    from billing.ledger import drain
    from billing.models import LedgerEntry

    time.sleep(1.0)
    drain()
    return LedgerEntry.objects.filter(tenant_id=tenant_id).aggregate(total=Sum("cost_usd"))["total"] or Decimal(0)


def step_latency(samples: int, model: str) -> dict:
    """The admission step and its settlement (which also queues the ledger record), in-process
    against the same Redis, for a real key with limits on key, tenant and model and two budgets
    (microseconds). The records are real ones, at zero cost, for a tenant of their own."""
    from billing.ledger import LedgerRecord
    from gateway.auth import _load_from_db
    from gateway.limits import admission
    from tenants.models import Budget, Tenant
    from tenants.services import key_create, key_digest

    tenant = Tenant.objects.create(
        name="admission step",
        slug=f"admission-step-{uuid.uuid4().hex[:8]}",
        requests_per_minute=10**7,
        tokens_per_minute=10**9,
        max_concurrent=10**6,
    )
    key, secret = key_create(
        tenant=tenant, name="step", requests_per_minute=10**7, tokens_per_minute=10**9, max_concurrent=10**6
    )
    Budget.objects.create(tenant=tenant, period="monthly", limit_usd=Decimal(10**6))
    Budget.objects.create(tenant=tenant, key=key, period="daily", limit_usd=Decimal(10**6))
    info = _load_from_db(key_digest(secret))

    async def admit(**arguments):
        while True:
            try:
                return await admission.admit(**arguments)
            except admission.StaleConfiguration:
                continue  # this process's first look at the configuration generation (as the pipeline does)

    async def measure() -> tuple[list[float], list[float]]:
        from gateway.upstream.routing import route_for

        route = await route_for(model, info.tenant_id)  # the prepared model's chain, as the pipeline has it
        admit_times, settle_times = [], []
        for i in range(samples):
            request_id = f"step-{i}-{uuid.uuid4().hex}"
            started = time.perf_counter()
            ticket = await admit(
                key=info,
                model=model,
                model_limits={"rpm": 10**7, "tpm": 10**9, "concurrency": 10**6},
                deployments=list(route.targets),
                request_id=request_id,
                tokens=400,
                worst_cost=Decimal("0.001"),
                lease_seconds=60,
            )
            admitted = time.perf_counter()
            record = LedgerRecord(
                request_id=request_id,
                tenant_id=info.tenant_id,
                key_id=info.key_id,
                model_requested=model,
                status_code=200,
            )
            await admission.settle(ticket, attempts=[], tokens_used=300, cost=Decimal(0), ledger_record=record.encode())
            admit_times.append(admitted - started)
            settle_times.append(time.perf_counter() - admitted)
        return admit_times, settle_times

    def pct(values: list[float], q: float) -> float:
        return round(sorted(values)[int(q * (len(values) - 1))] * 1e6, 1)

    admit_times, settle_times = asyncio.run(measure())
    return {
        "samples": samples,
        "admit_p50_us": pct(admit_times, 0.5),
        "admit_p99_us": pct(admit_times, 0.99),
        "settle_p50_us": pct(settle_times, 0.5),
        "settle_p99_us": pct(settle_times, 0.99),
        "admit_mean_us": round(statistics.fmean(admit_times) * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench admission", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer latency samples: a smoke test")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    result = report.envelope(SCENARIO, quick=args.quick)
    result["config"] = {"gateway_processes": 4, "web_server": web_server(args)}
    with running_stack(out_dir=args.out, data_dir=args.data_dir, workers=1, mock_profile="zero") as stack:
        ports = free_ports(3)
        for n, port in enumerate(ports, 2):
            child = python_child(
                f"web-{n}", "-m", "sentinel.web", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"
            )
            stack.children.append(child)
            child.start(stack.log_dir, dict(os.environ))
        urls = [stack.gateway_url, *(f"http://127.0.0.1:{port}" for port in ports)]
        for url in urls[1:]:
            wait_ready(f"{url}/health/ready", stack.children, 120)
        setup = prepare(stack.mock_url)

        def ask(i: int, **extra) -> dict:
            return {"model": setup["model"], "messages": [{"role": "user", "content": f"admission {i}"}], **extra}

        rate = asyncio.run(burst(urls, setup["rate_key"], [ask(i) for i in range(500)]))
        budget = asyncio.run(burst(urls, setup["budget_key"], [ask(i, max_tokens=40) for i in range(300)]))
        spend = settled_spend(setup["budget_tenant"])
        result["rate_limit"] = {
            "limit_per_minute": 100,
            "sent": 500,
            "admitted": rate.count(200),
            "rejected_429": rate.count(429),
            "over_admission": max(0, rate.count(200) - 100),
        }
        result["budget"] = {
            "limit_usd": "1.00",
            "worst_case_usd": "0.01",
            "sent": 300,
            "admitted": budget.count(200),
            "rejected_402": budget.count(402),
            "settled_spend_usd": str(spend),
            "overspend_usd": str(max(Decimal(0), spend - Decimal("1.00"))),
        }
        result["step_latency"] = step_latency(200 if args.quick else 3000, setup["model"])
    print(
        report.table(
            ["check", "sent", "admitted", "rejected", "over limit"],
            [
                [
                    "key 100/min, 4 processes",
                    500,
                    result["rate_limit"]["admitted"],
                    result["rate_limit"]["rejected_429"],
                    result["rate_limit"]["over_admission"],
                ],
                [
                    "$1.00 budget, $0.01 worst case",
                    300,
                    result["budget"]["admitted"],
                    result["budget"]["rejected_402"],
                    f"${result['budget']['overspend_usd']}",
                ],
            ],
            title="Admission across four gateway processes (one run)",
        )
    )
    step = result["step_latency"]
    print(
        report.table(
            ["step", "p50 µs", "p99 µs"],
            [
                ["admit (one Lua step)", step["admit_p50_us"], step["admit_p99_us"]],
                ["settle", step["settle_p50_us"], step["settle_p99_us"]],
            ],
            title="Admission step, in-process against the same Redis",
        )
    )
    path = report.write_json(args.out, SCENARIO, result)
    print(f"Results: {path}")
    return 0
