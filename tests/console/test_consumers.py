"""The console's websocket with a real client against a real gateway process: refused without a
session; each member gets their own tenants' live summaries only (without money unless their role
includes spend), and only operators get circuit transitions."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gateway.breakers import breaker_force
from gateway.models import Deployment
from sentinel.console.live import live_publish
from tests.billing.conftest import drain_all, hand_off_all, record
from tests.console.conftest import as_user


def socket(gateway, user=None):
    headers = {}
    if user is not None:
        headers["Cookie"] = f"sessionid={as_user(user).cookies['sessionid'].value}"
    return connect(
        gateway.url.replace("http://", "ws://") + "/ws/console/",
        origin=gateway.url,
        additional_headers=headers,
        open_timeout=10,
    )


def receive(ws, timeout: float = 5.0) -> dict:
    return json.loads(ws.recv(timeout=timeout))


def test_a_socket_without_a_session_is_refused(gateway, live_db):
    with pytest.raises(InvalidStatus) as refused:
        socket(gateway)
    assert refused.value.response.status_code == 403
    with pytest.raises(InvalidStatus):  # a made-up session is no session
        connect(
            gateway.url.replace("http://", "ws://") + "/ws/console/",
            origin=gateway.url,
            additional_headers={"Cookie": "sessionid=not-a-session"},
        )


def test_each_socket_gets_its_own_tenants_events_only(gateway, tenancy, make_model):
    t = tenancy
    a, b = t.tenant, t.other
    ago = timezone.now() - timedelta(seconds=5)
    hand_off_all(
        [
            record(a, at=ago, latency_ms=100, cost="0.00001", request_id="ws-a1"),
            record(a, at=ago, latency_ms=300, cost="0.00002", request_id="ws-a2"),
            record(a, at=ago, status=503, error_code="all_providers_unavailable", cost="0", request_id="ws-a3"),
            record(
                b, at=ago, latency_ms=50, cost="0", cache_tier="hit-exact", saved_cost_usd="0.5", request_id="ws-b1"
            ),
        ]
    )
    drain_all()
    _, (provider,) = make_model()
    deployment = Deployment.objects.get(name=provider)

    with (
        socket(gateway, t.owner) as owner,
        socket(gateway, t.viewer) as viewer,
        socket(gateway, t.outsider) as outsider,
        socket(gateway, t.superuser) as operator,
    ):
        assert receive(owner) == {"type": "hello", "operator": False, "tenants": [a.pk]}
        assert receive(viewer) == {"type": "hello", "operator": False, "tenants": [a.pk]}
        assert receive(outsider) == {"type": "hello", "operator": False, "tenants": [b.pk]}
        assert receive(operator) == {"type": "hello", "operator": True, "tenants": []}

        now = timezone.now()
        published = live_publish(now=now)
        expected_a = {
            "type": "tenant.summary",
            "tenant": a.slug,
            "tenant_id": a.pk,
            "at": now.isoformat(),
            "window_seconds": 60,
            "requests": 3,
            "errors": 1,
            "server_errors": 1,
            "exact_hits": 0,
            "semantic_hits": 0,
            "misses": 2,
            "p50_ms": 200,
            "p95_ms": 290,
            "p99_ms": 298,
            "cost_usd": "0.0000300000",
            "saved_usd": "0.0000000000",
            "spend_today_usd": "0.0000300000",
        }
        expected_b = {
            **expected_a,
            "tenant": b.slug,
            "tenant_id": b.pk,
            "requests": 1,
            "errors": 0,
            "server_errors": 0,
            "exact_hits": 1,
            "misses": 0,
            "p50_ms": 50,
            "p95_ms": 50,
            "p99_ms": 50,
            "cost_usd": "0.0000000000",
            "saved_usd": "0.5000000000",
            "spend_today_usd": "0.0000000000",
        }
        assert expected_a in published and expected_b in published

        assert receive(owner) == expected_a
        assert receive(viewer) == {
            k: v for k, v in expected_a.items() if k not in ("cost_usd", "saved_usd", "spend_today_usd")
        }
        assert receive(outsider) == expected_b

        breaker_force(deployment=deployment, state="open", actor=t.superuser, reason="ws test")
        later = timezone.now()
        live_publish(now=later)
        # Had anything else reached them (B's summary, the transition), it would come first.
        assert receive(owner) == {**expected_a, "at": later.isoformat()}
        assert receive(outsider) == {**expected_b, "at": later.isoformat()}

        seen = []
        while not any(event["type"] == "circuit.transition" for event in seen):
            seen.append(receive(operator))
        transition = seen[-1]
        assert {k: v for k, v in transition.items() if k != "at"} == {
            "type": "circuit.transition",
            "deployment": provider,
            "provider": provider,
            "from": "closed",
            "to": "forced_open",
            "reason": "ws test",
            "actor": t.superuser.get_username(),
        }
        assert expected_a in seen and expected_b in seen  # operators get every tenant's summaries
