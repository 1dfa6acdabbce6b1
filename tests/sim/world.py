"""A seeded discrete-event world for the writer's cores: fake clock, network, range servers
and a placement driver.

- :class:`World`: the clock (integer ms) and the event queue; every random choice comes
  from one ``random.Random(seed)``, so a seed replays exactly.
- :class:`Net`: request/response between nodes with per-link FIFO delivery (TCP keeps
  order on a connection), random delays (links reorder against each other), drops of
  requests or responses, partitions between two nodes, crashed nodes, and request
  timeouts (an unknown outcome).
- :class:`SimRangeServer`: range replicas following the range server's rules
  (docs/ARCHITECTURE.md 3.3): contiguous appends, epoch fencing, seal with and without an
  end, idempotent CREATE_RANGE, confirm offsets. Appends are durable when accepted; a
  crash loses nothing but availability.
- :class:`SimPD`: the real catalog core (``pd.catalog.Catalog.apply``) behind the network,
  with the placement decided (seeded) before each command, like the PD does.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from estream.errors import (
    Conflict,
    EstreamError,
    Fenced,
    NoPlacement,
    OffsetGap,
    RangeNotFound,
    RangeSealed,
    Timeout,
    Unavailable,
)
from estream.meta import StreamMeta
from estream.record import decode_batch
from pd.catalog import Catalog
from pd.commands import CreateStream, OpenWriter, RegisterServer, SealRange

OnOk = Callable[[Any], None]
OnErr = Callable[[EstreamError], None]


class World:
    """The clock and the event queue."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 0
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self.steps = 0

    def at(self, when_ms: int, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (max(when_ms, self.now_ms), self._seq, fn))

    def after(self, delay_ms: int, fn: Callable[[], None]) -> None:
        self.at(self.now_ms + delay_ms, fn)

    def step(self) -> bool:
        if not self._queue:
            return False
        when, _, fn = heapq.heappop(self._queue)
        self.now_ms = when
        self.steps += 1
        fn()
        return True

    def pending(self) -> int:
        return len(self._queue)


@dataclass
class Faults:
    drop: float = 0.0  # probability a request or a response is lost
    spike: float = 0.0  # probability of a 20..80 ms delay
    partitions: set[frozenset[str]] = field(default_factory=set)
    down: set[str] = field(default_factory=set)


class Net:
    """Requests and responses between named nodes (see the module docstring)."""

    def __init__(self, world: World, faults: Faults) -> None:
        self.world = world
        self.faults = faults
        self.nodes: dict[str, Any] = {}
        self._link_free_ms: dict[tuple[str, str], int] = {}

    def _cut(self, a: str, b: str) -> bool:
        f = self.faults
        return frozenset((a, b)) in f.partitions or a in f.down or b in f.down

    def _delay(self, src: str, dst: str) -> int | None:
        """Delivery time on the FIFO link src->dst, or None when the message is lost."""
        rng = self.world.rng
        if self._cut(src, dst) or rng.random() < self.faults.drop:
            return None
        delay = rng.randint(1, 4) + (rng.randint(20, 80) if rng.random() < self.faults.spike else 0)
        when = max(self.world.now_ms + delay, self._link_free_ms.get((src, dst), 0))
        self._link_free_ms[(src, dst)] = when
        return when

    def call(
        self,
        src: str,
        dst: str,
        handler: Callable[[Any], Any],
        on_ok: OnOk,
        on_err: OnErr,
        *,
        timeout_ms: int = 300,
    ) -> None:
        """Run ``handler(node)`` at ``dst``; its result (or typed error) comes back to
        ``on_ok``/``on_err`` once, or :class:`Timeout` after ``timeout_ms``."""
        settled = [False]

        def settle(fn: Callable[[], None]) -> None:
            if not settled[0]:
                settled[0] = True
                fn()

        def deliver_reply(result: Any, error: EstreamError | None) -> None:
            if dst in self.faults.down or src in self.faults.down:
                return
            if error is not None:
                settle(lambda: on_err(error))
            else:
                settle(lambda: on_ok(result))

        def deliver() -> None:
            if dst in self.faults.down:
                return
            try:
                result, error = handler(self.nodes[dst]), None
            except EstreamError as exc:
                result, error = None, exc
            when = self._delay(dst, src)
            if when is not None:
                self.world.at(when, lambda: deliver_reply(result, error))

        when = self._delay(src, dst)
        if when is not None:
            self.world.at(when, deliver)
        elif dst in self.faults.down and self.world.rng.random() < 0.5:
            # A crashed server refuses the connection: the caller learns it quickly.
            self.world.after(1, lambda: settle(lambda: on_err(Unavailable(f"{dst} down"))))
        self.world.after(timeout_ms, lambda: settle(lambda: on_err(Timeout(f"{dst} timed out"))))


@dataclass
class SimReplica:
    start: int
    epoch: int
    values: list[bytes] = field(default_factory=list)
    confirm: int = 0
    sealed_end: int | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.values)


