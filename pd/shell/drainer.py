"""The PD leader's drain loop, and the operator's view of ranges and repairs.

Draining (decisions in :mod:`pd.drain`) needs three movers, two of which exist already:

- sealed ranges: :class:`~pd.shell.repairer.Repairer` plans a replica on a draining server
  as one to move (reason ``"drain"``), copies it to a server that is not draining and
  swaps it out of the range with ``update_replicas`` (compare-and-set);
- the open range of a stream with a live writer: the writer's keepalive answer names the
  draining servers (:meth:`PdService.keepalive_writer`) and the writer rolls away;
- the open range of a stream with no live writer (its lease ran out and its replicas
  did not see it at work, or it never had one): this loop, every ``drain_interval_ms``
  on the caught-up leader, has the :class:`~pd.shell.recoverer.Recoverer` recover it (a
  new epoch, fence, copy, the seal recorded in PD, the next range placed on servers that
  are not draining). A range that
  recovery keeps open because it is empty is sealed at its start here (every replica was
  fenced at PD's epoch holding nothing, so no record can be below it).

Double faults: a leader lost mid-drain leaves the flag in the catalog and the next
leader's rounds go on; a writer opening meanwhile wins (compare-and-set on the epoch;
our seal is then ``Fenced``) and gets the ``leave`` answer itself; the draining server
dying turns its replicas into dead ones for repair; the range is ``busy`` for repair and
reclaim while it is recovered, as in lease recovery.

:meth:`Drainer.ranges_report` is ``GET /v1/ranges``: every range's replica health by
repair's rules (from this node's heartbeats and listings: any node can answer) and the
repair progress of this node (the leader's is the one that runs).

Side effects: network (through the recoverer and PD's Raft).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from estream.net.clock import SYSTEM_CLOCK
from estream.wire.errors import EstreamError, Fenced, RangeSealed
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.rangeanswers import RangeKey
from pd.catalog import CatalogView
from pd.drain import RangeHealth, can_roll, open_ranges_leaving
from pd.repair import Health, ServerState, ShortKey, replica_health
from pd.shell.recoverer import Recoverer
from pd.shell.repairer import Repairer
from pd.shell.rounds import leader_rounds
from pd.shell.service import PdService

log = logging.getLogger(__name__)

drain_interval_ms: Final = 1_000  # how often the leader rolls writer-less open ranges away
report_ranges_max: Final = 10_000  # ranges listed in one GET /v1/ranges answer
report_skipped_ranges_max: Final = 1_000  # ranges repair skips, listed in one answer (the rest
#   counted: with a server down and no spare, every range it held is skipped)


class Drainer:
    """Rolls writer-less open ranges off draining servers; reports range health."""

    def __init__(
        self,
        service: PdService,
        repairer: Repairer,
        recoverer: Recoverer,
        *,
        interval_ms: int = drain_interval_ms,
        clock_ms: Callable[[], int] = SYSTEM_CLOCK.monotonic_ms,
    ) -> None:
        self.service = service
        self.repairer = repairer
        self.recoverer = recoverer
        self.interval_ms = interval_ms
        self.clock_ms = clock_ms
        self.rolled = 0  # open ranges this node rolled away from draining servers
        self.waiting: set[str] = set()  # streams whose roll cannot be placed (logged once)

    async def run(self) -> None:
        """Forever (until cancelled): a round every ``interval_ms`` while leader."""
        await leader_rounds(self.service, self.interval_ms, self.round, name="drain")

    async def round(self) -> int:
        """Roll away the open ranges without a live writer; returns how many."""
        service = self.service
        if not service.raft.caught_up():
            return 0
        view = service.view()
        if not view.draining:
            self.waiting = set()
            return 0
        rolled = 0
        now = self.clock_ms()
        service.leases.lead(service.raft.status().term, now)
        usable = sum(1 for s in view.servers if s not in view.draining
                     and service.liveness.alive(s, now))
        waiting: set[str] = set()
        for stream in open_ranges_leaving(view.streams.values(), view.draining):
            if not service.leases.expired(stream, self.clock_ms()):
                continue
            if not can_roll(stream, usable):
                waiting.add(stream.name)
                if stream.name not in self.waiting:  # once, not every round
                    log.warning("stream %r: open range on a draining server, not rolled: "
                                "%d servers alive and not draining, the next range needs "
                                "more", stream.name, usable)
                continue
            hidden = await self.recoverer.hidden(stream)  # None: its writer seen at work
            if hidden is not None:
                rolled += await self._roll(stream, hidden)
        self.waiting = waiting
        return rolled

    async def _roll(self, stream: StreamMeta, hidden: bool) -> int:
        last = stream.last_range
        assert last is not None
        # A drain's normal work, once per idle stream (thousands of lines at WARNING):
        log.info("stream %r: open range %d is on a draining server and has no live "
                 "writer: PD rolls it", stream.name, last.index)
        result = await self.recoverer.recover(stream, hidden=hidden)
        if result is None:
            return 0
        if result.kept:  # empty, fenced at PD's epoch: seal it at its start
            try:
                await self.service.seal_range(stream.name, result.meta.epoch, last.index,
                                              last.start, (), stream.id,
                                              0 if stream.striped else None)
            except (Fenced, RangeSealed) as exc:
                log.info("stream %r: not sealed, a writer came: %s", stream.name, exc)
                return 0
            except EstreamError as exc:
                log.warning("stream %r: sealing empty range %d failed: %s", stream.name,
                            last.index, exc)
                return 0
        self.rolled += 1
        return 1

    # ------------------------------------------------------------------------ report
    def health(self, stream: StreamMeta, rng: RangeMeta, servers: dict[str, ServerState],
               now: int, short_since: Mapping[ShortKey, int]) -> RangeHealth:
        """One range's replicas by repair's rules (an open range: alive or not)."""
        rows: list[tuple[str, str]] = []
        reasons: dict[str, str] = {}
        for ref in rng.replicas:
            server = servers.get(ref.id)
            if rng.sealed:
                health, reason = replica_health(
                    ref.id, stream.id, rng, servers, short_since, now,
                    self.repairer.repair_after_ms)
            elif server is None or not server.alive:
                dead = server is None or server.silent_ms >= self.repairer.repair_after_ms
                health, reason = ((Health.MISSING, "dead") if dead
                                  else (Health.UNAVAILABLE, ""))
            else:
                health, reason = Health.HEALTHY, "drain" if server.draining else ""
            rows.append((ref.id, health.value))
            if reason and reason != "unsealed":
                reasons[ref.id] = reason
        healthy = sum(1 for _, h in rows if h == Health.HEALTHY.value)
        return RangeHealth(stream.name, stream.id, rng, stream.ensemble, healthy,
                           tuple(rows), reasons)

    def _report(self, view: CatalogView, servers: dict[str, ServerState],
                busy: frozenset[RangeKey], short_since: Mapping[ShortKey, int], now: int,
                under_replicated_only: bool) -> tuple[list[dict[str, Any]], int, int]:
        """The listed ranges (at most ``report_ranges_max``), and how many of all are
        under-replicated and moving (in a worker thread: touches only its arguments)."""
        out: list[dict[str, Any]] = []
        under = moving = 0
        for stream in sorted(view.streams.values(), key=lambda s: s.name):
            for rng in stream.ranges:
                item = self.health(stream, rng, servers, now, short_since)
                under += item.under_replicated
                moving += item.moving
                if (under_replicated_only and not item.under_replicated) \
                        or len(out) >= report_ranges_max:
                    continue
                out.append({
                    "stream": stream.name, "stream_id": stream.id, "index": rng.index,
                    "start": rng.start, "end": rng.end, "state": rng.state,
                    "wanted": item.wanted, "healthy": item.healthy,
                    "under_replicated": item.under_replicated, "moving": item.moving,
                    "repairing": (stream.id, rng.index) in busy,
                    "replicas": [{"id": sid, "health": health,
                                  "reason": item.reasons.get(sid)}
                                 for sid, health in item.replicas],
                })
        return out, under, moving

    async def ranges_report(self, under_replicated_only: bool) -> dict[str, Any]:
        """``GET /v1/ranges``: ranges (all, or only the under-replicated ones) and the
        repair progress of this node."""
        now = self.clock_ms()
        view = await self.service.read_view()
        servers = self.repairer.servers()
        busy = frozenset(self.repairer.busy)
        # The totals count every range of the catalog: walked in a worker thread, over
        # this snapshot, so that the event loop goes on serving meanwhile.
        out, under, moving = await asyncio.to_thread(
            self._report, view, servers, busy, dict(self.repairer.short_since), now,
            under_replicated_only)
        plan = self.repairer.last_plan
        return {"ranges": out, "repair": {
            "leader": self.service.raft.status().role == "leader",
            "under_replicated": under,
            "moving": moving,
            "in_progress": len(busy),
            "planned": len(plan.tasks),
            "deferred": plan.deferred,
            "skipped": [{"stream": s.stream, "stream_id": s.stream_id, "index": s.range_index,
                         "reason": s.reason, "replicas": list(s.replicas)}
                        for s in plan.skipped[:report_skipped_ranges_max]],
            "skipped_omitted": max(0, len(plan.skipped) - report_skipped_ranges_max),
            "draining": sorted(view.draining),
            "open_ranges_rolled": self.rolled,
        }}
