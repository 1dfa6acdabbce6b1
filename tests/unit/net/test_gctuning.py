"""``estream.tune_gc`` (issue 32): the servers' GC settings, for a latency-minded client
too: what the process holds is frozen and young collections are rare."""

from __future__ import annotations

import gc

import estream
from estream.net import gctuning


def test_tune_gc_freezes_the_heap_and_makes_collections_rare() -> None:
    before = gc.get_threshold()
    try:
        estream.tune_gc()
        assert gc.get_threshold() == (gctuning.gc_gen0_allocations, 50, 1000)
        assert gc.get_freeze_count() > 0
        assert gc.get_count()[0] < 100  # collected before the freeze: nothing young left
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
