"""The PD leader's reclaimer: tells range servers to drop replicas nothing can read.

Every ``limits.reclaim_interval_ms``, while this node is the Raft leader, it asks each
live range server for its replicas (``LIST_RANGES`` compact: every replica's key, the
sealed and damaged ones with their state; each listing complete), decides with
:func:`pd.reclaim.droppable` which belong to deleted streams, to ranges trimmed away, or
to ranges repair moved elsewhere (those confirmed over two rounds), and sends
``DROP_RANGE`` for each (at most ``limits.reclaim_drops_per_round_max`` a round). The
server logs the drop and deletes the log segments nothing else needs
(``rangeserver/retention.py``), so deleting or trimming a stream frees disk space on
every server that held it. A server that does not answer is tried again next round; a
drop is idempotent.

Each listing also tells repair which replicas are sealed, and where
(:class:`~pd.repair.SealedReports`): one sealed whole at an end other than the catalog's
is seen here (and in heartbeats, a window at a time); and which replicas the server does
not have at all (:class:`~pd.replicareports.ServerListing`: "absent", copied in place),
among the ranges the catalog had sealed when the round began (their replicas were made
before their seal; a range not sealed yet may be made after the listing, and the one a
writer's close placed is made only when the next writer opens the stream: it is not
judged by this listing).
Requests name the server they are meant for (``"server_id"``): a server with another
identity at that address answers WrongServer, and nothing is dropped there.

The backlog gauge (``estream_reclaim_backlog_replicas``) counts the replicas found
droppable but not dropped yet: past a round's budget, busy, or "moved" and waiting for the
next round to confirm. A server not listed in a round (budget spent, down) keeps its last
figure; a server gone from the catalog, or this node no longer leading, counts none.

``busy`` is shared with the :class:`~pd.shell.repairer.Repairer` (and the writer-lease
:class:`~pd.shell.recoverer.Recoverer`): the ranges one of them is working on. A repair does
not start on a range being dropped, and a moved replica is not dropped while its range
is being repaired; both check and mark it without an ``await``
in between, so the two never interleave on one range.

Side effects: network (range servers through a :class:`ConnectionPool`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.wire import limits
from estream.wire.errors import EstreamError
from estream.wire.rangeanswers import RangeKey
from pd.reclaim import Drop, Suspects, confirmed, droppable
from pd.replicareports import SealedBefore, ServerListing, parse_listing
from pd.shell.rounds import leader_rounds
from pd.shell.service import PdService

log = logging.getLogger(__name__)

rpc_timeout_s: Final = 10.0
drops_at_once_max: Final = 16  # DROP_RANGE calls to one server side by side
DROPS_TOTAL = "estream_replicas_dropped_total"
DROPS_HELP = (
    "Replicas dropped on range servers by the reclaimer, by reason (deleted, trimmed, moved)."
)
BACKLOG = "estream_reclaim_backlog_replicas"
BACKLOG_HELP = (
    "Replicas on range servers that nothing reads and the reclaimer has not dropped yet "
    "(as of its last listing of each server; the leader's figure, 0 on followers)."
)


class Reclaimer:
    """Runs reclaim rounds on the PD leader (see the module docstring)."""

    def __init__(
        self,
        service: PdService,
        *,
        interval_ms: int = limits.reclaim_interval_ms,
        drops_max: int = limits.reclaim_drops_per_round_max,
        busy: set[RangeKey] | None = None,
        pool: ConnectionPool | None = None,
    ) -> None:
        """``pool``: how range servers are reached (a PD node's: its certificate, token and
        the proof of the cluster secret, which DROP_RANGE and LIST_RANGES need)."""
        self.service = service
        self.interval_ms = interval_ms
        self.drops_max = drops_max
        self.busy: set[RangeKey] = set() if busy is None else busy
        self.suspects: Suspects = {}  # the last round's "moved" replicas, not dropped yet
        self.suspects_term = -1  # the Raft term they were suspected in
        self.backlog: dict[str, int] = {}  # server id -> droppable replicas left there
        self.pool = ConnectionPool() if pool is None else pool
        self.client = RangeClient(self.pool, timeout_s=rpc_timeout_s)

    async def run(self) -> None:
        """Forever (until cancelled): a round every ``interval_ms`` while leader."""
        try:
            await leader_rounds(
                self.service, self.interval_ms, self.round, name="reclaim",
                on_follower=self._forget_suspects,  # a new leader confirms its own
            )
        finally:
            await self.pool.close()

    def _forget_suspects(self) -> None:
        self.suspects = {}
        self.backlog = {}
        self._publish_backlog()

    def _publish_backlog(self) -> None:
        """Set the backlog gauge from ``backlog``, leaving out servers no longer known."""
        known = self.service.view().servers
        self.backlog = {sid: n for sid, n in self.backlog.items() if sid in known}
        self.service.metrics.set_gauge(BACKLOG, BACKLOG_HELP, sum(self.backlog.values()))

    async def round(self) -> int:
        """One pass over the live servers; returns how many replicas were dropped."""
        now = self.service.clock_ms()
        budget = self.drops_max
        dropped = 0
        suspects: dict[tuple[str, int, int], tuple[str, ...]] = {}
        term = self.service.raft.status().term
        if term != self.suspects_term or not self.service.raft.caught_up():
            self.suspects = {}  # another leadership since, or catalog not applied yet
        self.suspects_term = term
        # What this round's listings can judge: the ranges the catalog has sealed before
        # any of them is asked for (their replicas made before the seal). One not sealed
        # yet may be made after a listing (a range placed by a writer's close is made by
        # the next writer, any time later), and is never taken for an absent replica.
        # Found stream by stream when repair asks, in this moment's persistent maps: not
        # a dict of every stream each round (issue 27: 13-19 ms at 100,000 streams).
        sealed_before = SealedBefore.at(self.service.view().streams,
                                        self.service.streams_by_id)
        for server in self.service.view().servers.values():
            if budget <= 0 or not self.service.liveness.alive(server.id, now):
                continue
            try:
                asked_ms = self.service.clock_ms()
                # Compact: an open sound replica comes as its key alone (10,000 a server
                # here every round: issue 27); the sealed ones whole. Only the sealed
                # ones are remembered (a complete listing forgets the others).
                listing = await self.client.list_replicas(server.address, server_id=server.id)
                sealed = parse_listing([entry for entry in listing.ranges if entry.state.sealed])
                self.service.sealed_reports.observe(server.id, sealed, complete=True)
                keys = listing.keys
                self.service.listings[server.id] = ServerListing(asked_ms, frozenset(keys),
                                                                  sealed_before)
                view = self.service.view()  # after the listing: what the catalog says now
                streams = self.service.streams_by_id  # (followed from the catalog's changes)
                streams.follow(view.streams.values())
                drops, suspected = confirmed(server.id, droppable(
                    keys, streams.by_id, view.next_stream_id, server.id, self.busy,
                ), self.suspects)
                suspects.update(suspected)
                left = len(drops) + len(suspected)
                todo = drops[:budget]
                budget -= len(todo)
                for at in range(0, len(todo), drops_at_once_max):
                    done = sum(await asyncio.gather(*(
                        self._drop(server.address, server.id, drop)
                        for drop in todo[at:at + drops_at_once_max])))
                    dropped += done
                    left -= done
                self.backlog[server.id] = left
            except EstreamError as exc:
                log.warning("reclaiming on range server %s failed: %s", server.id, exc)
                self.pool.discard(server.address)
        self.suspects = suspects
        self._publish_backlog()
        return dropped

    def _still_moved(self, drop: Drop) -> bool:
        """A moved replica is still not in its range's placement (checked again right
        before the drop: earlier drops of the round awaited)."""
        stream = self.service.view().streams.get(drop.name)
        if stream is not None and stream.id != drop.stream_id:
            stream = None  # (deleted and created again: nothing of the old one is placed)
        held = None if stream is None else stream.range_at(drop.range_index)
        return held is not None and tuple(ref.id for ref in held.replicas) == drop.placement

    async def _drop(self, address: str, server_id: str, drop: Drop) -> int:
        """Drop one replica; returns 1, or 0 when it was left alone after all."""
        key = (drop.stream_id, drop.range_index)
        if key in self.busy or (drop.reason == "moved" and not self._still_moved(drop)):
            return 0
        self.busy.add(key)
        try:
            await self.client.drop_range(address, server_id=server_id,
                                         stream_id=drop.stream_id, range_index=drop.range_index)
        finally:
            self.busy.discard(key)
        self.service.metrics.count(DROPS_TOTAL, DROPS_HELP, reason=drop.reason)
        log.info("dropped replica of range %d of stream %d (%s) on %s",
                 drop.range_index, drop.stream_id, drop.reason, address)
        return 1
