"""``estream.tune_gc()``: run a process's cyclic GC as estream's own servers run theirs.

CPython collects its young generation every 700 container allocations, and each older
collection walks every object of the process. A client writing many streams at once (one
writer per stream, each with little in flight) allocates a few futures, effects and
callbacks per record and keeps every open writer and pending append in its heap, so the
collections come often and walk far: about a quarter of such a client's CPU (the spread of
``benchmarks/bench_scale.py``, benchmarks/RESULTS.md "Scale"). The SDK leaves the
application's GC settings alone; an application writing many streams at high rates can
call this once its writers are open. Records, requests and answers are refcounted and freed
without the cyclic GC; what it costs is that cycles the application makes are found later.

Side effects: the interpreter's GC state (collects now, freezes what exists, thresholds).
"""

from __future__ import annotations

import gc
from typing import Final

gen0_allocations_default: Final = 100_000  # between young collections (CPython's: 700)


def tune_gc(gen0_allocations: int = gen0_allocations_default) -> None:
    """Collect once, freeze what exists (never scanned again: modules, what start-up or
    recovery loaded, the writers opened so far), then collect the young generation every
    ``gen0_allocations`` container allocations, the older ones 50 and 1,000 times rarer
    (CPython's ratios are 10 and 10)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0_allocations, 50, 1000)


__all__ = ["gen0_allocations_default", "tune_gc"]
