"""The console's websocket (/ws/console/): live dashboard summaries and circuit breaker transitions.

Authenticated with the Django session (channels.auth in sentinel.asgi). A socket without a signed-in
staff user is refused before the handshake completes. A member joins the groups of the tenants they
belong to and gets those tenants' summaries, without money where their role does not include spend;
superusers (operators) get every tenant's summaries and the breakers' transitions.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from gateway.upstream.breakers import CIRCUITS_GROUP
from sentinel.console.live import OPERATORS_GROUP, tenant_group, without_money
from tenants.models import Membership
from tenants.selectors import SEE_SPEND


def _memberships(user) -> dict[int, str]:
    return dict(Membership.objects.filter(user=user).values_list("tenant_id", "role"))


# uvicorn's error for a message sent on a socket whose handshake it did not complete.
_DROPPED_ACCEPT = "Expected ASGI message 'websocket.accept'"


class ConsoleConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active or not user.is_staff:
            await self.close()  # before accept: the server answers the handshake with 403
            return
        self.operator = user.is_superuser
        roles = {} if self.operator else await database_sync_to_async(_memberships)(user)
        self.tenants = set(roles)
        self.spend_tenants = {tenant_id for tenant_id, role in roles.items() if role in SEE_SPEND}
        self.joined = [OPERATORS_GROUP, CIRCUITS_GROUP] if self.operator else [tenant_group(t) for t in sorted(roles)]
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        try:
            await self.send_json({"type": "hello", "operator": self.operator, "tenants": sorted(self.tenants)})
        except RuntimeError as error:
            # A client gone during the handshake: uvicorn drops the accept when the connection is
            # already closing but not yet lost, and refuses what is sent after it with this error
            # (logged as "Exception in ASGI application"; seen once in a full CI run). Leave the
            # groups and end quietly, as a disconnect does.
            if _DROPPED_ACCEPT not in str(error):
                raise
            await self.websocket_disconnect({"code": 1006})

    async def disconnect(self, code) -> None:
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        """The socket only listens: anything a client sends, JSON or not, is ignored (decoding it
        would end the socket with an error on the first frame that is not JSON)."""

    async def tenant_summary(self, message: dict) -> None:
        summary = message["summary"]
        if not self.operator and summary["tenant_id"] not in self.tenants:
            return
        if not self.operator and summary["tenant_id"] not in self.spend_tenants:
            summary = without_money(summary)
        await self.send_json(summary)

    async def tenant_summaries(self, message: dict) -> None:
        for summary in message["summaries"]:
            await self.send_json(summary)

    async def circuit_transition(self, message: dict) -> None:
        await self.send_json(message)

    async def circuit_latency(self, message: dict) -> None:
        """Deployments' latency over the last minutes (console.live), sent to the operators' group."""
        await self.send_json(message)

    async def circuit_load(self, message: dict) -> None:
        """Self-hosted deployments' sampled load (gateway.upstream.load), for operators only."""
        await self.send_json(message)
