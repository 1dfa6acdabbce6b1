"""The test process's heap and the cyclic GC (tests/conftest.py calls these).

A full collection walks every tracked object the process holds. After collection the
session holds ~230,000 of them for good (pytest's items, the imported modules), and a
full pass over a heap that size costs a few hundred milliseconds on the CI machine,
dozens of times a run; a latency-bound test in the window sees it as its worst wait.
So the session's heap is frozen once collected (:func:`freeze_session_heap`), and frozen
again after a test that unfroze it (:func:`keep_frozen`: ``gc.unfreeze()`` is global, and
the clean-up of ``estream.tune_gc``'s test, of the Spark worker's, of benchmarks'
``tuned_gc`` and of the hung-replica test call it). :class:`GcClock` counts the
collections and their time for the run's summary.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Final

slow_pass_s: Final = 0.03  # a pass this long is listed in the summary's count


class _Thawed:
    """Whether ``gc.unfreeze()`` ran since the session's heap was last frozen."""

    since_freeze = False


_unfreeze: Final = gc.unfreeze


def _unfreeze_noticed() -> None:
    _unfreeze()
    _Thawed.since_freeze = True


def freeze_session_heap() -> None:
    """What the session holds now (collected first: no garbage is frozen) is never walked
    by a collection again."""
    gc.collect()
    gc.freeze()
    _Thawed.since_freeze = False


def notice_unfreezes() -> None:
    """``gc.unfreeze()`` (by a test, or code it runs) is noticed from now on. Asking the
    GC instead (``gc.get_freeze_count()``) walks every frozen object: 5-60 ms a call on
    a loaded machine, 23 s over the 381 tests of one module."""
    gc.unfreeze = _unfreeze_noticed


def keep_frozen() -> bool:
    """After a test: if it unfroze the heap, freeze it again; True if so. What the heap
    holds then is frozen with it (the module's fixtures too: the cycles among them, freed
    later, stay; a few modules' worth)."""
    if not _Thawed.since_freeze:
        return False
    freeze_session_heap()
    return True


@dataclass(eq=False)
class GcClock:
    """Every collection of the run: how many, how many full, their time, the slow ones."""

    passes: int = 0
    full: int = 0
    seconds: float = 0.0
    slow: int = 0
    longest_s: float = 0.0
    _started: float = field(default=0.0, repr=False)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.passes += 1
        self.full += info["generation"] == 2
        self.seconds += took
        self.slow += took >= slow_pass_s
        self.longest_s = max(self.longest_s, took)

    def start(self) -> None:
        gc.callbacks.append(self)

    def stop(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def summary(self) -> str:
        return (f"gc: {self.passes} collections ({self.full} full) {self.seconds:.1f}s, "
                f"{self.slow} of them over {slow_pass_s * 1000:.0f} ms, longest "
                f"{self.longest_s * 1000:.0f} ms; {len(gc.get_objects())} objects tracked, "
                f"{gc.get_freeze_count()} frozen")
