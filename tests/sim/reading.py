"""An application reading a stream in the seeded world: the real reader
(``estream/sdk/reader.py``, through a real :class:`~estream.sdk.client.Client`: its PD
client, connection pool and ``RangeClient``) on the world's loop and simulated network,
its cursor's waits scaled to the simulation (:data:`CURSOR_CONFIG`).

A :class:`Reading` is one read of ``[start, end)`` from its own node (so faults can cut it
off from a server), in one of the reader's three forms (``client.read``,
``read_batches``, ``read_batch_views``); every item it hands over is checked at once
(``on_deliver``), and ``on_end`` hears how the read ended. The reader is the product's,
unchanged: its timeouts and retries are the real ones, on virtual time.

Pure: no I/O (tests only).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from estream.core.readcursor import CursorConfig
from estream.sdk.client import Client
from estream.sdk.reader import read_stream, read_stream_batches, read_stream_views
from estream.wire.errors import EstreamError
from estream.wire.record import BatchColumns, Record, decode_views
from tests.sim.simloop import SimClock
from tests.sim.simtransport import SimNetwork
from tests.sim.world import PD_ADDRESS, World

DECODINGS: Final = ("records", "columns", "views")
# The cursor's waits at the simulation's scale (a world's faults last 50 ms to 1.5 s, and
# it runs 12 s): a tail refreshes the stream after 10 empty polls of 300 ms, not of 1 s.
CURSOR_CONFIG: Final = CursorConfig(
    follow_wait_ms=300,
    unheld_poll_pause_ms=10,
    retry_pause_step_ms=10,
    retry_pause_ms_max=100,
    sealed_wait_ms=5,
    tail_answer_ms_max=200,
    read_answer_ms_max=300,  # (a plain read's READ: 1.5 s at full scale)
)

Delivered = list[tuple[int, bytes]]  # (offset, value), in the order handed over


def pairs(kind: str, item: Any) -> Delivered:
    """What one item a read handed over holds, as (offset, value), whatever its form."""
    if kind == "records":
        record: Record = item
        return [(record.offset, record.value)]
    columns: list[BatchColumns] = [decode_views(item)] if kind == "views" else [item]
    out: Delivered = []
    for c in columns:
        out.extend(zip(range(c.base_offset, c.end_offset), c.values(), strict=True))
    return out


class Reading:
    """One read by the real reader (see the module). ``on_deliver(reading, offset, next
    offset, items)`` gets each item handed over, in order; ``on_end(reading)`` once the
    read ended (``error`` None) or failed (``error``)."""

    def __init__(
        self,
        world: World,
        net: SimNetwork,
        node_id: str,
        stream: str,
        *,
        start: int = 0,
        end: int | None = None,
        follow: bool = False,
        preferred: str | None = None,
        decoding: str = "records",
        on_deliver: Callable[[Reading, int, int, Delivered], None],
        on_end: Callable[[Reading], None],
    ) -> None:
        self.world = world
        self.id = node_id
        self.stream = stream
        self.start = start
        self.end = end
        self.follow = follow
        self.preferred = preferred
        self.kind = decoding
        self.on_deliver = on_deliver
        self.on_end = on_end
        self.started_ms = world.now_ms
        self.client = Client(PD_ADDRESS, network=net.node(node_id), clock=SimClock(world.loop))
        self.done = False
        self.error: EstreamError | None = None
        self.next_offset = start  # where the next delivery must begin
        self.log: list[str] = []
        self.task = world.loop.create_task(self._run())

    def describe(self) -> str:
        state = "done" if self.done else f"failed: {self.error!r}" if self.error else "reading"
        return (f"{self.id}: [{self.start}, {self.end}) follow={self.follow} {self.kind} "
                f"from t={self.started_ms}, next {self.next_offset}, {state}")

    def _items(self) -> AsyncIterator[Any]:
        """``client.read``, ``read_batches`` or ``read_batch_views``: the functions they
        return, with the cursor's waits at the simulation's scale."""
        read = {"records": read_stream, "columns": read_stream_batches,
                "views": read_stream_views}[self.kind]
        c = self.client
        return read(c, self.stream, self.start, self.end, self.follow, self.preferred,
                    clock=c.clock, config=CURSOR_CONFIG)

    async def _run(self) -> None:
        try:
            try:
                async for item in self._items():
                    delivered = pairs(self.kind, item)
                    if not delivered:
                        continue
                    first, last = delivered[0][0], delivered[-1][0] + 1
                    self.on_deliver(self, first, last, delivered)
                    self.next_offset = last
            except EstreamError as exc:
                self.error = exc
            self.done = self.error is None
            self.log.append(f"t={self.world.now_ms} ended at {self.next_offset}: "
                            f"{self.error!r}")
            self.on_end(self)
        except Exception as exc:  # noqa: BLE001 - an invariant's failure fails the run
            self.world.fail(exc)
        finally:
            await self.client.close()
