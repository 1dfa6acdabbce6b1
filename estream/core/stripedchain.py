"""Catch-up reads of a sealed striped range by whole chains (docs/ARCHITECTURE.md section
10, Reads).

A READ of one write set's run carries at most ``replicas`` batches; a READ with ``chain``
carries a server's chain from an offset on (every batch it holds, skipping the other
servers' runs) up to the byte bound, as large as an unstriped READ. A reader asks a
:func:`cover` of the range's servers (every write set has one of them: with E 6, R 3,
positions 2 and 5) for their chains side by side, and :class:`ChainMerge` interleaves
the answers in offset order: it says what to deliver (:class:`Take`), whose answer to
wait for (:class:`Await`), and which offsets no chain answered (:class:`Fill`: a server
failed, is behind, or does not serve chains: the stretch is read batch by batch by the
read cursor, with its failover and error rules). A failed server is replaced by the
positions a cover without it needs (:meth:`ChainMerge.failed`). Every record is
delivered once, in order, clipped to ``[start, stop)`` (the catalog's end at most).
Pure: no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.stripe import Stripe

queued_chain_answers_max: Final = 2  # answers a server's chain keeps ahead of the merge

T = TypeVar("T")


def cover(stripe: Stripe, avoid: Collection[int] = ()) -> tuple[int, ...] | None:
    """Positions such that every write set has one of them, none of ``avoid`` (None when
    a write set is all in ``avoid``). For each write set in turn that none chosen holds,
    the one of its positions outside ``avoid`` holding the most write sets not yet held
    (ties: the last in write order, whose run starts at that write set).

    >>> cover(Stripe(6, 3, 2)), cover(Stripe(5, 3, 2)), cover(Stripe(3, 3, 2))
    ((2, 5), (0, 2), (2,))
    >>> cover(Stripe(6, 3, 2), avoid={5}), cover(Stripe(6, 2, 1), avoid={1, 2})
    ((1, 2, 4), None)
    """
    sets = stripe.ensemble if stripe.striped else 1
    held: set[int] = set()
    chosen: list[int] = []
    for k in range(sets):
        if k in held:
            continue
        free = [p for p in stripe.write_set(k) if p not in avoid]
        if not free:
            return None
        best = max(reversed(free), key=lambda p: sum(
            1 for j in range(sets) if j not in held and stripe.holds(p, j)))
        chosen.append(best)
        held.update(j for j in range(sets) if stripe.holds(best, j))
    return tuple(sorted(chosen))


def chain_range(meta: StreamMeta, lo: int, hi: int | None) -> RangeMeta | None:
    """The range to read ``[lo, hi)`` of by chains: a sealed range of a striped stream,
    in the local tier, holding all of it; else None (read as before).

    >>> from estream.wire.meta import ReplicaRef
    >>> six = tuple(ReplicaRef(str(p), "") for p in range(6))
    >>> r = (RangeMeta(0, 0, 40, six), RangeMeta(1, 40, None, six))
    >>> chain_range(StreamMeta(1, "s", 3, 2, ranges=r, ensemble=6), 5, 40).index
    0
    >>> chain_range(StreamMeta(1, "s", 3, 2, ranges=r, ensemble=6), 40, None) is None
    True
    >>> chain_range(StreamMeta(1, "s", 3, 2, ranges=r), 5, 40) is None  # unstriped
    True
    """
    if not meta.striped or hi is None:
        return None
    for rng in meta.ranges:
        if (rng.end is not None and rng.start <= lo < hi <= rng.end and rng.tier == "local"
                and len(rng.replicas) == meta.ensemble):
            return rng
    return None


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    """A batch of a chain's answer: its ``index``, its offsets kept (``first`` .. ``end``,
    clipped to the read) and its decoded ``items``."""

    index: int
    first: int
    end: int
    items: list[T]


@dataclass(frozen=True, slots=True)
class Take(Generic[T]):
    """Deliver ``items`` (the next offsets, in order)."""

    items: list[T]


@dataclass(frozen=True, slots=True)
class Await:
    """Wait for the next answer of ``position``'s chain (:meth:`ChainMerge.add`, or
    :meth:`~ChainMerge.finish` / :meth:`~ChainMerge.failed` when it ends)."""

    position: int


@dataclass(frozen=True, slots=True)
class Fill:
    """No chain holds offset ``lo``: read ``[lo, hi)`` batch by batch, then
    :meth:`ChainMerge.filled`."""

    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class Finished:
    """Everything up to the stop is delivered."""


ChainStep = Take[T] | Await | Fill | Finished


class ChainMerge(Generic[T]):
    """The chains of ``positions`` merged into ``[start, stop)`` in offset order.

    >>> m = ChainMerge(Stripe(6, 3, 2), (2, 5), 0, 60)
    >>> m.step()
    Await(position=2)
    >>> m.add(2, [Batch(k, 10 * k, 10 * k + 10, [k]) for k in (0, 1, 2, 6)])
    >>> m.step()
    Take(items=[0, 1, 2])
    >>> m.step()
    Await(position=5)
    >>> m.add(5, [Batch(3, 30, 40, [3]), Batch(4, 40, 50, [4])])
    >>> m.finish(5)  # position 5 ends short of batch 5
    >>> m.step()
    Take(items=[3, 4])
    >>> m.step()
    Fill(lo=50, hi=60)
    >>> m.filled(60); m.step()
    Finished()
    """

    def __init__(self, stripe: Stripe, positions: Sequence[int], start: int, stop: int
                 ) -> None:
        self.stripe = stripe
        self.next_offset = start
        self.stop = stop
        self.next_index: int | None = None  # the next batch's index, once known
        self.queues: dict[int, deque[Batch[T]]] = {p: deque() for p in positions}
        self.done: set[int] = set()  # chains that ended (answered all, or failed)
        self.avoid: set[int] = set()  # positions that failed

    def add(self, position: int, batches: Sequence[Batch[T]]) -> None:
        """An answer of ``position``'s chain: its batches, in order."""
        self.queues[position].extend(batches)

    def finish(self, position: int) -> None:
        """``position``'s chain has nothing more for this read."""
        self.done.add(position)

    def failed(self, position: int) -> list[int]:
        """``position`` failed (an error, a timeout): it ends, and the positions to ask
        from :attr:`next_offset` on in its place (those a cover without every failed one
        adds; none when no cover is left: :class:`Fill` reads the rest batch by batch).

        >>> m = ChainMerge(Stripe(6, 3, 2), (2, 5), 0, 60)
        >>> m.failed(5), sorted(m.queues)
        ([1, 4], [1, 2, 4, 5])
        """
        self.done.add(position)
        self.avoid.add(position)
        positions = cover(self.stripe, self.avoid) or ()
        added = [p for p in positions if p not in self.queues or p in self.done]
        for p in added:
            self.queues[p] = deque()
            self.done.discard(p)
        return added

    def filled(self, hi: int) -> None:
        """``[next_offset, hi)`` was delivered batch by batch (a :class:`Fill`)."""
        self.next_offset = max(self.next_offset, hi)
        self.next_index = None

    def step(self) -> ChainStep[T]:
        """What to do next (see the classes)."""
        taken: list[T] = []
        progressed = True
        while progressed and self.next_offset < self.stop:
            progressed = False
            for queue in self.queues.values():
                while queue and queue[0].end <= self.next_offset:
                    queue.popleft()  # (another chain delivered it: a batch both hold)
                while queue and queue[0].first <= self.next_offset < queue[0].end:
                    batch = queue.popleft()
                    taken.extend(batch.items)
                    self.next_offset, self.next_index = batch.end, batch.index + 1
                    progressed = True
        if taken:
            return Take(taken)
        if self.next_offset >= self.stop:
            return Finished()
        waiting = [p for p, q in self.queues.items() if not q and p not in self.done]
        k = self.next_index
        holders = waiting if k is None else [p for p in waiting if self.stripe.holds(p, k)]
        if holders or waiting:  # (the others too: where the next chain goes on bounds a fill)
            return Await((holders or waiting)[0])
        heads = [q[0].first for q in self.queues.values() if q]
        return Fill(self.next_offset, min([self.stop, *heads]))


__all__ = [
    "Await", "Batch", "ChainMerge", "ChainStep", "Fill", "Finished", "Take",
    "queued_chain_answers_max", "chain_range", "cover",
]
