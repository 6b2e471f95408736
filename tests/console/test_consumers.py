"""The console's websocket with a real client against a real gateway process: refused without a
session; each member gets their own tenants' live summaries only (without money unless their role
includes spend), and only operators get circuit transitions; sockets stay open while idle, ignore
what clients send, and end without an error in the log."""

from __future__ import annotations

import base64
import json
import os
import socket as raw_socket
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gateway.models import Deployment
from gateway.upstream.breakers import breaker_force
from sentinel.console.live import live_publish
from sentinel.console.selectors import deployment_latency
from tests.billing.conftest import drain_all, hand_off_all, record
from tests.conftest import unique
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


def errors_since(gateway, start: int) -> list[str]:
    return [line for line in gateway.log_lines()[start:] if '"level":"ERROR"' in line]


def a_client_gone_before_the_handshake(gateway, user) -> None:
    """Asks for the socket with a valid session, then leaves before the server accepts it."""
    host, port = gateway.url.removeprefix("http://").split(":")
    session = as_user(user).cookies["sessionid"].value
    with raw_socket.create_connection((host, int(port))) as raw:
        raw.sendall(
            f"GET /ws/console/ HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\nSec-WebSocket-Version: 13\r\n"
            f"Origin: {gateway.url}\r\nCookie: sessionid={session}\r\n\r\n".encode()
        )


def some_traffic(tenant) -> None:
    """A request of the tenant's in the last minute, so that the live publisher has a summary for it."""
    hand_off_all([record(tenant, at=timezone.now() - timedelta(seconds=5), request_id=unique("live"))])
    drain_all()


def test_idle_sockets_stay_open_and_disconnects_log_no_error(gateway, tenancy):
    """A consumer waits for its events in Redis reads that block 5 s (channels_redis); those reads
    used to time out at the same 5 s, which ended every idle socket with "Exception in ASGI
    application" (the browser reconnected, and the next one died the same way). Sockets now stay
    open while idle, and neither a closing handshake, nor a dropped connection, nor a client gone
    before the handshake completed logs anything at ERROR."""
    start = len(gateway.log_lines())
    some_traffic(tenancy.tenant)
    for _ in range(5):
        a_client_gone_before_the_handshake(gateway, tenancy.owner)
    sockets = [socket(gateway, tenancy.owner), socket(gateway, tenancy.viewer), socket(gateway, tenancy.owner)]
    for ws in sockets:
        assert receive(ws)["type"] == "hello"

    time.sleep(12)  # idle across two of the channel layer's blocking reads
    live_publish(now=timezone.now())
    for ws in sockets:
        assert receive(ws)["tenant_id"] == tenancy.tenant.pk  # still open, still hearing its tenant

    sockets[0].close()
    sockets[1].close(code=1001)  # a browser leaving the page
    sockets[2].socket.close()  # gone without a closing handshake
    time.sleep(1.0)
    assert errors_since(gateway, start) == []


def test_whatever_a_client_sends_is_ignored(gateway, tenancy):
    start = len(gateway.log_lines())
    some_traffic(tenancy.tenant)
    with socket(gateway, tenancy.owner) as ws:
        assert receive(ws)["type"] == "hello"
        ws.send("not json")
        ws.send(b"\x00\xff binary")
        ws.send('{"type": "circuit.transition", "deployment": "forged"}')
        live_publish(now=timezone.now())
        assert receive(ws)["tenant_id"] == tenancy.tenant.pk  # the socket is still open, and got nothing forged
    time.sleep(0.5)
    assert errors_since(gateway, start) == []


def test_operators_get_each_deployments_latency_and_members_do_not(gateway, tenancy):
    """The circuits page's latency column: every gateway process's answered calls of the last five
    minutes, from the ledger (the balancer's estimates are per process); older calls and failures do
    not count. Pushed to operators with the live figures, never to a tenant's members."""
    t = tenancy
    name = unique("latency-dep")
    now = timezone.now()
    recent = now - timedelta(seconds=30)
    hand_off_all(
        [
            record(t.tenant, at=recent, latency_ms=ms, deployment=name, request_id=unique("lat"))
            for ms in (100, 200, 300, 400)
        ]
        + [
            record(
                t.tenant, at=now - timedelta(minutes=6), latency_ms=5_000, deployment=name, request_id=unique("old")
            ),
            record(
                t.tenant,
                at=recent,
                status=503,
                latency_ms=9_000,
                deployment=name,
                error_code="all_providers_unavailable",
                request_id=unique("failed"),
            ),
        ]
    )
    drain_all()
    expected = "p50 250 ms · p95 385 ms (4 in 5 min)"  # percentile_cont: 300 + 0.85 x 100
    assert deployment_latency(now=now)[name] == expected

    with socket(gateway, t.owner) as owner, socket(gateway, t.superuser) as operator:
        assert receive(owner)["type"] == receive(operator)["type"] == "hello"
        live_publish(now=now)
        seen = [receive(operator)]
        while seen[-1]["type"] != "circuit.latency":
            seen.append(receive(operator))
        assert seen[-1]["latencies"][name] == expected
        owner_got = [receive(owner)]  # its tenant's summary, and nothing of the deployments
        with pytest.raises(TimeoutError):
            owner_got.append(receive(owner, timeout=1.0))
        assert [event["type"] for event in owner_got] == ["tenant.summary"]
