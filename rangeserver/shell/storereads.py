"""The range server's reads (READ, TIME_INDEX, TIME_STATS) over its replicas: a mixin of
:class:`~rangeserver.shell.store.Store`. Whole batches from the index (the cache first,
then the log), each verified as read (a mismatch marks the replica damaged, durably);
long polls wait on the replica's event until something is readable, it is sealed, or
the deadline.

Side effects: log reads (the log port, ``rangeserver/shell/logport.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from estream.wire import limits
from estream.wire.errors import (
    ChecksumMismatch,
    EstreamError,
    OffsetOutOfRange,
)
from estream.wire.rangeanswers import RangeKey, ReadAnswer, TimeAnswer
from estream.wire.record import decode_batch, iter_batches, verify_batch
from estream.wire.timestamps import first_at_or_after
from rangeserver import replica as rp
from rangeserver.index import BatchCache, IndexedBatch, RangeIndex
from rangeserver.refusals import indexed_refusal, striped_read_refusal
from rangeserver.replica import ReplicaState, readable_end
from rangeserver.shell.logport import LogPort
from rangeserver.stripedreplica import Elsewhere, IndexMismatch, Serve, plan_striped_read
from rangeserver.timeindex import TimeIndex

log = logging.getLogger("rangeserver.shell.store")  # the store's own log

time_scan_bytes: Final = 1024 * 1024  # batches read at once by a time lookup's scan


class StoreReads:
    """The read side of the store; the store holds the state it reads."""

    replicas: dict[RangeKey, ReplicaState]
    indexes: dict[RangeKey, RangeIndex]
    time_indexes: dict[RangeKey, TimeIndex]
    cache: BatchCache
    wal: LogPort
    _events: dict[RangeKey, asyncio.Event]

    def _get(self, stream_id: int, range_index: int) -> ReplicaState:
        raise NotImplementedError  # the store's

    async def _mark_damaged(self, key: RangeKey) -> None:
        raise NotImplementedError  # the store's

    async def read(
        self,
        stream_id: int,
        range_index: int,
        offset: int,
        *,
        max_bytes: int = limits.read_bytes_max,
        wait_ms: int = 0,
        unconfirmed: bool = False,
        allowance: Callable[[int], Awaitable[int]] | None = None,
    ) -> tuple[int, bool, bytes]:
        """Whole batches from the one holding ``offset`` up to the readable end: answers
        ``(readable end, sealed, payload)``. With ``wait_ms`` and nothing readable at
        ``offset``, waits until something is, the range is sealed, or the deadline.
        ``allowance`` (the connection's answer budget) may lower ``max_bytes`` once there
        is something to answer; at least one batch is always answered."""
        key = (stream_id, range_index)
        state = self._get(*key)
        if offset < state.start:
            raise OffsetOutOfRange(
                f"offset {offset} is below the range start {state.start}",
                offset=offset,
                start=state.start,
                end=readable_end(state, unconfirmed=unconfirmed),
            )
        state, end = await self._readable(key, state, offset, wait_ms, unconfirmed)
        if state.sealed and offset > end:
            raise OffsetOutOfRange(
                f"offset {offset} is past the sealed end {end}",
                offset=offset,
                start=state.start,
                end=end,
            )
        if offset >= end:
            return end, state.sealed, b""
        if allowance is not None:
            max_bytes = await allowance(max_bytes)
            self._get(*key)  # RangeNotFound if dropped meanwhile
        chosen = self.indexes[key].select(offset, end, max(1, max_bytes), partial_last=state.sealed)
        payload = await self._load(key, chosen)
        return end, state.sealed, payload

    async def _readable(self, key: RangeKey, state: ReplicaState, offset: int, wait_ms: int,
                        unconfirmed: bool) -> tuple[ReplicaState, int]:
        """A READ's long poll (nothing readable at ``offset``: wait up to ``wait_ms``),
        then the replica's state and readable end; a damaged replica answers no READ."""
        if wait_ms > 0 and offset >= readable_end(state, unconfirmed=unconfirmed):
            await self._wait(key, offset, unconfirmed, min(wait_ms, limits.read_wait_ms_max))
            state = self._get(*key)
        if state.damaged:
            raise rp.damaged_error(key)
        return state, readable_end(state, unconfirmed=unconfirmed)

    def striped(self, stream_id: int, range_index: int, batch: int | None) -> bool:
        """Whether a READ is :meth:`read_striped`'s: it names a batch, or the replica is
        striped."""
        state = self.replicas.get((stream_id, range_index))
        return batch is not None or (state is not None and state.stripe is not None)

    async def read_striped(
        self, stream_id: int, range_index: int, offset: int, batch: int | None, *,
        max_bytes: int = limits.read_bytes_max, wait_ms: int = 0, unconfirmed: bool = False,
        chain: bool = False,
    ) -> ReadAnswer:
        """READ of a striped replica (``rangeserver/stripedreplica.py``'s
        :func:`plan_striped_read`): by batch index, or by offset (answered where to go on
        when another server holds it); a long poll waits as :meth:`read` does; a batch
        index to an unstriped replica is ``InvalidArgument`` naming ``batch``; ``chain``:
        the chain from the offset on, not one run."""
        key = (stream_id, range_index)
        state = self._get(*key)
        if state.stripe is None:
            raise indexed_refusal(key, IndexMismatch(batch))
        if offset < state.start:
            raise OffsetOutOfRange(f"offset {offset} is below the range start {state.start}",
                                   offset=offset, start=state.start,
                                   end=readable_end(state, unconfirmed=unconfirmed))
        state, end = await self._readable(key, state, offset, wait_ms, unconfirmed)
        plan = plan_striped_read(state, self.indexes[key], offset, batch, end, max(1, max_bytes),
                                 chain=chain)
        if isinstance(plan, Elsewhere):
            return ReadAnswer(end, state.sealed, b"", next=(plan.index, plan.base))
        if not isinstance(plan, Serve):
            raise striped_read_refusal(key, plan)
        payload = await self._load(key, plan.batches)
        return ReadAnswer(end, state.sealed, payload, batches=plan.indexes)

    async def offset_for_time(
        self, stream_id: int, range_index: int, timestamp_ms: int, end: int | None = None
    ) -> tuple[int | None, int]:
        """The first offset whose record timestamp is at or after ``timestamp_ms`` among
        the records this replica serves (below ``end`` read unconfirmed, as for a sealed
        range, else below the confirm offset), or None; and the end it searched up to
        (less than ``end`` when this replica is short: the caller asks another). The time
        index (``rangeserver/timeindex.py``) says where to start; batches are read from
        there until one's ``max_timestamp`` reaches the timestamp."""
        key = (stream_id, range_index)
        state = self._get(*key)
        if state.damaged:
            raise rp.damaged_error(key)
        limit = readable_end(state, unconfirmed=end is not None)
        if end is not None:
            limit = min(limit, end)
        index = self.time_indexes[key]
        if not index.may_hold(timestamp_ms):
            return None, limit
        offset = index.scan_start(timestamp_ms, state.start)
        while offset < limit:
            chosen = self.indexes[key].select(offset, limit, time_scan_bytes, partial_last=True)
            if not chosen:
                break
            payload = await self._load(key, chosen)
            for header, view in iter_batches(payload):
                if header.max_timestamp >= timestamp_ms:
                    stamps = [r.timestamp for r in decode_batch(view, verify=False).records]
                    found = first_at_or_after(stamps, header.base_offset, timestamp_ms)
                    if found is not None:
                        return (found if found < limit else None), limit
            offset = chosen[-1].end
            self._get(*key)  # RangeNotFound if dropped meanwhile
        return None, limit

    def time_stats(self, stream_id: int, range_index: int) -> TimeAnswer:
        """The replica's time statistics (timeindex.py), with ``end`` (what it holds: the
        statistics cover every batch below it, maybe past a sealed range's end) and
        ``sealed``; ``ReplicaDamaged`` if damaged."""
        key = (stream_id, range_index)
        state = self._get(*key)
        if state.damaged:
            raise rp.damaged_error(key)
        return TimeAnswer(**self.time_indexes[key].stats(), end=state.end, sealed=state.sealed)

    async def _wait(self, key: RangeKey, offset: int, unconfirmed: bool, wait_ms: int) -> None:
        """Until something is readable at ``offset`` (or the replica is sealed, damaged or
        dropped), at most ``wait_ms``: one deadline for the whole wait, however often the
        replica changes meanwhile without that (not a wait_for of what remains, armed
        again at each change)."""
        try:
            async with asyncio.timeout(wait_ms / 1000):
                while True:
                    state = self.replicas.get(key)
                    if (
                        state is None  # dropped
                        or state.sealed
                        or state.damaged
                        or readable_end(state, unconfirmed=unconfirmed) > offset
                    ):
                        return
                    await self._events.setdefault(key, asyncio.Event()).wait()
        except TimeoutError:
            return

    async def _load(self, key: RangeKey, chosen: list[IndexedBatch]) -> bytes:
        parts: list[bytes | None] = []
        missing: list[int] = []
        for i, batch in enumerate(chosen):
            cached = self.cache.get((key[0], key[1], batch.base))
            parts.append(cached)
            if cached is None:
                missing.append(i)
        if missing:
            try:
                loaded = await self.wal.read([chosen[i].location for i in missing])
            except OSError:
                self._get(*key)  # dropped meanwhile, its segments deleted: RangeNotFound
                raise
            for i, data in zip(missing, loaded, strict=True):
                error = self._verify_read(key, chosen[i], data)
                if error is not None:
                    await self._mark_damaged(key)
                    raise error
                parts[i] = data
        return b"".join(p for p in parts if p is not None)

    def _verify_read(self, key: RangeKey, batch: IndexedBatch, data: bytes) -> EstreamError | None:
        """A batch read from disk is served only if it is whole, is the expected batch,
        and its checksum verifies; otherwise the error to answer (and the replica is to
        be marked damaged)."""
        try:
            header = verify_batch(data)
        except ChecksumMismatch as exc:
            log.error("replica %s: checksum mismatch at offset %s", key, batch.base)
            return ChecksumMismatch(
                f"stored batch at offset {batch.base} of replica {key} failed its checksum",
                expected=exc.fields["expected"],
                actual=exc.fields["actual"],
            )
        except EstreamError:
            return rp.damaged_error(key)
        if (header.stream_id, header.range_index, header.base_offset) != (*key, batch.base):
            return rp.damaged_error(key)
        return None
