"""The placement driver's Kafka gateway registry (``PD_GATEWAY_HEARTBEAT``).

The leader keeps which gateways are live (:class:`pd.gateways.GatewayRegistry`, judged by
its clock, not replicated); a follower answers NotLeader, which clients follow.

Side effects: none of its own (it reads :class:`~pd.shell.service.PdService`'s clock).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from estream.net.rpc import Header
from estream.wire.pdmessages import GatewayHeartbeatRequest
from estream.wire.protocol import Opcode
from pd.gateways import GatewayRegistry, gateway_ttl_ms

if TYPE_CHECKING:
    from pd.shell.service import PdService


class GatewayRpc:
    """The ``PD_GATEWAY_HEARTBEAT`` handler of one PD node."""

    def __init__(self, service: PdService) -> None:
        self.service = service
        self.registry = GatewayRegistry()

    def handlers(self) -> dict[Opcode, Callable[[Header], Awaitable[Header]]]:
        return {Opcode.PD_GATEWAY_HEARTBEAT: self._rpc_heartbeat}

    async def _rpc_heartbeat(self, h: Header) -> Header:
        request = GatewayHeartbeatRequest.from_header(h)
        gateway, pool = request.gateway, request.pool
        status = self.service.require_leading("Kafka gateways beat to the leader")
        now = self.service.clock_ms()
        self.registry.lead(status.term, now)
        if request.leave:
            self.registry.leave(gateway)
        else:
            self.registry.beat(gateway, now, pool)
        return {"gateways": self.registry.live(now, pool),
                "settled": self.registry.settled(now),
                "ttl_ms": gateway_ttl_ms}
