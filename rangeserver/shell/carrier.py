"""Carrying long-lived replicas forward in the log, so that its old segments can go.

Each round (before the periodic checkpoint) asks ``rangeserver/carry.py`` which replicas
pin old segments and may be carried, then, one replica at a time: reads its batches, and
if the replica did not change meanwhile writes the group (CREATE_RANGE, its batches,
CONFIRM, SEAL) at the log's head; once the group is durable, the index points into it,
the span starts at its segment, and the old span is kept as a dropped one ending there
(its segment then stays while any older segment of the replica's does, so replaying what
is left of the log never brings back a dropped replica from its first CREATE_RANGE). The
checkpoint after the round deletes the segments nothing needs any more.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from estream.wire.errors import EstreamError
from estream.wire.record import verify_batch
from rangeserver import carry
from rangeserver import walformat as wf
from rangeserver.index import Location
from rangeserver.replica import ReplicaState
from rangeserver.retention import Span

if TYPE_CHECKING:
    from rangeserver.shell.store import Store

log = logging.getLogger(__name__)

Key = tuple[int, int]
carry_bytes_per_round_max = 64 * 1024 * 1024  # batches copied forward per round, at most


class Carrier:
    """Runs carry rounds on one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._seen: dict[Key, ReplicaState] = {}  # the states of the last round
        self.carried = 0  # replicas carried since start

    async def round(self) -> int:
        """One round; returns how many replicas were carried."""
        store = self.store
        seen, self._seen = self._seen, dict(store.replicas)
        budget = min(carry_bytes_per_round_max, store.wal.segment_bytes_max // 2)
        chosen = carry.choose(store.wal.segments(), store.wal.segment,
                              self._candidates(seen, budget), budget)
        done = 0
        for key in chosen:
            try:
                done += await self._carry(key, seen)
            except EstreamError as exc:  # a short resource, a failed log: next round
                log.warning("replica %s not carried forward: %s", key, exc.message)
                break
        if done:
            log.info("carried %d replicas forward in the log", done)
        self.carried += done
        return done

    def _candidates(self, seen: dict[Key, ReplicaState], budget: int) -> list[carry.Candidate]:
        store = self.store
        head = store.wal.segment
        found = []
        for key, span in store.spans.items():
            if span.first >= head:
                continue  # nothing old to free
            state = store.replicas.get(key)
            index = store.indexes.get(key)
            if state is None or index is None:
                continue
            size = index.bytes_total()
            found.append(carry.Candidate(key, span, size, _idle(state, seen.get(key))
                                         and size <= budget))
        return found

    async def _carry(self, key: Key, seen: dict[Key, ReplicaState]) -> int:
        store = self.store
        state = store.replicas.get(key)
        index = store.indexes.get(key)
        if state is None or index is None or not _idle(state, seen.get(key)):
            return 0
        batches = [index.batch(i) for i in range(len(index))]
        data = await store.wal.read([b.location for b in batches]) if batches else []
        if store.replicas.get(key) is not state or len(index) != len(batches):
            return 0  # changed meanwhile: a later round
        for b, raw in zip(batches, data, strict=True):
            try:
                header = verify_batch(raw)
            except EstreamError:
                return 0  # damaged on disk: left for a read to find and mark
            if (header.stream_id, header.range_index, header.base_offset) != (*key, b.base):
                return 0
        parts: list[bytes] = [wf.encode_control(
            wf.CreateRange(*key, state.start, state.epoch, state.digest))]
        offsets = []
        size = len(parts[0])
        for raw in data:
            entry_header = wf.batch_entry_header(raw)
            parts += [entry_header, raw]
            offsets.append(size + len(entry_header))
            size += len(entry_header) + len(raw)
        if state.confirm > state.start:
            parts.append(wf.encode_control(wf.Confirmed(*key, state.epoch, state.confirm)))
        if state.sealed:
            parts.append(wf.encode_control(wf.Sealed(*key, state.epoch, state.sealed_end)))
        size = sum(len(p) for p in parts)
        # Nothing awaited since the check: the group is the replica's state now. With no
        # batch it is control entries only, taken while a resource is short (it frees).
        at, durable = store.wal.append(parts, size, control=not batches)
        await durable
        if store.indexes.get(key) is not index:
            return 0  # dropped meanwhile: its DROP entry's span covers the old one
        index.moved([b.base for b in batches],
                     [Location(at.segment, at.position + o, len(raw))
                      for o, raw in zip(offsets, data, strict=True)])
        old = store.spans[key]
        store.spans[key] = Span(at.segment, max(old.last, at.segment))
        if old.first < at.segment:
            store.dropped.append(Span(old.first, at.segment))
        return 1


def _idle(state: ReplicaState, before: ReplicaState | None) -> bool:
    """Unchanged for a whole round, all of it durable, not damaged."""
    return state is before and not state.damaged and state.written_end == state.end
