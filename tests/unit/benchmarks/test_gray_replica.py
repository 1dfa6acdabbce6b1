"""The gray-replica figures' pure parts: ``benchmarks/tailprobe.py``'s loop-stall probe
reports the stalls on both sides of the fault, within its window (the window's p99.9 counts
both), and ``tuned_gc`` (``compare.py``'s hung-replica row) tunes the client's GC for its
block only."""

from __future__ import annotations

from benchmarks.tailprobe import LoopStalls, tuned_gc


async def test_the_longest_stalls_are_those_within_the_window_on_both_sides() -> None:
    stalls = LoopStalls()
    stalls.stop()
    stalls.stalls = [(7.0, 30.0), (8.5, 12.0), (10.2, 20.0), (12.4, 5.0), (13.0, 90.0)]
    assert stalls.longest(10.0, 2.5) == [(0.2, 20.0), (-1.5, 12.0), (2.4, 5.0)]
    assert stalls.longest(10.0, 2.5, count=1) == [(0.2, 20.0)]


def test_the_hung_replica_row_tunes_the_gc_for_its_block_only() -> None:
    """``make bench``'s hung-replica row runs with ``estream.tune_gc()`` (a latency-minded
    client's option, said beside the row); the blocks after it get the interpreter's
    settings back."""
    import gc

    before = gc.get_threshold()
    with tuned_gc():
        assert gc.get_threshold() != before and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
