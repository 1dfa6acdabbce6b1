"""The range server's APPEND_MANY appends: a mixin of :class:`~rangeserver.shell.store.Store`.

Each batch is checked and decided as an APPEND of its own (``rangeserver/replica.py``'s
table, in request order), and the accepted ones go to the log as one write: their BATCH
entries back to back, each exactly as a lone APPEND writes it (recovery reads them as it
reads any), with one future, one durability callback and one undo for the write instead
of one per batch. docs/ARCHITECTURE.md 2.1.

Side effects: log writes (the log port, ``rangeserver/shell/logport.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from estream.net.clock import Clock
from estream.wire.errors import EstreamError
from estream.wire.rangeanswers import RangeKey
from estream.wire.record import BatchHeader, check_records, verify_batch
from rangeserver import bounds
from rangeserver import replica as rp
from rangeserver import walformat as wf
from rangeserver.index import BatchCache, Location, RangeIndex
from rangeserver.refusals import indexed_refusal
from rangeserver.replica import ReplicaState
from rangeserver.retention import Span, extend_span
from rangeserver.shell.logport import LogPort
from rangeserver.stripedreplica import decide_indexed_append
from rangeserver.timeindex import TimeIndex

_BARRIER: Final = -2  # a duplicate that may still be in flight: a barrier, to come
_NO_WAIT: Final = -1  # a duplicate already durable


@dataclass(slots=True)  # one per batch: not frozen (a frozen one costs several times as much)
class Appended:
    """A batch :meth:`Store.begin_appends` took (stored, or a duplicate): its replica,
    the end a deferred append answers, and the index of the returned future it waits
    for (-1: none, a duplicate already durable)."""

    key: RangeKey
    end_offset: int
    wait: int


# result index, key, batch, before, the batch's index in its striped range (-1: none)
_Taken = tuple[int, RangeKey, BatchHeader, bytes, ReplicaState, int]


class StoreAppends:
    """The many-batch append path; the store holds the state it changes."""

    replicas: dict[RangeKey, ReplicaState]
    indexes: dict[RangeKey, RangeIndex]
    time_indexes: dict[RangeKey, TimeIndex]
    cache: BatchCache
    wal: LogPort
    seen: dict[RangeKey, tuple[int, int]]
    spans: dict[RangeKey, Span]
    clock: Clock

    def _get(self, stream_id: int, range_index: int) -> ReplicaState:
        raise NotImplementedError  # the store's

    def _set(self, key: RangeKey, new: ReplicaState) -> None:
        raise NotImplementedError  # the store's

    def _on_durable(self, key: RangeKey, end: int, index: int = -1) -> None:
        raise NotImplementedError  # the store's

    def _unappend(self, key: RangeKey, before: ReplicaState, base: int) -> None:
        raise NotImplementedError  # the store's

    def durable_end(self, key: RangeKey) -> int:
        """The replica's durable end (what a batch it took answers); RangeNotFound once
        it is dropped."""
        return self._get(*key).end

    def begin_appends(
        self, batches: Sequence[bytes], *, deferred: bool = False,
        check: Callable[[bytes], None] | None = None,
        indexes: Sequence[int | None] | None = None,
    ) -> tuple[list[Appended | EstreamError], list[asyncio.Future[None]]]:
        """APPEND_MANY's batches: each checked (``check``, then as :meth:`begin_append`)
        and decided as an APPEND of its own, in order, then the accepted ones queued as
        **one** log write (their BATCH entries back to back, as lone APPENDs write them,
        split only where a write would pass ``wal.segment_bytes_max``): one future, one
        durability callback and one undo per write. Returns each batch's
        :class:`Appended` or refusal, and the futures they wait for (the writes, then a
        barrier when a duplicate may still be in flight)."""
        results: list[Appended | EstreamError] = []
        accepted: list[_Taken] = []
        room = max(1, min(self.wal.segment_bytes_max, wf.entry_body_bytes_max))
        cuts: list[int] = []  # where each write after the first starts in ``accepted``
        size, barrier = 0, False
        now_ms = self.clock.monotonic_ms()  # one request, one moment (``seen``)
        for i, batch in enumerate(batches):
            try:
                if check is not None:
                    check(batch)
                header, key, outcome = self._decide(
                    batch, now_ms, None if indexes is None else indexes[i])
            except EstreamError as exc:
                results.append(exc)
                continue
            if isinstance(outcome, rp.Accept):
                index = outcome.state.chain_written if outcome.state.stripe else -1
                entry = wf.ENTRY_HEADER_BYTES + len(batch) + (
                    wf.BATCH_INDEX_ENTRY_BYTES if index >= 0 else 0)
                if size and size + entry > room:  # a write fits in a segment
                    cuts.append(len(accepted))
                    size = 0
                size += entry
                accepted.append((len(results), key, header, batch, self.replicas[key], index))
                self.replicas[key] = outcome.state  # the next batch of it decides on this
                results.append(Appended(key, header.end_offset, len(cuts)))
            else:
                barrier = barrier or not outcome.durable
                results.append(Appended(
                    key, header.end_offset, _NO_WAIT if outcome.durable else _BARRIER))
        futures: list[asyncio.Future[None]] = []
        refused: dict[RangeKey, EstreamError] = {}
        for start, end in zip([0, *cuts], [*cuts, len(accepted)], strict=True):
            if start < end:
                failed = self._write_batches(accepted[start:end], deferred, futures)
                if failed is not None:  # nothing from here on was queued
                    for i, key, _, _, before, _ in reversed(accepted[start:]):
                        self.replicas[key] = before
                        results[i] = refused[key] = failed
                    break
        if barrier:
            self._barrier(results, futures, refused, deferred)
        return results, futures

    def _barrier(
        self, results: list[Appended | EstreamError], futures: list[asyncio.Future[None]],
        refused: dict[RangeKey, EstreamError], deferred: bool,
    ) -> None:
        """The duplicates that may still be in flight wait for a barrier after the
        writes; a duplicate of a batch the log just refused is refused with it."""
        error: EstreamError | None = None
        try:
            futures.append(self.wal.barrier(sync=not deferred))
        except EstreamError as exc:
            error = exc
        for i, r in enumerate(results):
            if isinstance(r, Appended) and r.wait == _BARRIER:
                results[i] = error or refused.get(r.key) or Appended(
                    r.key, r.end_offset, len(futures) - 1)

    def _decide(
        self, batch: bytes, now_ms: int | None = None, index: int | None = None,
    ) -> tuple[BatchHeader, RangeKey, rp.Accept | rp.Duplicate]:
        """:meth:`begin_append`'s checks and decision (the outcome: taken or a duplicate);
        ``now_ms``: the request's moment (None: now); ``index``: the batch's in its
        striped range (``rangeserver/stripedreplica.py``; None: none named)."""
        header = verify_batch(batch)
        bounds.check_batch(header)
        check_records(batch, header)
        key = (header.stream_id, header.range_index)
        state = self.replicas.get(key)
        if state is None:
            state = self._get(*key)  # its RangeNotFound
        outcome = (rp.decide_append(state, header) if index is None and state.stripe is None
                   else decide_indexed_append(state, header, index))
        if not isinstance(outcome, (rp.Accept, rp.Duplicate)):
            raise indexed_refusal(key, outcome)
        self.seen[key] = (header.epoch,
                          self.clock.monotonic_ms() if now_ms is None else now_ms)
        return header, key, outcome

    def _write_batches(
        self, accepted: list[_Taken], deferred: bool, futures: list[asyncio.Future[None]],
    ) -> EstreamError | None:
        """One log write of ``accepted``'s BATCH entries (:meth:`begin_appends`); the
        log's refusal, if it took nothing."""
        parts: list[bytes | memoryview] = []
        ends: dict[RangeKey, tuple[int, int]] = {}
        for _, key, header, batch, _, index in accepted:
            if index >= 0:  # a striped replica's: its BATCH_INDEX entry first
                parts.append(wf.encode_control(wf.BatchIndexed(*key, index)))
            parts.append(wf.batch_entry_header(batch))
            parts.append(batch)
            ends[key] = (header.end_offset, index)  # in order: the last is the highest
        write_bytes = sum(map(len, parts))

        def durable() -> None:
            for key, (end, index) in ends.items():
                self._on_durable(key, end, index)

        def undo() -> None:  # cut back: each replica as before its entry, newest first
            for _, key, header, _, before, _ in reversed(accepted):
                self._unappend(key, before, header.base_offset)

        try:
            location, done = self.wal.append(
                parts, write_bytes, sync=not deferred, on_durable=durable, on_failed=undo)
        except EstreamError as exc:
            return exc
        futures.append(done)
        segment, position = location.segment, location.position + wf.ENTRY_HEADER_BYTES
        indexes, time_indexes, spans = self.indexes, self.time_indexes, self.spans
        replicas, cache = self.replicas, self.cache
        for _, key, header, batch, before, index in accepted:
            if index >= 0:
                position += wf.BATCH_INDEX_ENTRY_BYTES
            batch_bytes = len(batch)
            base, end = header.base_offset, header.end_offset
            indexes[key].add(base, end, Location(segment, position, batch_bytes))
            time_indexes[key].observe(end, header.first_timestamp, header.max_timestamp,
                                      batch_bytes)
            extend_span(spans, key, segment)
            cache.put((key[0], key[1], base), batch)
            new = replicas[key]
            if new.confirm != before.confirm:  # readers may see more: wake long polls
                replicas[key] = before
                self._set(key, new)
            position += batch_bytes + wf.ENTRY_HEADER_BYTES
        return None
