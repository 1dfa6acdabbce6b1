"""The read cursor's rules for a striped range (docs/ARCHITECTURE.md section 10, Reads).

:class:`BatchAt` is where the cursor stands in a striped range, by batch: the index and base
of a batch starting at or below the next offset (0 and the range's start at its start; +1
after each batch answered; ``"next"``'s index and base, ``locate``'s, for an offset inside
a range). :func:`batch_replicas` orders the servers of that batch's write set
(:func:`~estream.core.striping.read_order`: the longest run from it first, a tail's silent
servers last); :func:`walked` says where the cursor stands after an answer. With E ==
replicas none of this is used: :func:`stripe_of` is None and the cursor reads by offset,
as before. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final

from estream.core.quorum import seal_quorum
from estream.core.striping import read_order
from estream.wire.errors import MalformedFrame
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from estream.wire.rangeanswers import ReadAnswer
from estream.wire.record import iter_batches
from estream.wire.stripe import Stripe

fetches_at_once_max: Final = 4  # parts of a sealed striped range read side by side
part_records_min: Final = 1_000  # ...each at least this many records
queued_answers_max: Final = 2  # answers a part keeps ahead of the delivery, at most


@dataclass(frozen=True, slots=True)
class BatchAt:
    """Batch ``index`` of range ``range_index`` starts at offset ``base``."""

    range_index: int
    index: int
    base: int


def stripe_of(meta: StreamMeta) -> Stripe | None:
    """The stream's stripe when its ranges are striped (E > replicas), else None.

    >>> stripe_of(StreamMeta(1, "s", 3, 2, ensemble=5)), stripe_of(StreamMeta(1, "s", 3, 2))
    (Stripe(ensemble=5, replicas=3, acks=2), None)
    """
    if not meta.striped:
        return None
    return Stripe(meta.ensemble, meta.replicas, min(max(meta.ack_count, 1), meta.replicas))


Layout = tuple[Stripe, tuple[ReplicaRef, ...]]


def layout(meta: StreamMeta, rng: RangeMeta) -> Layout | None:
    """A striped range's stripe and servers in catalog order (where batch k is), None for
    an unstriped stream's.

    >>> r = RangeMeta(0, 0, 9, (ReplicaRef("a", ""),) * 4)
    >>> layout(StreamMeta(1, "s", 3, 2, ensemble=4), r)[0], layout(StreamMeta(1, "s"), r)
    (Stripe(ensemble=4, replicas=3, acks=2), None)
    """
    stripe = stripe_of(meta)
    return None if stripe is None else (stripe, rng.replicas)


def holding(ensemble: int, replicas: int, position: int, batches: int | None) -> str:
    """How much of a striped range the server at ``position`` holds, by the layout: with
    the range's batch count (a sealed range's), how many of them (``"6/9 batches"``); else
    its share, ``replicas`` of every ``ensemble`` batches (``"3/5"``). Operators see it
    beside each server (``estream stream describe``, the console).

    >>> holding(5, 3, 2, 9), holding(5, 3, 4, 9), holding(5, 3, 0, None), holding(5, 3, 2, 0)
    ('6/9 batches', '5/9 batches', '3/5', '0/0 batches')
    """
    if batches is None:
        return f"{replicas}/{ensemble}"
    stripe = Stripe(ensemble, replicas, 1)
    rounds, rest = divmod(batches, ensemble)
    held = rounds * replicas + sum(1 for k in range(rest) if stripe.holds(position, k))
    return f"{held}/{batches} batches"


def catch_up_pieces(
    meta: StreamMeta, start: int, end: int | None, *, parts_max: int = fetches_at_once_max,
    part_records_min: int = part_records_min,
) -> list[tuple[int, int | None, int]]:
    """``[start, end)`` as pieces ``(from, to, parts)`` in offset order: a sealed striped
    range (its part of the read) cut into ``parts`` pieces of equal offsets, read side by
    side (their consecutive runs come from different servers) and delivered in order;
    everything else one piece read as before (``parts`` 1; the last one open-ended when
    ``end`` is None). An unstriped stream is one piece: today's read.

    >>> r = (RangeMeta(0, 0, 4000, ()), RangeMeta(1, 4000, None, ()))
    >>> catch_up_pieces(StreamMeta(1, "s", 3, 2, ranges=r, ensemble=6), 1000, None)
    [(1000, 4000, 3), (4000, None, 1)]
    >>> catch_up_pieces(StreamMeta(1, "s", 3, 2, ranges=r), 1000, None)
    [(1000, None, 1)]
    """
    if stripe_of(meta) is None or not meta.holds_offset(start):
        return [(start, end, 1)]
    pieces: list[tuple[int, int | None, int]] = []
    at = start
    for rng in meta.ranges:
        if rng.end is None or rng.end <= at or rng.start > at or (end is not None and end <= at):
            continue
        stop = rng.end if end is None else min(end, rng.end)
        parts = max(1, min(parts_max, (stop - at) // max(1, part_records_min)))
        pieces.append((at, stop, parts))
        at = stop
    if end is None or at < end:
        pieces.append((at, end, 1))
    return pieces


def cut(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` in ``parts`` pieces of equal offsets (the last takes the rest).

    >>> cut(1000, 4000, 3), cut(0, 5, 2)
    ([(1000, 2000), (2000, 3000), (3000, 4000)], [(0, 2), (2, 5)])
    """
    step = (hi - lo) // parts
    bounds = [lo + i * step for i in range(parts)] + [hi]
    return list(zip(bounds, bounds[1:], strict=False))


