"""Which replicas the log carries forward (rangeserver/carry.py): worked examples."""

from __future__ import annotations

from rangeserver.carry import Candidate, choose
from rangeserver.retention import Span

MiB = 1024 * 1024


def c(key: int, first: int, last: int, size: int = 0, idle: bool = True) -> Candidate:
    return Candidate((key, 0), Span(first, last), size, idle)


def test_idle_replicas_pinning_the_oldest_segments_are_carried_oldest_first() -> None:
    live = [c(1, 0, 9), c(2, 3, 9, MiB), c(3, 9, 9)]
    assert choose(range(10), 9, live, 64 * MiB) == [(1, 0), (2, 0)]


def test_a_segment_a_busy_replica_covers_is_left_and_so_are_its_idle_neighbours() -> None:
    live = [c(1, 0, 0, idle=False), c(2, 0, 0), c(3, 1, 2)]
    assert choose(range(4), 3, live, 64 * MiB) == [(3, 0)], "segment 0 stays anyway"


def test_the_byte_budget_bounds_a_round() -> None:
    live = [c(1, 0, 5, 40 * MiB), c(2, 1, 5, 30 * MiB), c(3, 2, 5, 10 * MiB)]
    assert choose(range(6), 5, live, 64 * MiB) == [(1, 0)]
    assert choose(range(6), 5, live, 80 * MiB) == [(1, 0), (2, 0), (3, 0)]


def test_nothing_at_or_after_the_head_and_nothing_in_free_segments() -> None:
    assert choose([4, 5], 4, [c(1, 4, 5)], 64 * MiB) == []
    assert choose([0, 1, 2], 2, [c(1, 2, 2)], 64 * MiB) == [], "0 and 1 pinned by nobody"
    assert choose([], 0, [], MiB) == []


def test_a_replica_pinning_several_segments_is_carried_once() -> None:
    live = [c(1, 0, 7, MiB), c(2, 2, 2)]
    assert choose(range(8), 7, live, 2 * MiB) == [(1, 0), (2, 0)]
