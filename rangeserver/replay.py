"""Recovery at start: every replica's state, index and span rebuilt from the log.

:class:`Replay` starts from what a checkpoint holds (or from nothing), takes the log's
segments in order, replays every valid entry ``rangeserver/walformat.py`` finds and decides
what the other bytes mean: mid-log damage (nothing cut, replicas marked damaged), a torn
tail (cut), a damaged last entry (cut, and a DAMAGED entry written), zeros (unused space),
replicas without a CREATE_RANGE (damaged), entries out of bounds. Each case and why:
:class:`Replay`, docs/ARCHITECTURE.md 3.4.

Pure: no I/O (``rangeserver/shell/store.py`` reads the segments and carries out the cuts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from estream.wire.rangeanswers import RangeKey
from estream.wire.record import BatchHeader
from rangeserver import bounds
from rangeserver import replica as rp
from rangeserver import walformat as wf
from rangeserver.index import Location, RangeIndex
from rangeserver.replica import ReplicaState
from rangeserver.retention import Span, extend_span
from rangeserver.stripedreplica import chain_of, replay_striped_batch, with_chain
from rangeserver.timeindex import TimeIndex


@dataclass(frozen=True, slots=True)
class Cut:
    """Cut segment ``segment`` at ``position`` after writing ``marks`` there (the log
    then goes on after them)."""

    segment: int
    position: int
    marks: bytes = b""

    @property
    def end(self) -> int:
        return self.position + len(self.marks)


@dataclass(slots=True)
class _Orphan:
    """Batches of a replica the log has no CREATE_RANGE entry for (so far)."""

    first: int  # segment of the first one
    last: int
    count: int
    start: int  # base offset of the first one
    epoch: int


class Replay:
    """The replicas being rebuilt; see the module docstring.

    - **Mid-log damage** (an invalid entry with valid ones after it): nothing is cut; the
      replica the damaged entry names (its batch header or control body, when that names a
      replica it knows), else every open replica, is marked damaged.
    - **A torn tail** of the last segment (an incomplete entry, an unwritten sector, garbage
      with no sane entry header): cut at the last valid entry (:class:`Cut`).
    - **A damaged last entry** (:attr:`~rangeserver.walformat.ScanResult.tail_damage`: written
      whole, then changed): cut like a torn tail, but the replica it names (else every open
      one) is marked damaged and a DAMAGED entry for each is written where the cut is, so the
      mark outlives the evidence. Why not leave it: appends must continue after the last valid
      entry, and a replica short of what it acknowledged must never answer a fence with that
      short end (recovery would seal below acknowledged records).
    - **Zeros** after the last entry: unused space (a spare, a direct write's padding, the
      hole of a full-size segment), kept as it is in any segment.
    - **Garbage at the end of an earlier segment**: damage (the log synced a segment whole
      before starting the next).
    - **Batches of a replica with neither CREATE_RANGE nor DROP entry in the log** (its
      CREATE_RANGE entry was damaged): the replica becomes a damaged one, so that the server
      never answers RangeNotFound ("never had it") for data it holds. Batches of a dropped
      replica whose CREATE_RANGE went with a reclaimed segment are not that: its DROP entry
      is kept as long as they are (``rangeserver/retention.py``). Nor are batches followed
      by their replica's CREATE_RANGE: the log carried that replica forward
      (``rangeserver/carry.py``) and the group after the CREATE_RANGE holds all of them.
    - **Entries out of bounds** (``rangeserver/bounds.py``; only a version before those
      checks could log them): a batch whose offsets end past int64 is skipped (that version
      failed such an append before answering or applying it, so nothing acknowledged is
      lost); a control entry with a number past int64 makes its replica damaged (none of
      its requests can be served within the bounds). The server starts either way.
    """

    def __init__(
        self,
        replicas: Mapping[RangeKey, ReplicaState] | None = None,
        indexes: Mapping[RangeKey, RangeIndex] | None = None,
        spans: Mapping[RangeKey, Span] | None = None,
        dropped: Sequence[Span] = (),
        time_indexes: Mapping[RangeKey, TimeIndex] | None = None,
    ) -> None:
        self.replicas: dict[RangeKey, ReplicaState] = dict(replicas or {})
        self.indexes: dict[RangeKey, RangeIndex] = dict(indexes or {})
        # A checkpoint without a replica's time index: lookups scan it (timeindex.py).
        self.time_indexes: dict[RangeKey, TimeIndex] = {
            key: (time_indexes or {}).get(key) or TimeIndex(partial=True)
            for key in self.replicas
        }
        self.spans: dict[RangeKey, Span] = dict(spans or {})
        self.dropped: list[Span] = list(dropped)
        self.report: list[str] = []  # what recovery found that an operator should know
        self._orphans: dict[RangeKey, _Orphan] = {}
        self._indexed: dict[RangeKey, int] = {}  # a striped replica's next BATCH's index

    # ---------------------------------------------------------------------- segments

    def segment(
        self, segment: int, start: int, data: bytes, size: int, *, last: bool
    ) -> tuple[int, Cut | None]:
        """Replay ``data``, the bytes of ``segment`` from ``start`` on (``size``: the
        file's); returns where the log goes on in it, and the cut to make first, if any."""
        result = wf.scan(data, base=start)
        for entry in result.entries:
            self._replay(segment, start, entry)
        for damage in result.damage:
            self._damage(segment, start, damage)
        valid_end = start + result.valid_end
        tail = result.tail_damage
        if tail is not None:
            return self._damaged_tail(segment, start, valid_end, tail, last=last)
        if valid_end < size and not wf.all_zero(data, result.valid_end):
            if not last:
                self._damage(segment, 0, wf.Damage(valid_end, size, result.tail_reason))
                return valid_end, None
            self._note(
                f"segment {segment}: torn tail ({result.tail_reason}) truncated at "
                f"{valid_end}, {size - valid_end} bytes dropped"
            )
            return valid_end, Cut(segment, valid_end)
        return valid_end, None

    def _damaged_tail(
        self, segment: int, start: int, valid_end: int, tail: wf.Damage, *, last: bool
    ) -> tuple[int, Cut | None]:
        if not last:
            self._damage(segment, start, tail)
            return valid_end, None
        keys = self._damaged_keys(tail)
        for key in keys:
            self.replicas[key] = rp.mark_damaged(self.replicas[key])
            extend_span(self.spans, key, segment)
        marks = b"".join(wf.encode_control(wf.DamageMarked(*key)) for key in keys)
        self._note(
            f"segment {segment}: damaged last entry at {valid_end} ({tail.reason}, "
            f"{tail.end - tail.start} bytes) cut off; replicas marked damaged: {keys}"
        )
        return valid_end + len(marks), Cut(segment, valid_end, marks)

    def finish(self) -> None:
        """After the last segment: replicas whose CREATE_RANGE entry is lost become
        damaged replicas; every damaged replica is reported."""
        for key, orphan in self._orphans.items():
            self._note(
                f"segments {orphan.first}-{orphan.last}: {orphan.count} batches of range "
                f"{key} without its CREATE_RANGE entry: a damaged replica"
            )
            state = ReplicaState(*key, orphan.start, orphan.start, orphan.start, orphan.epoch)
            self.replicas[key] = rp.mark_damaged(state)
            self.indexes[key] = RangeIndex()
            self.time_indexes[key] = TimeIndex()
            self.spans[key] = Span(orphan.first, orphan.last)
        self._orphans.clear()
        for key, state in self.replicas.items():
            if state.damaged:
                self._note(f"replica {key} is damaged")

    # ----------------------------------------------------------------------- entries

    def _replay(self, segment: int, start: int, entry: wf.Entry) -> None:
        if entry.batch is not None:
            self._replay_batch(segment, start, entry, entry.batch)
            return
        control = entry.control
        assert control is not None
        key = (control.stream_id, control.range_index)
        if not bounds.control_in_bounds(control):
            self._out_of_bounds(segment, start + entry.position, key, control)
            return
        if isinstance(control, wf.CreateRange):
            if key not in self.replicas:
                # Batches before a replica's CREATE_RANGE: copies the log kept when the
                # replica was carried forward (rangeserver/carry.py); this group holds them.
                self._orphans.pop(key, None)
                self.replicas[key] = ReplicaState.create(
                    *key, control.start, control.epoch, control.digest, control.stripe)
                self.indexes[key] = RangeIndex()
                self.time_indexes[key] = TimeIndex()
                self.spans[key] = Span(segment, segment)
            return
        if isinstance(control, wf.Dropped):
            self._forget(key, segment)
            return
        state = self.replicas.get(key)
        if state is None:
            return
        extend_span(self.spans, key, segment)
        if isinstance(control, wf.EpochRaised):
            self.replicas[key] = rp.replay_epoch(state, control.epoch)
        elif isinstance(control, wf.Sealed):
            self.replicas[key] = rp.replay_seal(state, control.epoch, control.end,
                                                control.batches)
        elif isinstance(control, wf.Confirmed):
            self.replicas[key] = rp.replay_confirm(state, control.confirm)
        elif isinstance(control, wf.BatchIndexed):
            self._indexed[key] = control.index
        else:
            assert isinstance(control, wf.DamageMarked)
            self.replicas[key] = rp.mark_damaged(state)

    def _replay_batch(
        self, segment: int, start: int, entry: wf.Entry, batch: BatchHeader
    ) -> None:
        key = (batch.stream_id, batch.range_index)
        error = bounds.batch_error(batch)
        if error is not None:
            self._note(f"segment {segment}: batch entry at {start + entry.position} of range "
                       f"{key} skipped: {error.message}")
            return
        state = self.replicas.get(key)
        if state is None:  # a dropped replica's (its CREATE_RANGE reclaimed), or damage
            orphan = self._orphans.get(key)
            if orphan is None:
                self._orphans[key] = _Orphan(segment, segment, 1, batch.base_offset, batch.epoch)
            else:
                orphan.last, orphan.count = segment, orphan.count + 1
                orphan.epoch = max(orphan.epoch, batch.epoch)
            return
        new = self._replayed(key, state, batch)
        if new.end != state.end:
            location = Location(segment, start + entry.body_position, len(entry.body))
            self.indexes[key].add(batch.base_offset, new.end, location)
            self.time_indexes[key].observe(
                new.end, batch.first_timestamp, batch.max_timestamp, len(entry.body))
        self.replicas[key] = new
        extend_span(self.spans, key, segment)

    def _replayed(self, key: RangeKey, state: ReplicaState, batch: BatchHeader) -> ReplicaState:
        """The replica after a BATCH entry; a striped one's takes the index of the
        BATCH_INDEX entry before it (none: an entry lost, the replica damaged)."""
        if state.stripe is None:
            return rp.replay_batch(state, batch)
        index = self._indexed.pop(key, None)
        if index is None:
            return rp.mark_damaged(state)
        new, chain = replay_striped_batch(state, chain_of(state), batch, index)
        return with_chain(new, chain)

    def _out_of_bounds(
        self, segment: int, position: int, key: RangeKey, control: wf.Control
    ) -> None:
        """A control entry with a number out of bounds: its replica becomes damaged (a
        new one created so, within bounds, when the entry is its CREATE_RANGE)."""
        self._note(f"segment {segment}: {type(control).__name__} entry at {position} of "
                   f"range {key} has a number past int64: a damaged replica")
        state = self.replicas.get(key)
        if state is None:
            if not isinstance(control, wf.CreateRange):
                return
            start = min(control.start, bounds.INT64_MAX)
            state = ReplicaState.create(*key, start, min(control.epoch, bounds.INT64_MAX))
            self.indexes[key] = RangeIndex()
            self.time_indexes[key] = TimeIndex()
            self.spans[key] = Span(segment, segment)
        self.replicas[key] = rp.mark_damaged(state)
        extend_span(self.spans, key, segment)

    def _forget(self, key: RangeKey, segment: int) -> None:
        """A DROP entry: the replica's span becomes a dropped span."""
        span = self.spans.pop(key, None)
        orphan = self._orphans.pop(key, None)
        if span is not None:
            first = span.first
        else:
            first = orphan.first if orphan is not None else segment
        self.replicas.pop(key, None)
        self.indexes.pop(key, None)
        self.time_indexes.pop(key, None)
        self.dropped.append(Span(first, segment))

    # ------------------------------------------------------------------------ damage

    def _damaged_keys(self, damage: wf.Damage) -> list[RangeKey]:
        """The replicas that may have lost data in damaged bytes: the one they name, if
        known; none for a CREATE_RANGE of an unknown replica (it held nothing yet: its
        later batches, if any, make it a damaged replica in :meth:`finish`); else every
        open replica (a sealed one takes no more entries, so none of its can be lost)."""
        names = damage.names
        if names is not None and names in self.replicas:
            return [names]
        if isinstance(damage.control, wf.CreateRange):
            return []
        return [k for k, s in self.replicas.items() if not s.sealed]

    def _damage(self, segment: int, start: int, damage: wf.Damage) -> None:
        keys = self._damaged_keys(damage)
        self._note(
            f"segment {segment}: damage at {start + damage.start} ({damage.reason}, "
            f"{damage.end - damage.start} bytes); replicas marked damaged: {keys}"
        )
        for key in keys:
            self.replicas[key] = rp.mark_damaged(self.replicas[key])

    def _note(self, message: str) -> None:
        self.report.append(message)