def batch_at(rng: RangeMeta, offset: int, known: BatchAt | None) -> BatchAt | None:
    """Where a read of ``rng`` at ``offset`` goes on by batch: ``known`` if it is of this
    range and at or below ``offset``; batch 0 at the range's start; else None (unknown:
    ask by offset, a server answers ``locate``'s batch).

    >>> r = RangeMeta(2, 100, None, ())
    >>> batch_at(r, 100, None), batch_at(r, 130, BatchAt(2, 3, 125)), batch_at(r, 130, None)
    (BatchAt(range_index=2, index=0, base=100), BatchAt(range_index=2, index=3, base=125), None)
    >>> batch_at(r, 130, BatchAt(1, 3, 125)) is None
    True
    """
    if known is not None and known.range_index == rng.index and known.base <= offset:
        return known
    if offset == rng.start:
        return BatchAt(rng.index, 0, rng.start)
    return None


def batch_replicas(
    rng: RangeMeta, stripe: Stripe, at: BatchAt, *, first: str | None = None,
    last: Collection[str] = (),
) -> list[ReplicaRef]:
    """The servers of batch ``at``'s write set to ask, in order: :func:`read_order`'s
    (the longest run from it first), ``first`` (a tail's server to poll next) moved to the
    front, the servers in ``last`` (a tail's servers that did not answer lately) after
    the others.

    >>> rng = RangeMeta(0, 0, None, tuple(ReplicaRef(s, "") for s in "abcde"))
    >>> [r.id for r in batch_replicas(rng, Stripe(5, 3, 2), BatchAt(0, 4, 40))]
    ['b', 'a', 'e']
    >>> [r.id for r in batch_replicas(rng, Stripe(5, 3, 2), BatchAt(0, 4, 40), last={"b"})]
    ['a', 'e', 'b']
    >>> [r.id for r in batch_replicas(rng, Stripe(5, 3, 2), BatchAt(0, 4, 40), first="e")]
    ['e', 'b', 'a']
    """
    ids = [r.id for r in rng.replicas]
    hung = {ids.index(i) for i in last if i in ids}
    order = [rng.replicas[p] for p in read_order(at.index, stripe, last=hung)
             if p < len(rng.replicas)]
    return ([r for r in order if r.id == first and r.id not in last]
            + [r for r in order if r.id != first or r.id in last])


def empties_needed(stripe: Stripe | None, asked: int, ack_count: int) -> int:
    """How many of ``asked`` servers must answer with nothing readable before a plain
    read ends on the open range: a seal quorum of them (an acknowledged batch is on
    ``ack_count`` of its write set, and its confirm reached them once its writer closed).
    By batch, the write set's (``replicas`` asked); by offset, the whole ensemble's, which
    leaves out at most ``ack_count - 1`` servers of any write set.

    >>> empties_needed(Stripe(5, 3, 2), 3, 2), empties_needed(Stripe(5, 3, 2), 5, 2)
    (2, 4)
    >>> empties_needed(None, 3, 2)
    2
    """
    return seal_quorum(asked, min(max(ack_count, 1), asked))


def walked(
    at_range: int, indexes: Sequence[int] | None, last_end: int | None, next_offset: int,
    located: tuple[int, int] | None,
) -> BatchAt | None:
    """Where the cursor stands after a striped answer: after its last batch (index + 1,
    at that batch's end) when everything up to it was taken (``next_offset`` there, or
    past it: the batches all below the offset, a walk); at ``located`` (the server's
    ``"next"``) when it named one; else unknown (None).

    >>> walked(0, [3, 4], 50, 50, None), walked(0, [3, 4], 50, 45, None)
    (BatchAt(range_index=0, index=5, base=50), None)
    >>> walked(0, None, None, 30, (2, 20))
    BatchAt(range_index=0, index=2, base=20)
    """
    if indexes and last_end is not None:
        return BatchAt(at_range, indexes[-1] + 1, last_end) if last_end <= next_offset else None
    if located is not None:
        return BatchAt(at_range, located[0], located[1])
    return None


def striped_fields(
    answer: ReadAnswer,
) -> tuple[tuple[int, ...], int | None, tuple[int, int] | None]:
    """Of a READ answer, :class:`~estream.core.readcursor.Answer`'s ``indexes``, ``last_end``
    and ``located``: a striped replica's batch indexes, its last batch's end and its
    ``"next"``; ``((), None, None)`` for an unstriped one's. Raises
    :class:`MalformedFrame` when the indexes do not match the batches."""
    if answer.batches is None:
        return (), None, answer.next
    ends = [header.end_offset for header, _ in iter_batches(answer.payload)]
    if len(ends) != len(answer.batches):
        raise MalformedFrame(f"{len(answer.batches)} batch indexes for {len(ends)} batches")
    return tuple(answer.batches), ends[-1] if ends else None, answer.next

__all__ = [
    "BatchAt", "Layout", "batch_at", "batch_replicas", "catch_up_pieces", "cut",
    "empties_needed", "queued_answers_max", "fetches_at_once_max", "holding", "layout",
    "part_records_min", "stripe_of", "striped_fields", "walked",
]
