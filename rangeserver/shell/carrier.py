"""Carrying long-lived replicas forward in the log, so that its old segments can go.

Each round (before the periodic checkpoint) asks ``rangeserver/carry.py`` which replicas
pin old segments and may be carried, then, ``replicas_at_once`` at a time: reads their
batches, and for each replica that did not change meanwhile writes its group
(CREATE_RANGE, its batches, a striped one's each after its BATCH_INDEX, CONFIRM, SEAL) at
the log's head; once the groups are durable, each index points into its group, each span
starts at its segment, and each old span is kept as a dropped one ending there (that
segment then stays while any older one of the replica's does, so replaying what is left
of the log never brings a dropped replica back from its first CREATE_RANGE). The
checkpoint after the round deletes the segments nothing needs any more.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from estream.wire.errors import EstreamError
from estream.wire.rangeanswers import RangeKey
from estream.wire.record import verify_batch
from rangeserver import carry
from rangeserver import walformat as wf
from rangeserver.index import IndexedBatch, Location
from rangeserver.replica import ReplicaState
from rangeserver.retention import Span
from rangeserver.stripedreplica import chain_of, nth_held

if TYPE_CHECKING:
    from rangeserver.shell.store import Store

log = logging.getLogger(__name__)

carry_bytes_per_round_max: Final = 64 * 1024 * 1024  # batches copied forward per round, at most
replicas_at_once: Final = 256  # read together, written together, one wait for their durability


class Carrier:
    """Runs carry rounds on one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._seen: dict[RangeKey, ReplicaState] = {}  # the states of the last round
        self.carried = 0  # replicas carried since start
        self.carried_bytes = 0  # their batches' bytes written again at the log's head

    async def round(self) -> int:
        """One round; returns how many replicas were carried."""
        store = self.store
        seen, self._seen = self._seen, dict(store.replicas)
        budget = min(carry_bytes_per_round_max, store.wal.segment_bytes_max // 2)
        chosen = carry.choose(store.wal.segments(), store.wal.segment,
                              self._candidates(seen, budget), budget)
        done = 0
        for at in range(0, len(chosen), replicas_at_once):
            try:
                done += await self._carry(chosen[at:at + replicas_at_once], seen)
            except EstreamError as exc:  # a short resource, a failed log: next round
                log.warning("replicas not carried forward: %s", exc.message)
                break
        if done:
            log.info("carried %d replicas forward in the log", done)
        self.carried += done
        return done

    def _candidates(self, seen: dict[RangeKey, ReplicaState], budget: int) -> list[carry.Candidate]:
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

    async def _carry(self, keys: list[RangeKey], seen: dict[RangeKey, ReplicaState]) -> int:
        """Carry these replicas: their batches read at once, each group written if its
        replica did not change meanwhile, then one wait for all of them to be durable."""
        store = self.store
        wanted = []
        for key in keys:
            state, index = store.replicas.get(key), store.indexes.get(key)
            if state is not None and index is not None and _idle(state, seen.get(key)):
                wanted.append((key, state, index, [index.batch(i) for i in range(len(index))]))
        locations = [b.location for *_, batches in wanted for b in batches]
        data = iter(await store.wal.read(locations) if locations else [])
        written = []
        for key, state, index, batches in wanted:
            raw = [next(data) for _ in batches]
            if store.replicas.get(key) is not state or len(index) != len(batches):
                continue  # changed meanwhile: a later round
            group = _group(key, state, batches, raw)
            if group is None:
                continue
            parts, offsets = group
            # Nothing awaited since the check: the group is the replica's state now. With
            # no batch it is control entries only, taken while a resource is short.
            at, durable = store.wal.append(parts, sum(map(len, parts)), control=not batches)
            written.append((key, index, batches, raw, offsets, at, durable))
        outcomes = await asyncio.gather(*(w[-1] for w in written), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        for (key, index, batches, raw, offsets, at, _), outcome in zip(
                written, outcomes, strict=True):
            if isinstance(outcome, BaseException) or store.indexes.get(key) is not index:
                continue  # dropped meanwhile: its DROP entry's span covers the old one
            index.moved([b.base for b in batches],
                        [Location(at.segment, at.position + o, len(r))
                         for o, r in zip(offsets, raw, strict=True)])
            old = store.spans[key]
            store.spans[key] = Span(at.segment, max(old.last, at.segment))
            if old.first < at.segment:
                store.dropped.append(Span(old.first, at.segment))
        if failed:  # the log cut those groups back: nothing of them was done
            raise failed[0]
        self.carried_bytes += sum(len(r) for w in written for r in w[3])
        return len(written)


def _group(
    key: RangeKey, state: ReplicaState, batches: list[IndexedBatch], raw: list[bytes]
) -> tuple[list[bytes], list[int]] | None:
    """The entries that state the replica whole (and where each batch's body is in
    them), or None if a batch read back is not the one indexed (left for a read to find
    and mark damaged)."""
    for b, data in zip(batches, raw, strict=True):
        try:
            header = verify_batch(data)
        except EstreamError:
            return None
        if (header.stream_id, header.range_index, header.base_offset) != (*key, b.base):
            return None
    indexes = striped_indexes(state, len(raw))
    if indexes is None:
        return None  # a striped replica whose batches are not its chain's prefix: left
    parts = [wf.encode_control(wf.CreateRange(*key, state.start, state.epoch, state.digest,
                                                   state.stripe))]
    offsets = []
    size = len(parts[0])
    for i, data in enumerate(raw):
        if indexes:  # a striped replica's: each BATCH after its BATCH_INDEX entry
            parts.append(wf.encode_control(wf.BatchIndexed(*key, indexes[i])))
            size += len(parts[-1])
        entry_header = wf.batch_entry_header(data)
        parts += [entry_header, data]
        offsets.append(size + len(entry_header))
        size += len(entry_header) + len(data)
    if state.confirm > state.start:
        parts.append(wf.encode_control(wf.Confirmed(*key, state.epoch, state.confirm)))
    if state.sealed:
        parts.append(wf.encode_control(wf.Sealed(*key, state.epoch, state.sealed_end,
                                                  state.sealed_batches)))
    return parts, offsets


def striped_indexes(state: ReplicaState, count: int) -> list[int] | None:
    """The batch indexes of a replica's ``count`` stored batches: a striped replica holds
    a prefix of its chain (``nth_held``), ending at ``chain_written``; [] for an unstriped
    one, None when they do not add up (not carried)."""
    if state.stripe is None:
        return []
    chain = chain_of(state)
    indexes = [nth_held(chain.stripe, chain.position, n) for n in range(count)]
    return indexes if (indexes[-1] if indexes else -1) == state.chain_written else None


def _idle(state: ReplicaState, before: ReplicaState | None) -> bool:
    """Unchanged for a whole round, all of it durable, not damaged."""
    return state is before and not state.damaged and state.written_end == state.end
