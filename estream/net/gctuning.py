"""The cyclic GC kept off a process's latency path: :func:`tune_gc`, what every server runs
at start and what a latency-minded client may call once after start-up (``estream.tune_gc``,
README "Latency").

Side effects: the interpreter's garbage-collector settings.
"""

from __future__ import annotations

import gc
from typing import Final

gc_gen0_allocations: Final = 100_000  # allocations between young collections (CPython default: 700)


def tune_gc() -> None:
    """Freeze what the process holds now (never scanned again) and make collections rare:
    a young one every ``gc_gen0_allocations`` allocations, full ones almost never. Records
    are refcounted bytes, freed without the cyclic GC; a full collection walks every object
    of the process (tens of milliseconds for a client's start-up heap) and every append
    waiting meanwhile waits it out. A process that builds many reference cycles collects
    them itself (``gc.collect()`` at a quiet moment)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(gc_gen0_allocations, 50, 1000)


__all__ = ["gc_gen0_allocations", "tune_gc"]
