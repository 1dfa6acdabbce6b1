"""``estream.tune_gc()`` (estream/net/gctune.py): the servers' GC settings, offered to
applications writing many streams: what exists is frozen, young collections are rare."""

from __future__ import annotations

import gc

import estream
from estream.net import gctune


def test_tune_gc_freezes_what_exists_and_makes_collections_rare() -> None:
    before = gc.get_threshold()
    try:
        estream.tune_gc()
        assert gc.get_threshold() == (gctune.gen0_allocations_default, 50, 1000)
        assert gc.get_freeze_count() > 0
        gctune.tune_gc(5_000)
        assert gc.get_threshold()[0] == 5_000
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
