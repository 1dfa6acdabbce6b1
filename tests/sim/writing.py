"""An application writing a stream in the seeded world: the real writer
(``estream/sdk/writer.py``'s :class:`~estream.sdk.writer.Writer`, opened as
``Client.open_writer`` opens it, on a real :class:`~estream.sdk.client.Client`: its PD
client, connection pool, APPEND sender and lease keeper) on the world's loop and simulated
network, its waits and timeouts scaled to the simulation (:data:`WRITER_TIMINGS`).

A :class:`Writing` is one writer's application on its own node and process: it opens the
writer (again after a retriable error, as an application would), appends what the world's
workload asks while its unacknowledged records fit the writer's budget (as the world did
before), and keeps what its user saw: the values it appended, in offset order, and the end
of what was acknowledged; and its epoch once PD answered the open (its client's PD answer
observed: the recovery runs at that epoch, and the newest writer is the one to wait for).
:meth:`Writing.crash` is kill -9 of that process (nothing it started runs again, its
connections reset). The writer is the product's, unchanged.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from estream.core.writeeffects import WriterConfig
from estream.sdk.client import Client
from estream.sdk.writer import Writer
from estream.sdk.writertimings import WriterTimings
from estream.wire.errors import EstreamError, Fenced
from estream.wire.meta import StreamMeta
from tests.sim.simtransport import SimNetwork
from tests.sim.world import PD_ADDRESS, World

# The writer's waits at the simulation's scale (a world's faults last 50 ms to 1.5 s, and
# it runs 12 s): requests time out after 300 ms, not 5 s.
WRITER_TIMINGS: Final = WriterTimings(
    request_timeout_ms=300, seal_timeout_ms=100, create_timeout_ms=200, ping_timeout_ms=100,
    heal_window_ms=5_000, heal_interval_ms=100, heal_request_timeout_ms=300,
    fence_grace_ms=100, recovery_backoff_ms_min=20, recovery_backoff_ms_max=400,
    roll_backoff_ms_min=50, roll_backoff_ms_max=400, roll_pd_retry_ms=20,
    suspect_cleared_ms=500, close_wait_ms=100, confirm_wait_ms=300,
)
PD_TIMEOUT_S: Final = 0.3  # a PD call, its client's retries included
OPEN_RETRY_MS: Final = 20  # an open that failed with a retriable error: tried again after
RECORD_BYTES: Final = 40  # what a workload record costs the budget (its check, as before)


class Writing:
    """One application writing ``stream`` through the real writer (see the module)."""

    def __init__(self, world: World, net: SimNetwork, node_id: str, stream: str,
                 config: WriterConfig) -> None:
        self.world = world
        self.net = net
        self.id = node_id
        self.stream = stream
        self.config = config
        self.client = world.as_process(node_id, lambda: Client(
            PD_ADDRESS, timeout_s=PD_TIMEOUT_S, network=net.node(node_id),
            clock=world.clock, writer_timings=WRITER_TIMINGS))
        self.writer: Writer | None = None
        self.epoch = 0  # as soon as PD answered the open (its recovery runs at it)
        pd = self.client.pd
        open_writer = pd.open_writer

        async def opened(name: str) -> StreamMeta:
            meta = await open_writer(name)
            self.epoch = meta.epoch  # what the writer's open learns first
            return meta

        pd.open_writer = opened  # type: ignore[method-assign]
        self.start = -1  # the first offset this writer assigns
        self.assigned: list[bytes] = []  # what its user appended, in offset order
        self.acked_end = -1  # every offset below was acknowledged to its user
        self.max_wait_ms = 0  # the longest an append waited for its acknowledgement
        self.recoveries = 0  # recovery attempts of its opens (retries included)
        self.dead = False
        self.closing = False
        self._fenced = False
        self._close: asyncio.Task[None] | None = None
        self.log: list[str] = []

    # -- the process --------------------------------------------------------------------

    def open(self) -> None:
        self.world.as_process(self.id, lambda: asyncio.ensure_future(self._open()))

    async def _open(self) -> None:
        while True:
            try:
                writer = await Writer.open(self.client, self.stream, self.config)
            except EstreamError as exc:
                self.recoveries += 1
                if isinstance(exc, Fenced):
                    self._fenced = True
                    self.log.append(f"t={self.world.now_ms} open fenced: {exc!r}")
                    return
                if not exc.retriable:
                    self.world.fail(AssertionError(f"{self.id}: open failed: {exc!r}"))
                    return
                self.log.append(f"t={self.world.now_ms} open failed: {exc!r}")
                await asyncio.sleep(OPEN_RETRY_MS / 1000)
                continue
            break
        stats = writer.statistics()
        self.writer = writer
        assert self.epoch == writer.epoch
        self.recoveries += 1 + stats.recovery_retries
        if stats.failed:
            self._fenced = True  # a newer writer overtook it while it recovered
            self.log.append(f"t={self.world.now_ms} epoch {self.epoch} fenced while opening")
            return
        self.start = self.acked_end = stats.next_offset
        self.log.append(f"t={self.world.now_ms} epoch {self.epoch} writes range "
                        f"{stats.range_index} from {self.start}")

    def crash(self) -> None:
        """kill -9: nothing this process started runs again; its connections reset."""
        self.dead = True
        self.world.kill(self.id)
        # Inside the dead process: what the resets wake up in it stays dead.
        self.world.as_process(self.id, lambda: self.net.down(self.id))

    # -- what the world's workload does -----------------------------------------------

    @property
    def opened(self) -> bool:
        return self.writer is not None and self.start >= 0

    @property
    def fenced(self) -> bool:
        """The writer takes no more appends (a newer writer fenced it)."""
        writer = self.writer
        return self._fenced or (writer is not None and bool(writer.statistics().failed))

    def submit(self, count: int) -> bool:
        """Append ``count`` records if the writer's budget has room for them; False if it
        did not (nothing appended)."""
        writer = self.writer
        if writer is None or not self.opened or self._fenced or self.dead or self.closing:
            return False
        stats = writer.statistics()
        if stats.failed:
            return False  # fenced
        if stats.inflight_bytes + count * RECORD_BYTES > self.config.inflight_bytes_max:
            return False

        def append() -> None:
            for _ in range(count):
                offset = self.start + len(self.assigned)
                value = f"{self.id}:{offset}".encode()
                self.assigned.append(value)
                pending = writer.append(value)
                pending.add_done_callback(self._answered(offset, self.world.now_ms))

        self.world.as_process(self.id, append)
        return True

    def _answered(self, offset: int, since_ms: int) -> Callable[[asyncio.Future[int]], None]:
        def answered(pending: asyncio.Future[int]) -> None:
            if pending.cancelled():
                return
            error = pending.exception()
            if error is not None:
                if isinstance(error, Fenced):
                    self._fenced = True
                self.log.append(f"t={self.world.now_ms} append at {offset}: {error!r}")
                return
            if pending.result() != offset or offset != self.acked_end:
                self.world.fail(AssertionError(
                    f"{self.id}: the append at {offset} was acknowledged at offset "
                    f"{pending.result()}, after {self.acked_end}"))
            self.acked_end = offset + 1
            self.max_wait_ms = max(self.max_wait_ms, self.world.now_ms - since_ms)

        return answered

    def close(self) -> None:
        """``writer.close()`` (flush, the final CONFIRM durable, the range sealed)."""
        self.closing = True
        writer = self.writer
        if writer is not None and self._close is None:
            self._close = self.world.as_process(
                self.id, lambda: asyncio.ensure_future(writer.close()))

    @property
    def closed(self) -> bool:
        task = self._close
        if task is None or not task.done():
            return False
        error = task.exception()
        if error is not None:
            self.world.fail(error)
        return True
