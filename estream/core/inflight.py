"""What a stream writer has in flight: its cut batches (:class:`Batch`), the open range's
replica state (:class:`OpenRange`: which servers each batch goes to, what each answered,
when the range is writable and drained), and the chase bound over them (a slow replica
keeps receiving until the oldest batch it owes passes the bound in age; its bytes are the
chase budget's, :mod:`estream.core.chasebudget`). A striped range
(``stripe``: E > replicas) sends batch k only to its write set and confirms per batch
(:mod:`estream.core.striping`, docs/ARCHITECTURE.md section 10).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from estream.core.quorum import confirm_offset
from estream.core.striping import confirmed_batches, writable
from estream.core.writeeffects import BeginSeal, WriterConfig
from estream.wire.record import EncodedRecords
from estream.wire.stripe import Stripe


@dataclass(slots=True)
class Batch:
    """One cut batch: its first offset, encoded records, and who holds it."""

    base: int
    section: EncodedRecords
    size: int
    range_index: int = -1  # the range it was last sent to; -1 = not sent yet
    sent_ms: int = 0
    acked_by: set[str] = field(default_factory=set)
    index: int = -1  # its index in a striped range (-1: unsent, or not striped)
    holders: tuple[str, ...] = ()  # the servers it was sent to hold (its write set)

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
    # Striping (None: every batch to every replica). Batches sent so far (the next
    # index), each position's highest acknowledged index, the confirmed count, and the
    # count frozen with ``seal_end``.
    stripe: Stripe | None = None
    sent_batches: int = 0
    acked_index: dict[int, int] = field(default_factory=dict)
    confirmed_batches: int = 0
    seal_batches: int | None = None
    # Striped: the live servers the range stays writable without (None: not computed
    # since the last failure; every deadline asks).
    droppable: frozenset[str] | None = None
    hinted: int = -1  # the highest confirm offset hinted to the replicas (confirmhint.py)

    def __post_init__(self) -> None:
        self.live = tuple(r for r in self.replicas if r not in self.failed)

    def holders(self, k: int) -> tuple[str, ...]:
        """The servers batch ``k`` goes to: its write set (every replica, unstriped)."""
        stripe, replicas = self.stripe, self.replicas
        if stripe is None:
            return replicas
        return tuple(replicas[p] for p in stripe.write_set(k))

    def assign(self, batch: Batch) -> int | None:
        """``batch`` is sent to this range now: its index (None unstriped) and holders."""
        if self.stripe is None:
            batch.holders = self.replicas
            return None
        batch.index = k = self.sent_batches
        self.sent_batches = k + 1
        batch.holders = self.holders(k)
        return k

    def held_by(self, answered: Collection[str], ack_count: int) -> bool:
        """Whether the servers that ``answered`` (a FORCE, or a durable CONFIRM) hold every
        confirmed record: ``ack_count`` live ones, or, striped, the confirm prefix rule over
        the acknowledgements of those that answered (``ack_count`` of every write set's
        batches among them: with fewer, a write set none of them is in hides its
        batches from readers if the others are lost)."""
        if self.stripe is None:
            return sum(1 for r in self.live if r in answered) >= ack_count
        acked = {p: k for p, k in self.acked_index.items() if self.replicas[p] in answered}
        n = self.confirmed_batches
        return confirmed_batches(acked, n, self.stripe) >= n

    def freeze(self, end: int) -> None:
        """The end is frozen at ``end`` (the confirmed end): sealing begins."""
        self.seal_end = end
        self.seal_batches = self.confirmed_batches if self.stripe is not None else None

    def writable(self, ack_count: int) -> bool:
        """Whether every batch can still be acknowledged by the live replicas (else the
        range must roll): ``ack_count`` live, or, striped, ``acks`` live in every write
        set (:func:`~estream.core.striping.writable`)."""
        if self.stripe is None:
            return len(self.live) >= ack_count
        return writable(self._positions(self.failed), self.stripe)

    def _positions(self, servers: set[str]) -> set[int]:
        return {p for p, r in enumerate(self.replicas) if r in servers}

    def fail(self, replica: str) -> None:
        """Drop ``replica`` from the live ones."""
        self.failed.add(replica)
        self.live = tuple(r for r in self.replicas if r not in self.failed)
        self.droppable = None

    def seal_if_drained(self) -> BeginSeal | None:
        """:class:`BeginSeal` once every live replica reached the frozen end (once)."""
        seal_end = self.seal_end
        if seal_end is None or self.seal_sent:
            return None
        live = self.live
        stripe = self.stripe
        if stripe is None:
            if any(self.acked.get(r, self.start) < seal_end for r in live):
                return None  # still draining; on_tick drops one that does not catch up
        else:
            n = self.seal_batches
            assert n is not None
            acked, replicas = self.acked_index, self.replicas
            for p, r in enumerate(replicas):  # each live one holds its chain below n
                if r in live and acked.get(p, -1) < stripe.prev_held(p, n):
                    return None
        self.seal_sent = True
        return BeginSeal(self.index, seal_end, tuple(sorted(self.failed)), live,
                         self.seal_batches)

    def may_drop_slow(self, ack_count: int, replica: str | None = None) -> bool:
        """Whether a replica past its chase bound is dropped: while appending, only if
        more than ``ack_count`` are live (dropping one of the last ``ack_count`` would stop
        every append until a roll: with exactly ``replicas`` servers and one out, until it
        is back; waiting for a slow one is better, and an error or a request timeout still
        fails it); striped, only if every write set keeps ``acks`` live without
        ``replica`` (None: any live one); while draining for a seal, always."""
        if self.seal_end is not None:
            return True
        stripe = self.stripe
        if stripe is None:
            return len(self.replicas) - len(self.failed) > ack_count
        droppable = self.droppable
        if droppable is None:
            failed = self._positions(self.failed)
            self.droppable = droppable = frozenset(
                r for r in self.live if writable(failed | self._positions({r}), stripe))
        return bool(droppable) if replica is None else replica in droppable


def oldest_unacked_ms(batches: Iterable[Batch], rng: OpenRange) -> int | None:
    """When the oldest batch some live replica of ``rng`` still owes was sent (the chase
    deadline's start); None when nothing is owed or the seal was sent. Batches go to a
    range in offset order, each at a time no earlier than the one before, so the first
    owed is the oldest: a chaser's kept batches cost this nothing per call."""
    if rng.seal_sent:
        return None
    live = rng.live
    index, seal_end = rng.index, rng.seal_end
    for batch in batches:
        if batch.range_index != index:
            continue
        if seal_end is not None and batch.end > seal_end:
            return None  # the rest are past the frozen end too
        if rng.stripe is not None:
            if owes_any(batch, rng):
                return batch.sent_ms
        elif len(batch.acked_by) < len(live) or not batch.acked_by.issuperset(live):
            return batch.sent_ms
    return None


def past_chase_bound(
    batches: Sequence[Batch], rng: OpenRange, replica: str, now_ms: int, config: WriterConfig,
) -> bool:
    """Whether ``replica`` is past its chase bound: a batch it owes is older than
    ``chase_backlog_ms_max`` (the first it owes is the oldest: :func:`oldest_unacked_ms`).
    (How many bytes it owes is the chase budget's: ``estream/core/chasebudget.py`` counts
    every complete batch kept, so a replica owing more than ``chase_backlog_bytes_max`` of
    them always finds the budget full.)"""
    owed = first_owed(batches, rng, replica)
    return owed is not None and owed.sent_ms < now_ms - config.chase_backlog_ms_max


def first_owed(batches: Sequence[Batch], rng: OpenRange, replica: str) -> Batch | None:
    """The first batch of ``rng`` sent to ``replica`` that it does not hold (while draining,
    below the frozen end). What a replica holds is a prefix of the range's batches (each
    ack marks every batch below its end): a replica far behind owes the front one, one
    keeping up only its newest, found from the back; neither walks a chaser's backlog."""
    horizon, striped = rng.seal_end, rng.stripe is not None

    def owes(batch: Batch) -> bool:
        return ((horizon is None or batch.end <= horizon)
                and (not striped or replica in batch.holders))

    for batch in batches:
        if batch.range_index == rng.index:
            if replica not in batch.acked_by and owes(batch):
                return batch
            break
    first = None
    for batch in reversed(batches):
        if batch.range_index != rng.index:
            continue
        if replica in batch.acked_by:
            break
        if owes(batch):
            first = batch
    return first


def record_ack(batches: Sequence[Batch], rng: OpenRange, replica: str, end: int) -> None:
    """``replica`` of ``rng`` holds every offset below ``end`` (striped: its chain up to
    the batch ending there; the log syncs a chain in order, so each earlier one too).
    Marked from the newest batch back to the first that already names ``replica``: every
    ack marks all the range's batches below its end, so each one before that does too,
    and a chaser's kept batches cost an ack nothing."""
    if end > rng.acked.get(replica, rng.start):
        rng.acked[replica] = end
    top: int | None = None  # the index of the last batch below ``end``
    index = rng.index
    for batch in reversed(batches):
        if batch.range_index != index or batch.end > end:
            continue
        if top is None:
            top = batch.index
        acked_by = batch.acked_by
        if replica in acked_by:
            break
        acked_by.add(replica)
    if top is not None and top >= 0:
        p = rng.replicas.index(replica)
        if top > rng.acked_index.get(p, -1):
            rng.acked_index[p] = top


def confirmed_end(batches: Iterable[Batch], rng: OpenRange, ack_count: int) -> int:
    """The open range's confirmed end: the ``ack_count``-th highest acknowledged end, or,
    striped, the end of the prefix of batches each on ``acks`` of its write set
    (:func:`~estream.core.striping.confirmed_batches`; the batches past the previous
    confirm are still in memory)."""
    stripe = rng.stripe
    if stripe is None:
        return confirm_offset(rng.acked.values(), ack_count, start=rng.start)
    before = rng.confirmed_batches
    rng.confirmed_batches = n = confirmed_batches(
        rng.acked_index, rng.sent_batches, stripe, first=before)
    if n == before:
        return rng.start if n == 0 else -1  # unchanged: not above the completed end
    return next(b.end for b in batches if b.index == n - 1 and b.range_index == rng.index)


def releasable(batch: Batch, rng: OpenRange, completed: int) -> bool:
    """Whether the front ``batch`` may leave memory: complete, and held by every live
    replica (striped: of its write set; sealing too, the drain counts their acks)."""
    if batch.end > completed or batch.range_index != rng.index:
        return False
    if rng.stripe is not None:
        return not owes_any(batch, rng)
    return rng.seal_end is not None or batch.acked_by.issuperset(rng.live)


def owes_any(batch: Batch, rng: OpenRange) -> bool:
    """Whether a live server of ``batch``'s write set has not acknowledged it (striped)."""
    acked_by, failed = batch.acked_by, rng.failed
    return any(r not in acked_by and r not in failed for r in batch.holders)


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


def unsent(batches: Sequence[Batch], range_index: int) -> list[Batch]:
    """The batches not sent to ``range_index`` yet, in offset order: those after the last
    sent there (batches go to a range in offset order), found from the newest back, so a
    chaser's kept batches cost each cut nothing."""
    found: list[Batch] = []
    for batch in reversed(batches):
        if batch.range_index == range_index:
            break
        found.append(batch)
    found.reverse()
    return found


def sent_end(batches: Iterable[Batch], range_index: int, completed: int) -> int:
    """The end of what was sent to ``range_index`` (``completed`` if nothing was)."""
    ends = [b.end for b in batches if b.range_index == range_index]
    return max(ends) if ends else completed


__all__ = ["Batch", "OpenRange", "confirmed_end", "early_room", "oldest_unacked_ms",
           "first_owed", "owes_any", "past_chase_bound", "record_ack", "releasable", "sent_end",
           "unsent"]