class SimRangeServer:
    """A range server's replicas of ranges (keyed by stream id and range index)."""

    def __init__(self, server_id: str, dirty: set[tuple[int, int]] | None = None) -> None:
        self.id = server_id
        self.replicas: dict[tuple[int, int], SimReplica] = {}
        self.dirty = dirty if dirty is not None else set()  # ranges changed since a check

    def _get(self, stream_id: int, range_index: int) -> SimReplica:
        rep = self.replicas.get((stream_id, range_index))
        if rep is None:
            raise RangeNotFound("no such range", stream_id=stream_id, range_index=range_index)
        return rep

    def create_range(self, stream_id: int, range_index: int, start: int, epoch: int) -> int:
        rep = self.replicas.get((stream_id, range_index))
        self.dirty.add((stream_id, range_index))
        if rep is None:
            self.replicas[(stream_id, range_index)] = SimReplica(start, epoch, confirm=start)
            return start
        if epoch < rep.epoch:
            raise Fenced("stale epoch", epoch=epoch, current_epoch=rep.epoch)
        if rep.start != start:
            raise Conflict("different start")
        rep.epoch = epoch
        return rep.end

    def append(self, payload: bytes) -> int:
        batch = decode_batch(payload)
        h = batch.header
        rep = self._get(h.stream_id, h.range_index)
        if rep.sealed_end is not None:
            raise RangeSealed(
                "sealed",
                stream_id=h.stream_id,
                range_index=h.range_index,
                end_offset=rep.sealed_end,
            )
        if h.epoch < rep.epoch:
            raise Fenced("stale epoch", epoch=h.epoch, current_epoch=rep.epoch)
        if h.end_offset <= rep.end:
            return rep.end  # a duplicate: acknowledged again
        if h.base_offset != rep.end:
            raise OffsetGap("gap", expected=rep.end, actual=h.base_offset)
        rep.epoch = h.epoch
        self.dirty.add((h.stream_id, h.range_index))
        rep.values.extend(r.value for r in batch.records)
        rep.confirm = max(rep.confirm, min(h.confirm_offset, rep.end))
        return rep.end

    def seal(self, stream_id: int, range_index: int, epoch: int, end: int | None) -> int:
        rep = self._get(stream_id, range_index)
        if epoch < rep.epoch:
            raise Fenced("stale epoch", epoch=epoch, current_epoch=rep.epoch)
        if rep.sealed_end is not None:
            if end is None or end == rep.sealed_end:
                return rep.sealed_end
            raise Conflict("sealed at another end")
        rep.epoch = epoch
        self.dirty.add((stream_id, range_index))
        if end is None:
            return rep.end
        if rep.end < end:
            raise OffsetGap("short of the seal end", expected=end, actual=rep.end)
        rep.sealed_end = end
        return end

    def fence(self, stream_id: int, range_index: int, epoch: int) -> tuple[int, bool]:
        """SEAL without an end: ``(end, sealed)`` as the SEAL answer carries them."""
        end = self.seal(stream_id, range_index, epoch, None)
        return end, self._get(stream_id, range_index).sealed_end is not None

    def confirm(self, stream_id: int, range_index: int, epoch: int, confirm: int) -> None:
        rep = self._get(stream_id, range_index)
        if epoch < rep.epoch:
            raise Fenced("stale epoch", epoch=epoch, current_epoch=rep.epoch)
        if rep.sealed_end is None:
            rep.confirm = max(rep.confirm, min(confirm, rep.end))
            self.dirty.add((stream_id, range_index))

    def read_unconfirmed(
        self, stream_id: int, range_index: int, start: int, end: int
    ) -> list[bytes]:
        rep = self._get(stream_id, range_index)
        if rep.end < end or start < rep.start:
            raise OffsetGap("cannot serve", expected=end, actual=rep.end)
        return rep.values[start - rep.start : end - rep.start]


class SimPD:
    """The catalog core behind the network; placement is decided before proposing."""

    def __init__(self, world: World, servers: list[str]) -> None:
        self.world = world
        self.servers = servers
        self.catalog = Catalog()
        for s in servers:
            self.catalog.apply(RegisterServer(s, f"127.0.0.1:{7200 + servers.index(s)}", "ssd"))

    def _place(self, count: int, exclude: tuple[str, ...]) -> tuple[str, ...]:
        pool = [s for s in self.servers if s not in exclude]
        if len(pool) < count:
            raise NoPlacement("not enough servers", needed=count, available=len(pool))
        return tuple(self.world.rng.sample(pool, count))

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
        placement = self._place(stream.replicas, exclude)
        result = self.catalog.apply(SealRange(name, epoch, range_index, end, placement))
        assert isinstance(result, StreamMeta)
        return result

    def describe(self, name: str) -> StreamMeta:
        return self.catalog.stream(name)
