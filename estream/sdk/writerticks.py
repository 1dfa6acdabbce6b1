"""One loop timer for a client's writers' ticks (:class:`WriterTicks`): what
:meth:`~estream.sdk.effects.EffectRunner.arm_timer` arms instead of a loop timer per
writer and event (as :mod:`estream.net.deadlines` does for request deadlines).

A writer's core has work at its next deadline (a linger, an idle CONFIRM, a chase bound:
``WriterCore.next_deadline_ms``). With a writer per stream a record is its own batch, and
each writer armed a loop timer (``call_later``: a ``TimerHandle`` and a copied context)
about twice per record, at a completion and at a cut, then cancelled it or let it fire.
Here a writer's tick is an entry ``(when, seq, runner)`` in one heap in deadline order
(``seq``: arm order, for ties), and one loop timer is armed at the earliest. When it
fires, each due entry still its runner's (``runner.tick == seq``) runs the runner's
``on_tick``; re-armed or cancelled ones are stale and dropped when they come to the front.
Cancelling and re-arming cost the heap nothing but the new entry; once no writer waits
for a tick, the heap is emptied and the loop timer cancelled.

Side effects: one loop timer (``call_at``) while some writer waits for a tick.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from typing import Protocol

log = logging.getLogger("estream.sdk.writer")


class Ticking(Protocol):
    """A writer's effect runner: ``tick`` is the seq of its entry (0: none armed)."""

    tick: int

    def on_tick(self) -> None: ...


class WriterTicks:
    """One client's writers' ticks on one event loop (module docstring)."""

    __slots__ = ("_firing", "_heap", "_seq", "_timer", "_timer_at", "armed", "loop")

    def __init__(self) -> None:
        # The loop of the writers that wait (a client's writers live in one loop at a time).
        self.loop: asyncio.AbstractEventLoop | None = None
        self._heap: list[tuple[float, int, Ticking]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._firing = False  # _fire arms the loop timer at its end
        self.armed = 0  # runners with a tick armed

    def arm(self, runner: Ticking, delay_s: float) -> None:
        """``runner.on_tick()`` ``delay_s`` from now (its tick armed before, if any, is
        replaced)."""
        loop = self.loop
        if not runner.tick:
            if not self.armed:
                self.loop = loop = asyncio.get_running_loop()
            self.armed += 1
        assert loop is not None
        self._seq = seq = self._seq + 1
        runner.tick = seq
        when = loop.time() + delay_s
        heapq.heappush(self._heap, (when, seq, runner))
        if self._firing:
            return
        if self._timer is None or when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = loop.call_at(when, self._fire)

    def cancel(self, runner: Ticking) -> None:
        """``runner``'s armed tick, if any, does not run."""
        if runner.tick:
            runner.tick = 0
            self.armed -= 1
            if not self.armed:  # nobody waits: nothing to keep
                self._heap.clear()
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None

    def _fire(self) -> None:
        self._timer = None
        loop = self.loop
        assert loop is not None
        # What the loop timer was armed for is due, even if the loop's clock reads a little
        # earlier (a loop runs a timer within its clock resolution of its time).
        heap, now = self._heap, max(loop.time(), self._timer_at)
        self._firing = True
        try:
            self._run_due(heap, now)
        finally:
            self._firing = False
        if not self.armed:
            heap.clear()
        else:
            while heap[0][2].tick != heap[0][1]:
                heapq.heappop(heap)  # stale: no timer for them
            self._timer_at = heap[0][0]
            self._timer = loop.call_at(self._timer_at, self._fire)

    def _run_due(self, heap: list[tuple[float, int, Ticking]], now: float) -> None:
        while heap and heap[0][0] <= now:
            _, seq, runner = heapq.heappop(heap)
            if runner.tick != seq:
                continue  # re-armed or cancelled
            runner.tick = 0
            self.armed -= 1
            try:
                runner.on_tick()  # may arm again: at least timer_min_s from now
            except Exception:  # noqa: BLE001 - one writer's fault spares the others' ticks
                log.exception("a writer's tick failed")


__all__ = ["Ticking", "WriterTicks"]
