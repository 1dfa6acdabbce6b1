"""A seeded discrete-event world: virtual clock, network faults and the real PD node (the
range servers are the real ones on the simulated disk and network:
:class:`~tests.sim.servernode.RangeServerNode`).

- :class:`World`: the clock (whole ms of virtual time) and the event queue, both a
  :class:`~tests.sim.simloop.SimLoop`'s; every random choice comes from the loop's one
  ``random.Random(seed)`` (events due at the same instant run in an order it chooses), so a
  seed replays exactly.
- :class:`Faults`: what the seed does to the world (partitions, down nodes, the resets'
  rate), shared with the :class:`~tests.sim.simtransport.SimNetwork` every request crosses
  in real frames.
- :func:`pd_node`: the real PD node (:class:`~pd.shell.node.PlacementDriverNode`) on
  :class:`~tests.sim.simraft.SimRaft`, answering on the simulated network; the range
  servers heartbeat to it, and it suspects those it no longer hears from.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from estream.net.clock import Clock
from pd.shell.node import PdConfig, PlacementDriverNode
from tests.sim.simloop import SimClock, SimLoop, context_of
from tests.sim.simraft import SimRaft
from tests.sim.simtransport import SimNetwork

T = TypeVar("T")

PD_NODE: Final = "pd"
PD_ADDRESS: Final = "127.0.0.1:7100"
PD_HTTP: Final = "127.0.0.1:7101"  # published in the catalog; no admin HTTP is served here
CLOSE_STEPS_MAX = 10_000  # World.close: steps for the cancelled tasks to unwind


def address_of(node: str) -> str:
    return f"127.0.0.1:{7200 + int(node[1:])}"


def node_of(address: str) -> str:
    return f"s{int(address.rsplit(':', 1)[1]) - 7200}"


class World:
    """The clock and the event queue: a :class:`~tests.sim.simloop.SimLoop` (virtual time;
    events due at the same millisecond run in an order the seed chooses)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.loop = SimLoop(seed)
        self.rng = self.loop.rng  # one seeded source for every choice (and timer ties)
        self.clock = SimClock(self.loop)
        self.steps = 0
        # An event that raises (an invariant's AssertionError included) fails the run: the
        # loop hands it here instead of logging it, and step() raises it.
        self._raised: list[BaseException] = []
        self.loop.set_exception_handler(self._on_exception)

    def _on_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        self._raised.append(error if error is not None else RuntimeError(context["message"]))

    @property
    def now_ms(self) -> int:
        """Virtual time in whole milliseconds (events are scheduled on whole ones; the
        seeded tie-break the loop adds is far below one)."""
        return round(self.loop.time() * 1000)

    def at(self, when_ms: int, fn: Callable[[], None]) -> None:
        """``fn`` at ``when_ms``, as the world's own event (whichever process asked)."""
        self.loop.call_at(max(when_ms, self.now_ms) / 1000, fn, context=contextvars.Context())

    def after(self, delay_ms: int, fn: Callable[[], None]) -> None:
        self.at(self.now_ms + delay_ms, fn)

    def step(self) -> bool:
        """Run what is due at the next instant (virtual time jumps there); False when
        nothing is left to run."""
        loop = self.loop
        if not loop._ready and not loop._scheduled:
            return False
        asyncio.events._set_running_loop(loop)
        try:
            loop._run_once()
        finally:
            asyncio.events._set_running_loop(None)
        self.steps += 1
        if self._raised:
            raise self._raised.pop(0)
        return True

    def inside(self, fn: Callable[[], T]) -> T:
        """``fn()`` as if run by the loop (the test's own code calling into a shell that
        starts tasks or calls: they must land on this loop, not on another)."""
        if asyncio.events._get_running_loop() is self.loop:
            return fn()
        asyncio.events._set_running_loop(self.loop)
        try:
            return fn()
        finally:
            asyncio.events._set_running_loop(None)

    def as_process(self, process: str, fn: Callable[[], T]) -> T:
        """:meth:`inside`, as simulated process ``process``: what ``fn`` starts (tasks,
        timers, callbacks) belongs to it, and stops for good at :meth:`kill`."""
        self.loop.mortal.add(process)
        return context_of(process).run(self.inside, fn)

    def kill(self, process: str) -> None:
        """``process`` dies (kill -9): nothing it started runs again."""
        self.loop.kill(process)

    def fail(self, error: BaseException) -> None:
        """Fail the run with ``error`` (raised by the next :meth:`step`): what a task
        running on the loop hands over when an invariant it checks fails."""
        self._raised.append(error)

    def close(self) -> None:
        """Cancel what still runs on the loop (readers, clients), let it unwind (a bounded
        number of steps), then close the loop."""
        self.loop.revive_all()  # the dead processes' tasks unwind too
        cancelled: set[asyncio.Task[Any]] = set()
        for _ in range(CLOSE_STEPS_MAX):
            # Tasks started while unwinding are cancelled as well.
            tasks = asyncio.all_tasks(self.loop) - cancelled
            for task in tasks:
                task.cancel()
            cancelled |= tasks
            if all(task.done() for task in cancelled):
                break
            try:
                if not self.step():
                    break
            except Exception:  # noqa: BLE001, S112 - the run is over: only unwinding
                continue
        self.loop.close()


@dataclass
class Faults:
    drop: float = 0.0  # chance per write that a connection resets (SimNetwork's reset_rate)
    partitions: set[frozenset[str]] = field(default_factory=set)
    down: set[str] = field(default_factory=set)


# ------------------------------------------------------------------- placement driver


def pd_node(net: SimNetwork, raft: SimRaft, clock: Clock, data_dir: Path
            ) -> PlacementDriverNode:
    """The real PD node (its service, RPC port and leader rounds) on the simulator's
    ports, node ``PD_NODE`` of ``net`` at ``PD_ADDRESS``; no admin HTTP (aiohttp needs real
    sockets)."""
    config = PdConfig("pd-1", PD_ADDRESS, raft.self_address, PD_HTTP, data_dir)
    return PlacementDriverNode(config, raft=raft, network=net.node(PD_NODE), clock=clock,
                               serve_http=False)
