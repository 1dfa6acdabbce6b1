"""Recovery of a striped range: the end from the fence answers, and the copy plan.

:func:`decide_end` chooses the end from the sound fence answers of the ensemble
(:class:`~estream.wire.stripe.ChainEnd` per position): the first batch no answer holds
is not acknowledged once ``replicas - acks + 1`` positions of ITS write set answered (the
per-write-set quorum), so the range ends just before it; else it waits. :func:`plan_copies`
says which servers receive which batches so that every batch below the end is on ``acks``
servers of its own write set, or why that cannot be had now.

With E == replicas both reduce to today's :func:`~estream.core.quorum.seal_end_offset` and
:func:`~estream.core.quorum.copy_targets` (``tests/unit/core/test_stripedrecovery.py``:
those equivalences, and a naive model of every write history and set of answers).
Design and double faults: docs/ARCHITECTURE.md section 10. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from estream.core.striping import read_order
from estream.wire.stripe import ChainEnd, Stripe


@dataclass(frozen=True, slots=True)
class SealAt:
    """Seal the range with ``batches`` batches, ending at offset ``end``."""

    batches: int
    end: int


@dataclass(frozen=True, slots=True)
class WaitForAnswers:
    """Too few answers from ``write_set`` (the first batch no answer holds, ``index``):
    ``answered`` of them, ``needed`` required. Wait for more (the fence grace), else
    ``Unavailable``: deciding now could end below an acknowledged batch."""

    index: int
    write_set: tuple[int, ...]
    answered: int
    needed: int


@dataclass(frozen=True, slots=True)
class ReadBoundary:
    """The end is after batch ``index``, whose end offset no answer gave: read batch
    ``index`` from ``source`` (which holds it) and decide again with its end in
    ``known_ends``."""

    index: int
    source: int


EndDecision = SealAt | WaitForAnswers | ReadBoundary


def first_unheld(answers: Mapping[int, ChainEnd], stripe: Stripe) -> int:
    """The first batch index that no answering position holds (each holds every batch
    of its chain up to its ``last_index``). O(E x replicas): per write set (batch
    indexes modulo E), the longest chain among its answering members.

    >>> s = Stripe(5, 3, 2)
    >>> first_unheld({0: ChainEnd(5, 0), 1: ChainEnd(6, 0), 2: ChainEnd(7, 0)}, s)
    8
    >>> first_unheld({0: ChainEnd(5, 0), 1: ChainEnd(6, 0)}, s)  # 2 needs 2, 3 or 4
    2
    >>> first_unheld({0: ChainEnd(4, 0), 1: ChainEnd(4, 0)}, Stripe(3, 3, 2))
    5
    """
    e = stripe.ensemble
    best: int | None = None
    for r in range(e if stripe.striped else 1):
        longest = max((answers[p].last_index for p in stripe.write_set(r) if p in answers),
                      default=-1)
        k = longest + 1 + (r - longest - 1) % e if stripe.striped else longest + 1
        best = k if best is None else min(best, k)
    assert best is not None
    return best


def decide_end(
    answers: Mapping[int, ChainEnd], stripe: Stripe, *, start: int,
    known_ends: Mapping[int, int] | None = None,
) -> EndDecision:
    """The end to seal at, from the sound fence answers (position -> chain end).

    1. An answer sealed for good is final (the writer that sealed it froze that end at
       its confirm offset): :class:`SealAt` its batches and end.
    2. k = :func:`first_unheld`. Batch k is not acknowledged if ``replicas - acks + 1``
       members of its write set answered without it (an acknowledged batch is durable on
       ``acks`` of them, and a fenced sound server never gains one), and acknowledged
       batches are a prefix, so none after it is. Fewer answers there:
       :class:`WaitForAnswers`.
    3. Seal with k batches at the end of batch k-1: an answer whose chain ends there
       gives it, else ``known_ends``, else :class:`ReadBoundary` (its holders' chains go
       on past it).

    >>> s = Stripe(5, 3, 2)
    >>> a = {0: ChainEnd(5, 60), 1: ChainEnd(6, 70), 2: ChainEnd(7, 80)}
    >>> decide_end(a, s, start=0)                   # 8 is on 3, 4 or 0: 0 answered
    WaitForAnswers(index=8, write_set=(3, 4, 0), answered=1, needed=2)
    >>> decide_end({**a, 3: ChainEnd(7, 80)}, s, start=0)
    SealAt(batches=8, end=80)
    >>> b = {0: ChainEnd(0, 10), 2: ChainEnd(5, 60), 3: ChainEnd(1, 20), 4: ChainEnd(-1, 0)}
    >>> decide_end(b, s, start=0)                   # batch 2 only on 2, which has 5 too
    ReadBoundary(index=2, source=2)
    >>> decide_end(b, s, start=0, known_ends={2: 30})
    SealAt(batches=3, end=30)
    >>> decide_end({0: ChainEnd(-1, 0), 1: ChainEnd(-1, 0)}, Stripe(3, 3, 2), start=0)
    SealAt(batches=0, end=0)
    >>> decide_end({0: ChainEnd(3, 52, sealed=True, batches=4), 1: ChainEnd(6, 66)}, s,
    ...            start=0)
    SealAt(batches=4, end=52)
    """
    for answer in answers.values():
        if answer.sealed and answer.batches is not None:
            return SealAt(answer.batches, answer.end)
    k = first_unheld(answers, stripe)
    members = stripe.write_set(k)
    answered = sum(1 for p in members if p in answers)
    needed = stripe.tolerated + 1
    if answered < needed:
        return WaitForAnswers(k, members, answered, needed)
    if k == 0:
        return SealAt(0, start)
    for p in sorted(answers):
        if answers[p].last_index == k - 1:
            return SealAt(k, answers[p].end)
    if known_ends is not None and k - 1 in known_ends:
        return SealAt(k, known_ends[k - 1])
    holders = [p for p in stripe.write_set(k - 1) if p in answers
               and answers[p].last_index >= k - 1]
    return ReadBoundary(k - 1, min(holders))


@dataclass(frozen=True, slots=True)
class Copy:
    """Append to ``target`` its chain's batches after ``after_index`` and below
    ``batches``, in order, each read from a holder (:func:`sources_for`)."""

    target: int
    after_index: int
    batches: int


@dataclass(frozen=True, slots=True)
class CopyBlocked:
    """Batch ``index`` cannot reach ``acks`` servers of its write set now (``reason``:
    ``"no source"``, no sound answer holds it; ``"short"``, too few servers to write):
    ``Unavailable``, never a seal with it short."""

    index: int
    reason: str


def plan_copies(
    answers: Mapping[int, ChainEnd], batches: int, stripe: Stripe, *,
    lost: Collection[int] = (), bad_targets: Collection[int] = (),
) -> tuple[Copy, ...] | CopyBlocked:
    """The copies that put every batch below ``batches`` on ``acks`` servers of its own
    write set. ``lost``: answers whose reads failed (neither holders nor targets);
    ``bad_targets``: a copy to them failed (they still hold what they answered).

    Batches in order; where batch j has fewer than ``acks`` holders (its write set's
    answers holding it, plus targets already chosen, which receive their whole chain up
    to the end), the short answering members of its write set are added as targets, the
    longest chain first (least to copy), then by position; the copies come in that order.

    >>> s = Stripe(5, 3, 2)
    >>> a = {0: ChainEnd(5, 60), 1: ChainEnd(6, 70), 2: ChainEnd(7, 80),
    ...      3: ChainEnd(2, 30), 4: ChainEnd(2, 30)}
    >>> plan_copies(a, 8, s)                         # batch 3 on 0 only of 3 4 0
    (Copy(target=3, after_index=2, batches=8),)
    >>> plan_copies(a, 8, s, bad_targets={3})
    (Copy(target=4, after_index=2, batches=8),)
    >>> plan_copies({0: ChainEnd(5, 60), 1: ChainEnd(6, 70), 2: ChainEnd(7, 80)}, 8, s)
    CopyBlocked(index=2, reason='short')
    >>> plan_copies({0: ChainEnd(9, 90), 1: ChainEnd(4, 40)}, 10, Stripe(3, 3, 2))
    (Copy(target=1, after_index=4, batches=10),)
    """
    holding = {p: c.last_index for p, c in answers.items() if p not in lost}
    lowest = min(holding.values(), default=-1) + 1
    chosen: dict[int, int] = {}
    for j in _indexes_to_check(lowest, batches, stripe):
        members = stripe.write_set(j)
        held = [p for p in members if holding.get(p, -1) >= j]
        if not held:
            return CopyBlocked(j, "no source")
        have = len(held) + sum(1 for p in members if p in chosen)
        if have >= stripe.acks:
            continue
        short = sorted((p for p in members if p in holding and holding[p] < j
                        and p not in chosen and p not in bad_targets),
                       key=lambda p: (-holding[p], p))
        if len(short) < stripe.acks - have:
            return CopyBlocked(j, "short")
        for p in short[: stripe.acks - have]:
            chosen[p] = holding[p]
    ordered = sorted(chosen.items(), key=lambda item: (-item[1], item[0]))
    return tuple(Copy(p, last, batches) for p, last in ordered)


def _indexes_to_check(lowest: int, batches: int, stripe: Stripe) -> list[int]:
    """Below ``lowest`` every answer's chain holds every batch of it, so a batch's
    holders there depend only on its write set: one of each (at most E) is enough."""
    head = list(range(min(lowest, stripe.ensemble, batches)))
    return head + list(range(max(lowest, len(head)), batches))


def sources_for(
    j: int, answers: Mapping[int, ChainEnd], stripe: Stripe, *, lost: Collection[int] = ()
) -> list[int]:
    """The sound answering positions holding batch ``j``, to read it from, in
    :func:`~estream.core.striping.read_order` (longest run first, as a reader).

    >>> sources_for(3, {0: ChainEnd(5, 60), 3: ChainEnd(2, 30), 4: ChainEnd(3, 40)},
    ...             Stripe(5, 3, 2))
    [0, 4]
    """
    return [p for p in read_order(j, stripe)
            if p in answers and p not in lost and answers[p].last_index >= j]


__all__ = [
    "Copy",
    "CopyBlocked",
    "EndDecision",
    "ReadBoundary",
    "SealAt",
    "WaitForAnswers",
    "decide_end",
    "first_unheld",
    "plan_copies",
    "sources_for",
]
