"""A seeded discrete-event world: fake clock, network faults and a placement driver (the
range servers are the real ones on the simulated disk and network:
:class:`~tests.sim.servernode.RangeServerNode`).

- :class:`World`: the clock (whole ms of virtual time) and the event queue, both a
  :class:`~tests.sim.simloop.SimLoop`'s; every random choice comes from the loop's one
  ``random.Random(seed)`` (events due at the same instant run in an order it chooses), so a
  seed replays exactly.
- :class:`Faults`: what the seed does to the world (partitions, down nodes, the resets'
  rate), shared with the :class:`~tests.sim.simtransport.SimNetwork` every request crosses
  in real frames.
- :class:`SimPD`: the real catalog core (``pd.catalog.Catalog.apply``) behind the network
  (``tests/sim/rpcfront.py``), with the placement decided by the real placement core
  (``pd.placement``) before each command, like the PD does; a server is suspected (no new
  ranges) once it has been unreachable for ``suspect_after_ms``.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from estream.wire.meta import ServerInfo, StreamMeta
from pd.catalog import Catalog
from pd.commands import CreateStream, OpenWriter, RegisterServer, SealRange
from pd.placement import Candidate, choose_replicas
from tests.sim.servernode import RangeServerNode
from tests.sim.simloop import SimClock, SimLoop

T = TypeVar("T")
Key = tuple[int, int]

SUSPECT_AFTER_MS = 200  # PD stops placing on a server unreachable this long
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
        self.loop.call_at(max(when_ms, self.now_ms) / 1000, fn)

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

    def fail(self, error: BaseException) -> None:
        """Fail the run with ``error`` (raised by the next :meth:`step`): what a task
        running on the loop hands over when an invariant it checks fails."""
        self._raised.append(error)

    def close(self) -> None:
        """Cancel what still runs on the loop (readers, clients), let it unwind (a bounded
        number of steps), then close the loop."""
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        for _ in range(CLOSE_STEPS_MAX):
            if all(task.done() for task in tasks):
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
    out_since: dict[str, int] = field(default_factory=dict)  # node -> down or hung since


# ------------------------------------------------------------------- placement driver


class SimPD:
    """The catalog core behind the network; placement is decided before proposing."""

    def __init__(
        self, world: World, faults: Faults, servers: dict[str, RangeServerNode]
    ) -> None:
        self.world = world
        self.faults = faults
        self.servers = servers  # by node
        self.catalog = Catalog()
        self.nodes: dict[str, str] = {}  # server id -> node
        for node, server in servers.items():
            self.register(server.server_id, node)

    def register(self, server_id: str, node: str) -> None:
        self.nodes[server_id] = node
        self.catalog.apply(RegisterServer(server_id, address_of(node), "ssd"))

    def alive(self, server_id: str) -> bool:
        """Heartbeats: a server is alive unless it has been unreachable (down or hung)
        for ``SUSPECT_AFTER_MS``; a wiped server's old id is never heard from again."""
        node = self.nodes[server_id]
        server = self.servers[node]
        if server.server_id != server_id:
            return False
        out = node in self.faults.down or server.hung
        since = self.faults.out_since.get(node, 0)
        return not out or self.world.now_ms - since < SUSPECT_AFTER_MS

    def list_servers(self) -> list[ServerInfo]:
        return [
            ServerInfo(sid, address_of(node), "ssd", self.alive(sid))
            for sid, node in sorted(self.nodes.items())
        ]

    def _place(self, count: int, exclude: tuple[str, ...]) -> tuple[str, ...]:
        rng = self.world.rng
        candidates = [
            Candidate(sid, "ssd", self.alive(sid), rng.randint(0, 2))
            for sid in sorted(self.nodes)
        ]
        return choose_replicas(candidates, count, exclude=exclude)

    def create_stream(self, name: str, replicas: int, ack_count: int) -> StreamMeta:
        placement = self._place(replicas, ())
        result = self.catalog.apply(CreateStream(name, replicas, ack_count, "", (), placement))
        assert isinstance(result, StreamMeta)
        return result

    def open_writer(self, name: str) -> StreamMeta:
        result = self.catalog.apply(OpenWriter(name))
        assert isinstance(result, StreamMeta)
        return result

    def seal_range(
        self, name: str, epoch: int, range_index: int, end: int, exclude: tuple[str, ...]
    ) -> StreamMeta:
        stream = self.catalog.stream(name)
        last = stream.last_range
        if last is not None and last.index != range_index:
            placement: tuple[str, ...] = ()  # a retry of a landed seal, or a stale one
        else:
            placement = self._place(stream.replicas, exclude)
        result = self.catalog.apply(SealRange(name, epoch, range_index, end, placement))
        assert isinstance(result, StreamMeta)
        return result

    def describe(self, name: str) -> StreamMeta:
        return self.catalog.stream(name)
