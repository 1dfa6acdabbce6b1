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
everything else): :class:`Stuck` says so rather than hanging. Code runs in a context
naming its node (:data:`PROCESS`: the simulated network delivers to a node in its own); a
node's process made mortal can be killed (:meth:`SimLoop.kill`): from then on none of its
callbacks, timers or task steps runs (they are set aside, and run only to unwind once the
run is over: :meth:`SimLoop.revive_all`).

:class:`SimClock` is the :class:`~estream.net.clock.Clock` of a simulated process: both
readings move with the loop's virtual time.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
import random
import selectors
from collections.abc import Callable, Coroutine, Mapping
from contextvars import Context, ContextVar, copy_context
from typing import Any, Final, TypeVar

T = TypeVar("T")

TIE_BREAK_S: Final = 1e-10  # the seeded jitter that orders timers due at the same instant
WALL_AT_ZERO_MS: Final = 1_700_000_000_000  # the simulated wall clock when virtual time is 0
RUN_S_MAX: Final = 24 * 3600.0  # virtual time a run may take (a livelock ends as a failure)
# The node whose code runs (None: the world's own): what it schedules, its tasks included,
# carries it (asyncio copies the context).
PROCESS: Final[ContextVar[str | None]] = ContextVar("sim_process", default=None)


_CONTEXTS: dict[str, Context] = {}  # node -> a context naming it, copied for each use


def context_of(node: str) -> Context:
    """A fresh context for code of ``node`` (what the network delivers to it, say)."""
    context = _CONTEXTS.get(node)
    if context is None:
        context = _CONTEXTS[node] = Context()
        context.run(PROCESS.set, node)
    return context.copy()


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
        self.mortal: set[str] = set()  # processes that may be killed
        self.killed: set[str] = set()  # processes ended (kill -9): nothing of theirs runs
        # What a killed process would have run: (callback, args, context), for the unwinding.
        self._set_aside: list[tuple[Callable[..., object], tuple[Any, ...], Context]] = []

    def kill(self, process: str) -> None:
        """``process`` (made mortal first) ends at once: none of its callbacks, timers or
        task steps runs again (its tasks stay pending, as in a process that is gone)."""
        assert process in self.mortal, process
        self.killed.add(process)

    def revive_all(self) -> None:
        """The run is over: what the killed processes had pending runs (their tasks can
        then be cancelled and unwind, and none is left pending)."""
        self.killed.clear()
        set_aside, self._set_aside = self._set_aside, []
        for callback, args, context in set_aside:
            super().call_soon(callback, *args, context=context)

    def _guard(self, process: str, callback: Callable[..., object], *args: Any) -> None:
        if process in self.killed:
            self._set_aside.append((callback, args, copy_context()))
        else:
            callback(*args)

    def call_soon(  # type: ignore[override]
            self, callback: Callable[..., object], *args: Any,
            context: Context | None = None) -> asyncio.Handle:
        process = PROCESS.get() if context is None else context.get(PROCESS)
        if process in self.mortal:
            assert process is not None
            return super().call_soon(self._guard, process, callback, *args, context=context)
        return super().call_soon(callback, *args, context=context)

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
        process = PROCESS.get() if context is None else context.get(PROCESS)
        if process in self.mortal:
            assert process is not None
            return super().call_at(when + jitter, self._guard, process, callback, *args,
                                   context=context)
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
