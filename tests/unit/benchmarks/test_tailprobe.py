"""``benchmarks/tailprobe.py``'s loop-stall probe: the gray-replica phase reports the
stalls on both sides of the fault, within its window (the window's p99.9 counts both)."""

from __future__ import annotations

from benchmarks.tailprobe import LoopStalls


async def test_the_longest_stalls_are_those_within_the_window_on_both_sides() -> None:
    stalls = LoopStalls()
    stalls.stop()
    stalls.stalls = [(7.0, 30.0), (8.5, 12.0), (10.2, 20.0), (12.4, 5.0), (13.0, 90.0)]
    assert stalls.longest(10.0, 2.5) == [(0.2, 20.0), (-1.5, 12.0), (2.4, 5.0)]
    assert stalls.longest(10.0, 2.5, count=1) == [(0.2, 20.0)]
