"""A deterministic asyncio event loop on virtual time, and the clock that reads it.

:class:`SimLoop` is an ``asyncio.BaseEventLoop`` whose ``time()`` is virtual: when nothing
is ready it jumps straight to the next timer instead of waiting, so ``asyncio.sleep(3600)``
takes no real time, and every timer, ``wait_for`` deadline and RPC timeout of the real
shells runs on that virtual time. It has no selector and no file descriptors: the only
I/O is the simulated network's (tests/sim/simtransport.py), which schedules its
deliveries as timers. Ready callbacks run in asyncio's order (FIFO, which the shells rely
on); timers due at the same instant run in an order chosen by the seed (a sub-nanosecond
seeded tie-break), so a seed explores one interleaving of simultaneous events and replays
it exactly. A loop with nothing ready and no timer is stuck (everything waits on
everything else): :class:`Stuck` says so rather than hanging.

:class:`SimClock` is the :class:`~estream.net.clock.Clock` of a simulated process: both
readings move with the loop's virtual time.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
import random
import selectors
from collections.abc import Callable, Coroutine, Mapping
from contextvars import Context
from typing import Any, Final, TypeVar

T = TypeVar("T")

TIE_BREAK_S: Final = 1e-10  # the seeded jitter that orders timers due at the same instant
WALL_AT_ZERO_MS: Final = 1_700_000_000_000  # the simulated wall clock when virtual time is 0
RUN_S_MAX: Final = 24 * 3600.0  # virtual time a run may take (a livelock ends as a failure)


class Stuck(RuntimeError):
    """Nothing is ready and no timer is set: every task waits on another (a deadlock)."""


class _VirtualSelector(selectors.BaseSelector):
    """What ``BaseEventLoop._run_once`` polls: no descriptors; waiting ``timeout``
    seconds moves the virtual clock by that much at once."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        raise NotImplementedError("the simulated loop has no file descriptors")

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        raise NotImplementedError("the simulated loop has no file descriptors")

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Stuck(f"nothing ready and no timer at virtual time {self._loop.time():.3f}s")
        if timeout > 0:
            self._loop.advance(timeout)
        return []

    def close(self) -> None:
        pass

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return {}


class SimLoop(asyncio.BaseEventLoop):
    """An event loop on virtual time (see the module)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self.rng = random.Random(seed)  # the loop's own draws (timer ties)
        self._now = 0.0
        self._selector = _VirtualSelector(self)

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (the selector does, when the loop is idle)."""
        assert seconds >= 0, "virtual time never goes back"
        self._now += seconds
        if self._now > RUN_S_MAX:
            raise Stuck(f"virtual time passed {RUN_S_MAX}s: a livelock?")

    def call_at(  # type: ignore[override]
            self, when: float, callback: Callable[..., object], *args: Any,
            context: Context | None = None) -> asyncio.TimerHandle:
        jitter = self.rng.random() * TIE_BREAK_S
        return super().call_at(when + jitter, callback, *args, context=context)

    def _process_events(self, event_list: list[Any]) -> None:
        pass  # no descriptors: the simulated network delivers through timers

    def _write_to_self(self) -> None:
        pass  # call_soon_threadsafe: the loop never blocks, nothing to wake

    def run_in_executor(  # type: ignore[override]
            self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``func`` now, on the loop (a thread's timing would not replay)."""
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
            future.set_exception(exc)
        return future


class SimClock:
    """The :class:`~estream.net.clock.Clock` of a simulated process: the loop's time."""

    __slots__ = ("loop",)

    def __init__(self, loop: SimLoop) -> None:
        self.loop = loop

    def monotonic_s(self) -> float:
        return self.loop.time()

    def monotonic_ms(self) -> int:
        return int(self.loop.time() * 1000)

    def wall_ms(self) -> int:
        return WALL_AT_ZERO_MS + int(self.loop.time() * 1000)


def run(main: Coroutine[Any, Any, T], seed: int) -> T:
    """Run ``main`` to completion on a fresh :class:`SimLoop` (like ``asyncio.run``)."""
    with asyncio.Runner(loop_factory=lambda: SimLoop(seed)) as runner:
        return runner.run(main)
