"""The PD leader's reclaimer: tells range servers to drop replicas nothing can read.

Every ``limits.reclaim_interval_ms``, while this node is the Raft leader, it asks each
live range server for its replicas (``LIST_RANGES``), decides with :func:`pd.reclaim.droppable`
which belong to deleted streams or to ranges trimmed away, and sends ``DROP_RANGE`` for
each (at most ``limits.reclaim_drops_per_round_max`` a round). The server logs the drop
and deletes the log segments nothing else needs (``rangeserver/retention.py``), so
deleting or trimming a stream frees disk space on every server that held it. A server
that does not answer is tried again next round; a drop is idempotent.

Side effects: network (range servers through a :class:`ConnectionPool`).
"""

from __future__ import annotations

import logging

from estream import limits
from estream.errors import EstreamError
from estream.protocol import Opcode
from estream.rpc import ConnectionPool
from pd.reclaim import Drop, droppable
from pd.rounds import leader_rounds
from pd.service import PdService

log = logging.getLogger(__name__)

rpc_timeout_s = 10.0
DROPS_TOTAL = "estream_replicas_dropped_total"
DROPS_HELP = "Replicas dropped on range servers by the reclaimer, by reason (deleted, trimmed)."


class Reclaimer:
    """Runs reclaim rounds on the PD leader (see the module docstring)."""

    def __init__(
        self,
        service: PdService,
        *,
        interval_ms: int = limits.reclaim_interval_ms,
        drops_max: int = limits.reclaim_drops_per_round_max,
    ) -> None:
        self.service = service
        self.interval_ms = interval_ms
        self.drops_max = drops_max
        self.pool = ConnectionPool()

    async def run(self) -> None:
        """Forever (until cancelled): a round every ``interval_ms`` while leader."""
        try:
            await leader_rounds(self.service, self.interval_ms, self.round, name="reclaim")
        finally:
            await self.pool.close()

    async def round(self) -> int:
        """One pass over the live servers; returns how many replicas were dropped."""
        view = self.service.view()
        now = self.service.clock_ms()
        budget = self.drops_max
        dropped = 0
        for server in view.servers.values():
            if budget <= 0 or not self.service.liveness.alive(server.id, now):
                continue
            try:
                answer, _ = await self.pool.call(
                    server.address, Opcode.LIST_RANGES, {}, timeout_s=rpc_timeout_s)
                listed = answer.get("ranges")
                drops = droppable(
                    listed if isinstance(listed, list) else [],
                    view.streams.values(), view.next_stream_id,
                )[:budget]
                for drop in drops:
                    await self._drop(server.address, drop)
                    dropped += 1
                    budget -= 1
            except EstreamError as exc:
                log.warning("reclaiming on range server %s failed: %s", server.id, exc)
                self.pool.discard(server.address)
        return dropped

    async def _drop(self, address: str, drop: Drop) -> None:
        header = {"stream_id": drop.stream_id, "range_index": drop.range_index}
        await self.pool.call(address, Opcode.DROP_RANGE, header, timeout_s=rpc_timeout_s)
        self.service.metrics.count(DROPS_TOTAL, DROPS_HELP, reason=drop.reason)
        log.info("dropped replica of range %d of stream %d (%s) on %s",
                 drop.range_index, drop.stream_id, drop.reason, address)
