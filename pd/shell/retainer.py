"""The PD leader's retainer: range statistics, retention trims and cursor lags.

Every ``interval_ms``, while this node is the caught-up Raft leader, one round:

1. **Statistics.** Sealed, non-empty ranges without recorded statistics (at most
   ``stats_per_round_max``, oldest first) get them (:mod:`pd.retention` says what each
   figure means and where it comes from). A range in the object tier: from its object's
   index (:func:`~estream.net.objectindex.read_range_index`, then
   :func:`pd.retention.object_range_stats`), so that a range whose replicas are released,
   or whose replicas' time index is partial, still gets them and never holds retention
   forever. Otherwise (or when its object cannot be read): from one replica's time index
   (``TIME_INDEX`` without a timestamp, :meth:`RangeClient.time_index`, naming the server:
   a wiped server answers ``WrongServer``). Only a sound replica holding the whole range
   counts (its ``end`` at or past the catalog's, not damaged, its index not partial:
   :func:`pd.retention.replica_range_stats`): its maximum is then at least the maximum of
   every readable record, so a lookup that skips a range below it never skips an answer.
   Its timestamps are bounded by this node's wall clock plus ``skew_ms_max``
   (:func:`pd.retention.bound_stats`: a writer's clock far ahead cannot pin the range).
   The result is one ``record_range_stats`` command, applied only while the range is
   still sealed at that end. A range no source could describe is asked again 30 s later,
   so that it never takes the places of the others.
2. **Retention.** Each stream with ``retention_ms``/``retention_bytes`` gets
   :func:`pd.retention.plan_trim` (now = this node's wall clock) and, if it trims, one
   ``trim_stream`` command. Trimmed ranges' replicas are dropped later by the reclaimer.
   ``estream_retention_trimmed_ranges_total{stream}`` counts trimmed ranges and
   ``estream_retention_held_ranges{stream}`` shows those a cursor holds.
3. **Lags.** Each stream with cursors: its readable end (``PdService.readable_end``: one
   DESCRIBE_RANGE per replica of the open range, 1 s) and ``estream_cursor_lag{stream,
   cursor}`` (end minus the cursor's offset) on this node's ``/metrics``.

Double faults: the leader dying mid-round loses nothing: each decision is one Raft
command, committed or not, and the next leader decides again from the catalog (a trim to
an offset already trimmed and stats already recorded are no-ops or skipped). A range
server down or hung: its stats come from another replica (1 s timeout each), or from the
object of a range in the object tier (the store's deadline); its trimmed
replicas are dropped by the reclaimer once it is back. A trim never passes a sealed
range's end, which is at or below the confirmed end, and never a cursor's unread range.

Side effects: network (range servers through a :class:`ConnectionPool`, the object
store's ranged GETs), Raft proposals.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from estream.net.bounded import gather_bounded
from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.net.objectindex import read_range_index
from estream.net.objectstore import ObjectStore
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.wire.errors import Conflict, EstreamError, RangeNotFound, StreamNotFound
from estream.wire.meta import RangeMeta, StreamMeta
from pd.catalog import CatalogView
from pd.commands import RecordRangeStats, TrimStream
from pd.retention import (
    RangeStats,
    bound_stats,
    cursor_lags,
    has_retention,
    needs_stats,
    object_range_stats,
    plan_trim,
    recorded_bytes,
    replica_range_stats,
    stats_due,
    timestamp_skew_ms_max,
)
from pd.shell.rounds import leader_rounds
from pd.shell.service import PdService
from pd.streammemo import Chosen, Narrowing

log = logging.getLogger(__name__)

retention_interval_ms: Final = 1_000
stats_per_round_max: Final = 256
stats_in_flight_max: Final = 32
lag_streams_per_round_max: Final = 256
stats_timeout_s: Final = 1.0
stats_retry_s: Final = 30.0  # a range no replica could describe is asked again after this

TRIMMED_TOTAL: Final = "estream_retention_trimmed_ranges_total"
TRIMMED_HELP: Final = "Whole ranges trimmed by stream retention (retention_ms/_bytes)."
HELD: Final = "estream_retention_held_ranges"
HELD_HELP: Final = ("Ranges past their stream's retention limit kept because a named "
                    "cursor has not read them (PD leader).")
LAG: Final = "estream_cursor_lag"
LAG_HELP: Final = ("Records between a named cursor and its stream's readable end "
                   "(PD leader).")


class Retainer:
    """Runs retainer rounds on the PD leader (module docstring)."""

    def __init__(self, service: PdService, *, interval_ms: int = retention_interval_ms,
                 store: ObjectStore | None = None,
                 skew_ms_max: int = timestamp_skew_ms_max,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.service = service
        self.clock = clock  # the clock port (the simulator's: virtual time)
        self.skew_ms_max = skew_ms_max  # writers' timestamps past now + this are bounded
        self.interval_ms = interval_ms
        self.store = store  # the object tier's, when the cluster has one
        self.pool = ConnectionPool()
        # Ranges no replica could give statistics for, and when to ask again: they must
        # not take every round's places from the others.
        self._retry_at: dict[tuple[int, int], float] = {}
        # The catalog narrowed to ranges without statistics, and each stream's recorded
        # bytes: walked again only for the streams that changed (pd/streammemo.py).
        object_tier = store is not None
        self._stats_work = Narrowing(lambda rng: needs_stats(rng, object_tier))
        self._limited = Chosen(has_retention, recorded_bytes)  # (O(changes) a round)

    def now_ms(self) -> int:
        return self.clock.wall_ms()  # record timestamps are writers' wall clocks

    async def run(self) -> None:
        """Forever (until cancelled): a round every ``interval_ms`` while leader."""
        try:
            await leader_rounds(self.service, self.interval_ms, self.round, name="retention")
        finally:
            await self.pool.close()

    async def round(self) -> None:
        if not self.service.raft.caught_up():
            return  # a new leader still applying the log decides from a stale catalog
        await self.record_stats(self.service.view())
        await self.retain(self.service.view())
        await self.measure_lags(self.service.view())

    # -- 1. statistics -----------------------------------------------------------------
    async def record_stats(self, view: CatalogView) -> int:
        """Record the statistics of ranges that lack them; returns how many."""
        now = self.clock.monotonic_s()
        todo = stats_due(self._stats_work.narrow(view.streams.values()), self._retry_at, now,
                         stats_per_round_max)

        async def one(pair: tuple[StreamMeta, RangeMeta]) -> bool:
            return await self._record_one(*pair)

        done = await gather_bounded(one, todo, stats_in_flight_max)
        for (stream, rng), ok in zip(todo, done, strict=True):
            if not ok:
                self._retry_at[(stream.id, rng.index)] = now + stats_retry_s
        if len(self._retry_at) > 4 * stats_per_round_max:  # forget the long-gone ones
            self._retry_at = {k: t for k, t in self._retry_at.items() if t > now}
        return sum(done)

    def _in_object(self, rng: RangeMeta) -> bool:
        return rng.tier == "object" and rng.object_key is not None and self.store is not None

    async def _record_one(self, stream: StreamMeta, rng: RangeMeta) -> bool:
        stats = await self._from_object(stream, rng) if self._in_object(rng) else None
        if stats is None:
            stats = await self._from_replicas(stream, rng)
        if stats is None or rng.end is None:
            return False
        stats = bound_stats(stats, self.now_ms(), self.skew_ms_max)
        try:
            await self.service.raft.propose(RecordRangeStats(
                stream.name, rng.index, rng.end, stats.min_timestamp, stats.max_timestamp,
                stats.size_bytes, stream.id))
        except (Conflict, RangeNotFound, StreamNotFound):
            return False  # trimmed, deleted or changed meanwhile
        return True

    async def _from_object(self, stream: StreamMeta, rng: RangeMeta) -> RangeStats | None:
        assert self.store is not None and rng.object_key is not None
        try:
            index = await read_range_index(self.store, stream.id, rng)
        except EstreamError as exc:  # missing or damaged: the offloader uploads it again
            log.debug("statistics of range %d of stream %r: its object %s: %s", rng.index,
                      stream.name, rng.object_key, exc)
            return None
        return object_range_stats(index, stream.id, rng)

    async def _from_replicas(self, stream: StreamMeta, rng: RangeMeta) -> RangeStats | None:
        ranges = RangeClient(self.pool, timeout_s=stats_timeout_s)
        for ref in rng.replicas:
            try:
                answer = await ranges.time_index(ref.address, server_id=ref.id,
                                                 stream_id=stream.id, range_index=rng.index)
            except EstreamError:
                continue
            stats = replica_range_stats(answer.min_timestamp, answer.max_timestamp,
                                        answer.bytes, answer.end, rng)
            if stats is not None:
                return stats
            # a partial index, or a replica short of the range: try the next
        return None

    # -- 2. retention ------------------------------------------------------------------
    async def retain(self, view: CatalogView) -> int:
        """Trim every stream its retention allows; returns the ranges trimmed."""
        trimmed = 0
        now = self.now_ms()
        for stream, sealed_bytes in self._limited.over(view.streams.values()):
            plan = plan_trim(stream, view.cursors.get(stream.name, {}), now,
                             sealed_bytes=sealed_bytes)
            self.service.metrics.set_gauge(HELD, HELD_HELP, plan.held, stream=stream.name)
            if plan.start_offset is None:
                continue
            try:
                await self.service.raft.propose(TrimStream(stream.name, plan.start_offset,
                                                                 stream.id))
            except StreamNotFound:
                continue
            log.info("retention trimmed %d ranges of stream %r (start %d -> %d)%s",
                     plan.trimmed, stream.name, stream.start_offset, plan.start_offset,
                     f"; {plan.held} held by cursors" if plan.held else "")
            self.service.metrics.count(TRIMMED_TOTAL, TRIMMED_HELP, plan.trimmed,
                                       stream=stream.name)
            trimmed += plan.trimmed
        return trimmed

    # -- 3. cursor lags ----------------------------------------------------------------
    async def measure_lags(self, view: CatalogView) -> None:
        names = [n for n, c in view.cursors.items() if c and n in view.streams]
        names = names[:lag_streams_per_round_max]
        ends = await asyncio.gather(
            *(self.service.readable_end(view.streams[n]) for n in names),
            return_exceptions=True)
        for name, end in zip(names, ends, strict=True):
            if not isinstance(end, int):
                continue
            for cursor, lag in cursor_lags(end, view.cursors[name]).items():
                self.service.metrics.set_gauge(LAG, LAG_HELP, lag, stream=name, cursor=cursor)
