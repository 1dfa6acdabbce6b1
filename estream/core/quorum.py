"""Quorum math of the 2/3 chasing write and of recovery, as small named functions.

Three numbers decide everything:

- a range has ``replicas`` replicas (3 by default);
- an append is acknowledged once ``acks`` of them hold it durably (2 by default);
- a replica's *end* is its durable, contiguous end: it holds every offset below it.

Replicas accept only contiguous appends, so an end is enough to say which offsets a
replica holds. Each function below carries worked examples; the same rows are a
parametrized test in ``tests/unit/core/test_quorum.py``, beside a property test against a
naive model that enumerates which replicas hold which offsets.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def seal_quorum(replicas: int, acks: int) -> int:
    """How many replicas must answer a fencing SEAL before an end can be chosen.

    An acknowledged offset is on ``acks`` replicas, so at most ``replicas - acks`` replicas
    can lack it; hearing from one more than that guarantees at least one answer holds it.

    >>> seal_quorum(3, 2)
    2
    >>> seal_quorum(3, 3)
    1
    >>> seal_quorum(5, 3)
    3
    >>> seal_quorum(1, 1)
    1
    """
    if not 1 <= acks <= replicas:
        raise ValueError(f"need 1 <= acks <= replicas, got acks={acks} replicas={replicas}")
    return replicas - acks + 1


def confirm_offset(acked_ends: Iterable[int], acks: int, *, start: int = 0) -> int:
    """The confirmed end: the ``acks``-th highest acknowledged end among the replicas.

    Every offset below it is durable on at least ``acks`` replicas. ``start`` (the range's
    first offset) is the answer while fewer than ``acks`` replicas have acknowledged.

    >>> confirm_offset([10, 7, 3], 2)
    7
    >>> confirm_offset([10, 7, 3], 3)
    3
    >>> confirm_offset([10, 7, 3], 1)
    10
    >>> confirm_offset([10], 2, start=4)
    4
    >>> confirm_offset([5, 5, 0], 2)
    5
    """
    if acks < 1:
        raise ValueError(f"acks must be >= 1, got {acks}")
    ordered = sorted(acked_ends, reverse=True)
    if len(ordered) < acks:
        return start
    return max(start, ordered[acks - 1])


def seal_end_offset(answers: Mapping[str, int], replicas: int, acks: int) -> int | None:
    """Recovery: the end to seal an abandoned open range at, or None without a quorum.

    ``answers`` maps each replica that answered the fencing SEAL to its durable end.
    With at least :func:`seal_quorum` answers, at least one of them holds every
    acknowledged offset, so the largest answered end is at or beyond every acknowledged
    record. (It may also cover records that were written but never acknowledged; keeping
    them is safe. Before the seal is committed, the records below the end are copied to at
    least ``acks`` replicas, see :func:`copy_targets`.)

    >>> seal_end_offset({"a": 10, "b": 7}, 3, 2)
    10
    >>> seal_end_offset({"a": 10}, 3, 2) is None
    True
    >>> seal_end_offset({"a": 4}, 3, 3)
    4
    >>> seal_end_offset({"a": 0, "b": 0, "c": 0}, 3, 2)
    0
    """
    if len(answers) < seal_quorum(replicas, acks):
        return None
    return max(answers.values())


def copy_targets(answers: Mapping[str, int], end: int, acks: int) -> list[str]:
    """The answered replicas short of ``end`` that recovery must copy records to, so that
    at least ``acks`` replicas (or every answered one, if fewer) hold everything below it.

    Shortest-first is not needed; the longest are chosen since they need the least copying.

    >>> copy_targets({"a": 10, "b": 7, "c": 3}, 10, 2)
    ['b']
    >>> copy_targets({"a": 10, "b": 10}, 10, 2)
    []
    >>> copy_targets({"a": 10, "b": 3}, 10, 3)
    ['b']
    """
    full = [r for r, e in answers.items() if e >= end]
    short = sorted((r for r, e in answers.items() if e < end), key=lambda r: (-answers[r], r))
    missing = max(0, acks - len(full))
    return short[:missing]


__all__ = ["confirm_offset", "copy_targets", "seal_end_offset", "seal_quorum"]
