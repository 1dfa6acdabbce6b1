"""The test process's heap (tests/heap.py, tests/conftest.py): the session's heap is frozen
once collected and stays frozen after a test unfreezes it; the run's summary counts the
collections."""

from __future__ import annotations

import ast
import gc

from tests.heap import GcClock, keep_frozen
from tests.unit import test_limit_names


def test_the_session_heap_is_frozen_after_collection() -> None:
    # pytest's items and the modules: ~230,000 in a whole run, ~75,000 for one module
    assert gc.get_freeze_count() > 50_000


def test_a_test_that_unfroze_the_heap_leaves_it_frozen() -> None:
    assert not keep_frozen()  # frozen already: nothing to do
    gc.unfreeze()  # as estream.tune_gc's test and the hung-replica test's clean-up do
    assert gc.get_freeze_count() == 0
    assert keep_frozen()
    assert gc.get_freeze_count() > 50_000
    assert not keep_frozen()


def test_the_clock_counts_collections_full_ones_and_their_time() -> None:
    clock = GcClock()
    clock.start()
    try:
        gc.collect(0)
        gc.collect()
    finally:
        clock.stop()
    assert clock not in gc.callbacks
    assert (clock.passes, clock.full) == (2, 1) and clock.seconds > 0
    assert "2 collections (1 full)" in clock.summary()


def test_the_limit_walk_keeps_no_syntax_trees() -> None:
    """tests/unit/test_limit_names.py walked every module's tree and kept them all (its
    cache): ~480,000 objects every later full collection walked."""
    for cached in vars(test_limit_names).values():  # whatever the walk keeps, from now
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()
    gc.collect()
    before = sum(isinstance(o, ast.AST) for o in gc.get_objects())
    assert test_limit_names.all_limits()
    gc.collect()
    after = sum(isinstance(o, ast.AST) for o in gc.get_objects())
    assert after - before < 1_000
