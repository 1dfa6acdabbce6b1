"""The range server's storage: replicas, their index and cache, over the write-ahead log.

:class:`Store` runs the pure decisions of ``rangeserver/replica.py`` and carries out their
effects: log entries (``shell/wal.py``), index and cache updates, waking long polls, typed
errors; every entry that changes what a replica answers is durable before the request is
answered. At start it recovers (checkpoint, then the log after it: ``rangeserver/replay.py``);
a drop logs DROP and the next checkpoint deletes what nothing needs
(``rangeserver/retention.py``); when the log cuts back (a resource ran out) each entry cut
off undoes its effect. Reads: ``shell/storereads.py``. The append path and the reasons:
docs/ARCHITECTURE.md 2.1.

Side effects: through the log port (``shell/logport.py``: :class:`~rangeserver.shell.wal.Wal`,
or the one given) and ``shell/checkpoint.py``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

from estream.net.clock import SYSTEM_CLOCK, Clock
from estream.wire import limits
from estream.wire.errors import (
    EstreamError,
    RangeNotFound,
    StreamNotFound,
)
from estream.wire.rangeanswers import RangeKey
from estream.wire.record import (
    BatchHeader,
)
from rangeserver import pacing, retention
from rangeserver import replica as rp
from rangeserver import walformat as wf
from rangeserver.index import BatchCache, Location, RangeIndex
from rangeserver.listing import ReplicaKeys, list_ranges_replicas_default, page_entries
from rangeserver.refusals import create_refusal, indexed_seal_refusal
from rangeserver.replay import Replay
from rangeserver.replica import ReplicaState, readable_end
from rangeserver.retention import Span, extend_span
from rangeserver.shell import checkpoint as ckpt
from rangeserver.shell.logport import LogPort
from rangeserver.shell.storeappends import StoreAppends
from rangeserver.shell.storedrops import StoreDrops
from rangeserver.shell.storereads import StoreReads
from rangeserver.shell.wal import Wal
from rangeserver.stripedreplica import decide_indexed_seal
from rangeserver.timeindex import TimeIndex
from rangeserver.tombstones import Tombstones, deleted_stream

log = logging.getLogger(__name__)

disk_watermark_percent_default: Final = 90  # disk use above this: new replicas go elsewhere first


class Store(StoreReads, StoreAppends, StoreDrops):
    def __init__(
        self,
        data_dir: Path,
        *,
        segment_bytes_max: int = limits.segment_bytes_max,
        cache_bytes_max: int = limits.cache_bytes_max,
        wal_spares: int = 0,
        wal_io: str = "auto",
        disk_bytes_per_s_max: int | None = None,
        disk_watermark_percent: int = disk_watermark_percent_default,
        log: LogPort | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``log``: the write-ahead log (the simulator's); None: a :class:`Wal` in
        ``data_dir/wal`` with ``segment_bytes_max``, ``wal_*``, ``disk_bytes_per_s_max``."""
        self.data_dir = data_dir
        self.clock = clock
        self.disk_watermark_percent = disk_watermark_percent
        self.append_delay_ms = 0  # appends answered this much later (rangeserver/pacing.py)
        self.wal: LogPort = log if log is not None else Wal(
            data_dir / "wal", segment_bytes_max=segment_bytes_max, spares=wal_spares, io=wal_io,
            disk_bytes_per_s_max=disk_bytes_per_s_max)
        self.cache = BatchCache(cache_bytes_max)
        self.replicas: dict[RangeKey, ReplicaState] = {}
        self.keys = ReplicaKeys()  # the replicas' keys in order (LIST_RANGES pages)
        self.tombstones = Tombstones()  # deleted streams' ids: refused (DROP_STREAM)
        self.indexes: dict[RangeKey, RangeIndex] = {}
        self.time_indexes: dict[RangeKey, TimeIndex] = {}  # rangeserver/timeindex.py
        self.spans: dict[RangeKey, Span] = {}  # the log segments holding each replica's entries
        self.dropped: list[Span] = []  # dropped replicas' spans whose DROP entry is on disk
        self._events: dict[RangeKey, asyncio.Event] = {}
        self._checkpointed_at: tuple[int, int] = (-1, -1)
        self._reclaimer: asyncio.Task[None] | None = None
        self._checkpointing = asyncio.Lock()
        self._reclaim_again = False
        self._relog: list[wf.Control] = []  # DROP, DAMAGED entries the log cut back
        self.wal.on_resumed = self._resumed
        self.recovery_report: list[str] = []
        # When each replica last took an APPEND or CONFIRM, and of which epoch (monotonic
        # ms; in memory: DESCRIBE_RANGE's "seen_ms", PD's sign of a live writer).
        self.seen: dict[RangeKey, tuple[int, int]] = {}
        # Confirm offsets raised by a hint (CONFIRM durable=False) and maybe not logged: a
        # durable CONFIRM of such a replica logs its entry even if it raises nothing.
        self._hinted: dict[RangeKey, int] = {}

    # ---------------------------------------------------------------------- lifecycle

    async def open(self) -> None:
        """Recover replicas and index (checkpoint + log scan, ``rangeserver/replay.py``),
        carry out the cuts it decides, then start the log."""
        found = await ckpt.load(self.data_dir)
        segments = self.wal.segments()
        if found is not None and not self._checkpoint_fits(found, segments):
            log.warning("checkpoint does not match the log; scanning the whole log")
            found = None
        if found is not None:
            replay = Replay(found.replicas, found.indexes, found.spans, found.dropped,
                            found.time_indexes)
            first, position = found.segment, found.position
            self._checkpointed_at = (found.segment, found.position)
        else:
            replay = Replay()
            first, position = (segments[0] if segments else 0), 0
        tail = (first, position)
        for segment in [s for s in segments if s >= first]:
            start = position if segment == first else 0
            size = self.wal.segment_size(segment)
            if start > size:
                raise EstreamError(f"checkpoint position {start} is past segment {segment}'s end")
            data = self.wal.read_segment(segment, start)
            end, cut = replay.segment(segment, start, data, size, last=segment == segments[-1])
            if cut is not None:
                # The DAMAGED marks go where the cut is, before it: never a moment when
                # neither the damaged entry nor the mark is in the file.
                self.wal.truncate(segment, cut.position, cut.marks)
            tail = (segment, end)
        replay.finish()
        self.replicas, self.indexes = replay.replicas, replay.indexes
        self.keys = ReplicaKeys(self.replicas)
        self.time_indexes = replay.time_indexes
        self.spans, self.dropped = replay.spans, replay.dropped
        for message in replay.report:
            self._report(message)
        self.wal.start(asyncio.get_running_loop(), *tail)

    def _checkpoint_fits(self, found: ckpt.Checkpoint, segments: list[int]) -> bool:
        if not segments:
            return found.segment == 0 and found.position == 0
        return found.segment in segments and self.wal.segment_size(found.segment) >= found.position

    def _report(self, message: str) -> None:
        log.warning("%s", message)
        self.recovery_report.append(message)

    async def close(self) -> None:
        """Sync, write a checkpoint, stop the log."""
        if self._reclaimer is not None:
            self._reclaimer.cancel()
            await asyncio.gather(self._reclaimer, return_exceptions=True)
        try:
            await self.checkpoint()
        except EstreamError as exc:
            log.error("no checkpoint at shutdown: %s", exc.message)
        await self.wal.close()

    async def checkpoint(self) -> bool:
        """Write a checkpoint if the log moved since the last one, then delete the log
        segments nothing needs any more; True if written."""
        async with self._checkpointing:  # the periodic one and a drop's may meet
            return await self._checkpoint()

    async def _checkpoint(self) -> bool:
        at = (self.wal.segment, self.wal.position)
        if at == self._checkpointed_at:
            return False
        snapshot = ckpt.Checkpoint(
            at[0], at[1], dict(self.replicas), {}, dict(self.spans), list(self.dropped)
        )
        data = ckpt.encode(replace(snapshot, indexes=self.indexes,
                                   time_indexes=self.time_indexes))  # copies the arrays now
        await self.wal.force()  # everything before ``at`` is durable before the file says so
        await ckpt.save(self.data_dir, data)
        self._checkpointed_at = at
        await self._reclaim(snapshot.spans.values())
        return True

    async def _reclaim(self, saved: Iterable[Span]) -> None:
        """Delete the segments no live replica and no needed DROP entry is in
        (``rangeserver/retention.py``); only before the checkpoint just saved. A span
        the saved checkpoint holds counts as live too: a replica carried forward since
        its snapshot (``shell/carrier.py``) is found where that checkpoint's index says."""
        segments = self.wal.segments()
        keep_from = min(self.wal.segment, self._checkpointed_at[0])
        live = [*self.spans.values(), *saved]
        doomed = retention.reclaimable(segments, keep_from, live, self.dropped)
        if not doomed:
            return
        freed = await self.wal.delete_segments(doomed)
        # Listed again: the log may have rolled, and replicas been dropped, meanwhile.
        self.dropped = retention.still_needed(self.dropped, self.wal.segments())
        log.info("deleted %d log segments of dropped replicas (%d bytes)", len(doomed), freed)

    # ------------------------------------------------------------------- state helpers

    def _get(self, stream_id: int, range_index: int) -> ReplicaState:
        state = self.replicas.get((stream_id, range_index))
        if state is None:
            raise self._missing((stream_id, range_index))
        return state

    def _missing(self, key: RangeKey) -> RangeNotFound | StreamNotFound:
        """What a request for a replica not held is answered: ``StreamNotFound`` when its
        stream was deleted (``rangeserver/tombstones.py``), else ``RangeNotFound``."""
        if self.tombstones.holds(key[0], self.clock.monotonic_ms()):
            return deleted_stream(key[0])
        return RangeNotFound(f"no replica of range {key[1]} of stream {key[0]}",
                             stream_id=key[0], range_index=key[1])

    def _set(self, key: RangeKey, new: ReplicaState) -> None:
        event = self._events.get(key)
        old = self.replicas[key] if event is not None else new
        self.replicas[key] = new
        if event is not None and (
            readable_end(old, unconfirmed=True) != readable_end(new, unconfirmed=True)
            or readable_end(old) != readable_end(new)
            or old.sealed != new.sealed
            or old.damaged != new.damaged
        ):
            del self._events[key]
            event.set()

    def _on_durable(self, key: RangeKey, end: int, index: int = -1) -> None:
        state = self.replicas.get(key)
        if state is not None:  # else dropped meanwhile
            self._set(key, rp.on_durable(state, end, index))

    def _forget(self, key: RangeKey, segment: int) -> None:
        """A replica dropped by a DROP entry in ``segment``: its span becomes a dropped
        span, and long polls on it wake (to find it gone)."""
        span = self.spans.pop(key, None)
        first = span.first if span is not None else segment
        self.replicas.pop(key, None)
        self.seen.pop(key, None)
        self._hinted.pop(key, None)
        self.keys.discard(key)
        self.indexes.pop(key, None)
        self.time_indexes.pop(key, None)
        self.cache.drop_range(*key)
        self.dropped.append(Span(first, segment))
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    async def _mark_damaged(self, key: RangeKey) -> None:
        """A read found the replica's stored data damaged: it serves no more reads and
        never counts as a copy again, also after a restart (a DAMAGED entry, durable
        before this returns: the checkpoint may already cover the damaged bytes, and
        recovery would not scan them again)."""
        state = self.replicas.get(key)
        if state is None or state.damaged:
            return
        self._set(key, rp.mark_damaged(state))
        self.cache.drop_range(*key)
        try:
            await self._log_control(wf.DamageMarked(*key))
        except EstreamError as exc:
            log.error("replica %s: the damage mark was not logged: %s", key, exc.message)

    # ------------------------------------------------------------------------- append

    async def append(self, batch: bytes, *, deferred: bool = False) -> int:
        """Store one record batch; returns the durable (deferred: written) end after it."""
        pending, answer = self.begin_append(batch, deferred=deferred)
        if pending is not None:
            await pending
        return answer()

    def begin_append(
        self, batch: bytes, *, deferred: bool = False, index: int | None = None,
    ) -> tuple[asyncio.Future[None] | None, Callable[[], int]]:
        """:meth:`append` without a coroutine (the server's quick path): decide and queue
        the log entry now; returns the future to wait for (None: nothing to wait for) and
        what gives the end to answer once it is done. ``index``: a striped range's."""
        header, key, outcome = self._decide(batch, None, index)
        if isinstance(outcome, rp.Accept):
            pending: asyncio.Future[None] | None = self._accept(
                key, header, batch, outcome.state, deferred
            )
        else:
            pending = None if outcome.durable else self.wal.barrier(sync=not deferred)
        if deferred:
            end = header.end_offset
            return pending, lambda: end
        return pending, lambda: self._get(*key).end

    def _accept(
        self, key: RangeKey, header: BatchHeader, batch: bytes, new: ReplicaState, deferred: bool
    ) -> asyncio.Future[None]:
        end, base, before = header.end_offset, header.base_offset, self.replicas[key]
        index = new.chain_written if new.stripe is not None else -1  # its BATCH_INDEX first
        parts = (wf.batch_entry_header(batch), batch) if index < 0 else (
            wf.encode_control(wf.BatchIndexed(*key, index)), wf.batch_entry_header(batch), batch)
        location, done = self.wal.append(
            parts, sum(map(len, parts)), sync=not deferred,
            on_durable=lambda: self._on_durable(key, end, index),
            on_failed=lambda: self._unappend(key, before, base),
        )
        skip = sum(map(len, parts[:-1]))
        body = Location(location.segment, location.position + skip, len(batch))
        self.indexes[key].add(header.base_offset, end, body)
        self.time_indexes[key].observe(end, header.first_timestamp, header.max_timestamp,
                                       len(batch))
        extend_span(self.spans, key, location.segment)
        self.cache.put((key[0], key[1], header.base_offset), batch)
        self._set(key, new)
        return done

    # ------------------------------------------------------------- create, seal, confirm

    async def create_range(
        self, stream_id: int, range_index: int, start: int, epoch: int,
        digest: int | None = None, stripe: tuple[int, int, int] | None = None,
    ) -> ReplicaState:
        """CREATE_RANGE (``rangeserver.replica.decide_create``); ``digest``: the stream's,
        recorded in the replica's CREATE_RANGE entry (APPEND then takes batches of that
        digest only); None records none (any digest accepted, as before digests were).
        ``stripe``: a striped replica's (ensemble, replicas, position), recorded likewise."""
        key = (stream_id, range_index)
        if self.tombstones.holds(stream_id, self.clock.monotonic_ms()):
            raise deleted_stream(stream_id)  # (a repair's or a fence's, late): never again
        outcome = rp.decide_create(
            self.replicas.get(key), stream_id, range_index, start, epoch, digest, stripe)
        before = self.replicas.get(key)
        if isinstance(outcome, rp.Create):
            self.wal.check_room()  # no new replica while a resource is short
            self.replicas[key] = outcome.state
            self.keys.add(key)
            self.indexes[key] = RangeIndex()
            self.time_indexes[key] = TimeIndex()
            await self._log_control(
                wf.CreateRange(stream_id, range_index, start, epoch, digest, stripe))
        elif isinstance(outcome, rp.Exists):
            self._set(key, outcome.state)
            if outcome.log:
                await self._log_control(wf.EpochRaised(stream_id, range_index, epoch), before)
            else:
                await self.wal.barrier()  # its CREATE_RANGE entry may still be in flight
        else:
            raise create_refusal(key, outcome)
        return self._get(*key)

    def _log_control(
        self, control: wf.Control, before: ReplicaState | None = None
    ) -> asyncio.Future[None]:
        """Queue a control entry (its replica's span grows to cover it); returns the
        future of its fdatasync. ``before``: the replica's state before the change the
        entry records (what a cut back restores)."""
        entry = wf.encode_control(control)
        key = (control.stream_id, control.range_index)
        undo: Callable[[], None] | None = None
        if isinstance(control, wf.CreateRange):
            undo = lambda: self._uncreate(key)  # noqa: E731
        elif isinstance(control, wf.Dropped | wf.DamageMarked):
            undo = lambda: self._relog.append(control)  # noqa: E731  # logged again
        elif before is not None:
            undo = lambda: self._restore(key, before)  # noqa: E731
        location, done = self.wal.append((entry,), len(entry), on_failed=undo, control=True)
        if isinstance(control, wf.Dropped):
            self._forget(key, location.segment)
        else:
            extend_span(self.spans, key, location.segment)
        return done

    # ------------------------------------------------------------- undone by a cut back

    def _unappend(self, key: RangeKey, before: ReplicaState, base: int) -> None:
        """A batch's log entry was cut back: the replica holds what it held before."""
        if key in self.replicas:
            self._restore(key, before)
            self.indexes[key].truncate(base)
            self.cache.drop_range(*key)

    def _restore(self, key: RangeKey, before: ReplicaState) -> None:
        """The replica's state before an entry the log cut back, with the durable end it
        reached since (only entries before the cut became durable)."""
        current = self.replicas.get(key)
        if current is not None:
            self._set(key, replace(before, end=max(before.end, current.end),
                                   chain_durable=max(before.chain_durable, current.chain_durable)))

    def _uncreate(self, key: RangeKey) -> None:
        """A CREATE_RANGE entry was cut back: the replica never existed."""
        for table in (self.replicas, self.indexes, self.time_indexes, self.spans):
            table.pop(key, None)
        self.cache.drop_range(*key)
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def _resumed(self) -> None:
        """The log took a new writer after a cut back: log the DROP and DAMAGED entries
        it cut off again (their replicas stay dropped, damaged), and let a checkpoint
        delete what dropped replicas leave."""
        relog, self._relog = self._relog, []
        for control in relog:
            if isinstance(control, wf.DamageMarked) and (
                    (control.stream_id, control.range_index) not in self.replicas):
                continue  # dropped since: nothing to mark
            try:
                done = self._log_control(control)
            except EstreamError as exc:
                log.error("%s was not logged again: %s", control, exc.message)
            else:  # if cut back again, logged again at the next resume (its undo)
                done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._schedule_reclaim()

    async def seal(
        self, stream_id: int, range_index: int, epoch: int, end: int | None,
        batches: int | None = None,
    ) -> tuple[int, bool]:
        """Fence (``end`` None) or seal (a striped replica's: with the range's ``batches``;
        ``decide_indexed_seal``); answers ``(end, sealed)``."""
        key = (stream_id, range_index)
        before = self._get(*key)
        outcome = decide_indexed_seal(before, epoch, end, batches)
        if isinstance(outcome, rp.Fence):
            self._set(key, outcome.state)
            if outcome.log:
                await self._log_control(wf.EpochRaised(stream_id, range_index, epoch), before)
            else:
                await self.wal.barrier()
            return self._get(*key).end, False
        if isinstance(outcome, rp.SealNow):
            self._set(key, outcome.state)
            state = outcome.state
            await self._log_control(wf.Sealed(stream_id, range_index, state.epoch,
                                              state.sealed_end, state.sealed_batches), before)
            return state.sealed_end, True
        if isinstance(outcome, rp.AlreadySealed):
            await self.wal.barrier()  # the SEAL entry may still be in flight
            return outcome.end, True
        raise indexed_seal_refusal(key, outcome)

    async def confirm(self, stream_id: int, range_index: int, epoch: int, confirm: int) -> None:
        """Move the confirm offset forward; returns once it is durable (a CONFIRM entry
        when this raised it; else a barrier: one that did may still be in flight), so an
        idle or closed writer's last confirm survives a crash of this server."""
        await self.begin_confirm(stream_id, range_index, epoch, confirm)

    def hint_confirm(self, stream_id: int, range_index: int, epoch: int, confirm: int) -> None:
        """A confirm hint (CONFIRM ``durable=False``, ``estream/core/confirmhint.py``):
        decided as a CONFIRM, raised in memory only (the replica's long polls answer at
        once), nothing logged; the writer's durable CONFIRM or next batch logs it."""
        key = (stream_id, range_index)
        state = self._get(*key)
        outcome = rp.decide_confirm(state, epoch, confirm)
        if isinstance(outcome, rp.StaleEpoch):
            raise rp.stale_error(outcome)
        self.seen[key] = (epoch, self.clock.monotonic_ms())
        if outcome.confirm > state.confirm:
            self._hinted[key] = outcome.confirm
            self._set(key, outcome)

    def begin_confirm(
        self, stream_id: int, range_index: int, epoch: int, confirm: int
    ) -> asyncio.Future[None]:
        """:meth:`confirm` without a coroutine: decided and queued now (one confirm of
        :meth:`begin_confirms`); returns the future of its durability."""
        (error,), done = self.begin_confirms([(stream_id, range_index, epoch, confirm)])
        if error is not None:
            raise error
        assert done is not None
        return done

    def begin_confirms(
        self, confirms: Sequence[tuple[int, int, int, int]]
    ) -> tuple[list[EstreamError | None], asyncio.Future[None] | None]:
        """Confirms ``(stream_id, range_index, epoch, confirm)`` (APPEND_MANY's), each
        decided as a CONFIRM of its own, queued now as **one** log write: the CONFIRM
        entries of those that raise a confirm offset back to back (each entry as a lone
        CONFIRM writes it), or a barrier when none does. Returns each one's refusal (None:
        taken) and the one future of their durability (None: every one refused)."""
        errors: list[EstreamError | None] = []
        raised: list[tuple[RangeKey, ReplicaState]] = []  # (key, state before) per raising entry
        logged: list[RangeKey] = []  # every entry's replica
        entries: list[bytes] = []
        now_ms = self.clock.monotonic_ms()  # one request, one moment (``seen``)
        for stream_id, range_index, epoch, confirm in confirms:
            key = (stream_id, range_index)
            state = self.replicas.get(key)
            if state is None:
                errors.append(self._missing(key))
                continue
            outcome = rp.decide_confirm(state, epoch, confirm)
            if isinstance(outcome, rp.StaleEpoch):
                errors.append(rp.stale_error(outcome))
                continue
            self.seen[key] = (epoch, now_ms)
            errors.append(None)
            hinted = self._hinted.get(key)
            if outcome.confirm > state.confirm or hinted is not None:
                if outcome.confirm > state.confirm:
                    self._set(key, outcome)  # readers may see it now: records acknowledged
                    raised.append((key, state))
                if hinted is not None and confirm >= hinted:
                    del self._hinted[key]  # this entry logs what the hint raised
                logged.append(key)
                entries.append(wf.confirm_entry(stream_id, range_index, epoch, confirm))
        if None not in errors:
            return errors, None
        try:
            if not entries:
                return errors, self.wal.barrier()  # a CONFIRM that raised it may be in flight
            data = b"".join(entries)

            def undo() -> None:  # cut back: each replica as before its entry, newest first
                for key, before in reversed(raised):
                    self._restore(key, before)

            location, done = self.wal.append((data,), len(data), on_failed=undo, control=True)
        except EstreamError as exc:  # the log stopped: nothing was queued
            for key, before in reversed(raised):
                self._restore(key, before)
            return [exc if error is None else error for error in errors], None
        for key in logged:  # each replica's span reaches this segment
            extend_span(self.spans, key, location.segment)
        return errors, done

    def describe(self, stream_id: int, range_index: int) -> dict[str, object]:
        """DESCRIBE_RANGE, with how long ago the replica took a request of its epoch."""
        state = self._get(stream_id, range_index)
        seen = self.seen.get(state.key)
        age = None
        if seen is not None and seen[0] == state.epoch:
            age = max(0, self.clock.monotonic_ms() - seen[1])
        return state.describe(seen_ms=age)

    def list_ranges(
        self, after: RangeKey | None = None, limit: int = list_ranges_replicas_default, *,
        compact: bool = False,
    ) -> tuple[list[object], bool]:
        """A page of the replicas in key order after ``after`` (rangeserver/listing.py),
        each as DESCRIBE_RANGE answers it (``compact``: an open sound one by its key
        alone), and whether more are left."""
        if len(self.keys) != len(self.replicas):  # never expected: rebuild, not mislist
            self.keys = ReplicaKeys(self.replicas)
        keys, more = self.keys.page(after, limit)
        return page_entries(keys, self.replicas, compact=compact), more

    async def force(self) -> None:
        await self.wal.force()

    def load(self) -> dict[str, int | bool | str]:
        """The heartbeat's storage figures: ``above_watermark`` (disk use past
        ``disk_watermark_percent``: PD places new replicas elsewhere first) and
        ``exhausted`` (the resource the log is short of, else "": none placed here;
        ``pd/placement.py``); it also sets ``append_delay_ms`` (``rangeserver/pacing.py``)."""
        try:
            stat = os.statvfs(self.data_dir)
            free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
        except OSError:
            free = total = 0
        above = total > 0 and (total - free) * 100 > self.disk_watermark_percent * total
        self.append_delay_ms = pacing.append_delay_ms(
            used=total - free, total=total, watermark_percent=self.disk_watermark_percent)
        return {"ranges": len(self.replicas), "bytes": self.wal.bytes_total, "free_bytes": free,
                "above_watermark": above, "exhausted": self.wal.exhausted or "",
                "append_delay_ms": self.append_delay_ms}
