"""What a stream writer has in flight: its cut batches (:class:`Batch`), the open range's
replica state (:class:`OpenRange`), and the chase bound over them (a slow replica keeps
receiving until its backlog, in bytes or age, passes the bound).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from estream.core.writeeffects import BeginSeal, WriterConfig
from estream.wire.record import EncodedRecords


@dataclass(slots=True)
class Batch:
    """One cut batch: its first offset, encoded records, and who holds it."""

    base: int
    section: EncodedRecords
    size: int
    range_index: int = -1  # the range it was last sent to; -1 = not sent yet
    sent_ms: int = 0
    acked_by: set[str] = field(default_factory=set)

    @property
    def end(self) -> int:
        return self.base + self.section.count


@dataclass(slots=True)
class OpenRange:
    """The range the writer appends to, and what its replicas answered."""

    index: int
    start: int
    replicas: tuple[str, ...]
    acked: dict[str, int] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    sent_bytes: int = 0
    seal_end: int | None = None  # frozen end once sealing began
    full: bool = False  # range_bytes_max sent: no more batches; seal once they complete
    seal_sent: bool = False
    roll_requested: bool = False  # RequestRoll emitted (the range runs degraded)
    size_limit_lifted: bool = False  # full, but no next range could be placed: goes on
    # The replicas not failed, kept beside ``failed`` (it changes only in ``fail``): every
    # send, ack and deadline asks for them, a replica fails rarely.
    live: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.live = tuple(r for r in self.replicas if r not in self.failed)

    def fail(self, replica: str) -> None:
        """Drop ``replica`` from the live ones."""
        self.failed.add(replica)
        self.live = tuple(r for r in self.replicas if r not in self.failed)

    def seal_if_drained(self) -> BeginSeal | None:
        """:class:`BeginSeal` once every live replica reached the frozen end (once)."""
        seal_end = self.seal_end
        if seal_end is None or self.seal_sent:
            return None
        live = self.live
        if any(self.acked.get(r, self.start) < seal_end for r in live):
            return None  # still draining; on_tick drops a replica that does not catch up
        self.seal_sent = True
        return BeginSeal(self.index, seal_end, tuple(sorted(self.failed)), live)

    def may_drop_slow(self, ack_count: int) -> bool:
        """Whether a replica past its chase bound is dropped: while appending, only if
        more than ``ack_count`` are live (dropping one of the last ``ack_count`` would stop
        every append until a roll: with exactly ``replicas`` servers and one out, until it
        is back; waiting for a slow one is better, and an error or a request timeout still
        fails it); while draining for a seal, always."""
        return self.seal_end is not None or len(self.replicas) - len(self.failed) > ack_count


def oldest_unacked_ms(batches: Iterable[Batch], rng: OpenRange) -> int | None:
    """When the oldest batch some live replica of ``rng`` still owes was sent (the chase
    deadline's start); None when nothing is owed or the seal was sent."""
    if rng.seal_sent:
        return None
    oldest: int | None = None
    live = rng.live
    index, seal_end = rng.index, rng.seal_end
    for batch in batches:
        if batch.range_index != index:
            continue
        if seal_end is not None and batch.end > seal_end:
            continue
        if oldest is not None and batch.sent_ms >= oldest:
            continue
        acked_by = batch.acked_by
        if len(acked_by) < len(live) or not acked_by.issuperset(live):  # no generator
            oldest = batch.sent_ms
    return oldest


def past_chase_bound(
    batches: Iterable[Batch], rng: OpenRange, replica: str, completed: int, now_ms: int,
    config: WriterConfig,
) -> bool:
    """Whether ``replica`` is past its chase bound: a batch it owes is older than
    ``chase_backlog_ms_max``, or it owes more than ``chase_backlog_bytes_max`` of what a
    quorum already has (below ``completed``).

    Bytes count once a quorum has them: how far the replica is behind the others.
    (Counting every unacked byte failed every replica at once when more than the bound
    was in flight, e.g. resent after a roll: a roll loop.)"""
    backlog = 0
    horizon = rng.seal_end  # while draining, only what the seal needs counts
    for batch in batches:
        if batch.range_index != rng.index or replica in batch.acked_by:
            continue
        if horizon is not None and batch.end > horizon:
            continue
        if now_ms - batch.sent_ms > config.chase_backlog_ms_max:
            return True
        if batch.end <= completed:
            backlog += batch.size
    return backlog > config.chase_backlog_bytes_max


def early_room(batches: Sequence[Batch], completed: int, early_batches: int) -> bool:
    """Fewer than ``early_batches`` batches are unacknowledged (below ``completed``): a
    pending batch may go before it is full. Batches are kept in offset order."""
    room = early_batches
    for batch in reversed(batches):
        if batch.end <= completed:
            return True
        room -= 1
        if room <= 0:
            return False
    return True


def sent_end(batches: Iterable[Batch], range_index: int, completed: int) -> int:
    """The end of what was sent to ``range_index`` (``completed`` if nothing was)."""
    ends = [b.end for b in batches if b.range_index == range_index]
    return max(ends) if ends else completed


__all__ = ["Batch", "OpenRange", "early_room", "oldest_unacked_ms", "past_chase_bound",
           "sent_end"]
