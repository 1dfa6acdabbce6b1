"""The range server's write-ahead log on the simulated disk: the log port's simulated side.

:class:`SimLog` implements :class:`~rangeserver.shell.logport.LogPort` on a
:class:`~tests.sim.simdisk.SimDisk`, so the real :class:`~rangeserver.shell.store.Store`
runs on a :class:`~tests.sim.simloop.SimLoop`. Segments are disk files of the real names
and the real entry bytes (``rangeserver/walformat.py``), so the real replay reads them.
Positions are given at :meth:`SimLog.append`, as the real log does; one writer task takes
the queued entries as a group, writes them, completes the deferred ones (written), and
syncs when an entry asks for it (else after ``wal_idle_sync_ms`` idle), a segment before
the next one starts; then the durable callbacks run, in log order. Only a sync makes
writes durable: a power loss (:meth:`SimDisk.crash`) keeps a seeded prefix of the rest.
:meth:`SimLog.kill` is the process dying (its writer stops, the page cache stays).
Not simulated: running out of disk (no cut back) and failing writes.

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from estream.wire import limits
from estream.wire.errors import StorageError
from rangeserver.index import Location
from rangeserver.shell.wal import segment_name
from tests.sim.simdisk import SimDisk


@dataclass(slots=True)
class _Item:
    segment: int
    position: int
    data: bytes  # empty: a barrier
    future: asyncio.Future[None]
    sync: bool
    on_durable: Callable[[], None] | None


class _NoSpares:
    @staticmethod
    def ready() -> int:
        return 0


class SimLog:
    """The log port on a simulated disk (see the module)."""

    mode = "sim"
    pacer = None  # no --disk-bytes-per-s-max in the simulator

    def __init__(self, disk: SimDisk, *,
                 segment_bytes_max: int = limits.segment_bytes_max) -> None:
        self.disk = disk
        self.segment_bytes_max = segment_bytes_max
        self.segment = 0
        self.position = 0
        self.bytes_total = 0
        self.failed: StorageError | None = None
        self.exhausted: str | None = None
        self.exhaustions = 0
        self.on_resumed: Callable[[], None] | None = None
        self.on_sync: Callable[[float], None] | None = None
        self.syncs = 0  # groups made durable
        self._spares = _NoSpares()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: list[_Item] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._writer: asyncio.Task[None] | None = None

    @property
    def spares(self) -> _NoSpares:
        return self._spares

    # -- recovery -----------------------------------------------------------------------
    def segments(self) -> list[int]:
        return sorted(int(name[:-4]) for name in self.disk.names()
                      if name.endswith(".wal") and name[:-4].isdigit())

    def segment_size(self, segment: int) -> int:
        return self.disk.size(segment_name(segment))

    def read_segment(self, segment: int, start: int = 0) -> bytes:
        return self.disk.read(segment_name(segment), start)

    def truncate(self, segment: int, size: int, tail: bytes = b"") -> None:
        name = segment_name(segment)
        if tail:
            self.disk.write(name, size, tail)
        self.disk.truncate(name, size + len(tail))
        self.disk.sync_now(name)

    def start(self, loop: asyncio.AbstractEventLoop, segment: int, position: int) -> None:
        self._loop = loop
        self.segment, self.position = segment, position
        self.bytes_total = position + sum(self.segment_size(s) for s in self.segments()
                                          if s < segment)
        self._writer = loop.create_task(self._run())

    # -- serving --------------------------------------------------------------------------
    def append(
        self,
        parts: Sequence[bytes | memoryview],
        size: int,
        *,
        sync: bool = True,
        on_durable: Callable[[], None] | None = None,
        on_failed: Callable[[], None] | None = None,  # never: no cut back is simulated
        control: bool = False,
    ) -> tuple[Location, asyncio.Future[None]]:
        self._check_open()
        if not control:
            self.check_room()
        if self.position > 0 and self.position + size > self.segment_bytes_max:
            self.segment += 1
            self.position = 0
        location = Location(self.segment, self.position, size)
        self.position += size
        self.bytes_total += size
        data = b"".join(bytes(part) for part in parts)
        assert len(data) == size
        return location, self._put(location.segment, location.position, data, sync, on_durable)

    def check_room(self) -> None:
        pass  # no resource runs out here

    def barrier(self, *, sync: bool = True) -> asyncio.Future[None]:
        self._check_open()
        return self._put(self.segment, self.position, b"", sync, None)

    async def force(self) -> None:
        await self.barrier(sync=True)

    async def read(self, locations: Sequence[Location]) -> list[bytes]:
        out = []
        for location in locations:
            name = segment_name(location.segment)
            if name not in self.disk.files:
                raise FileNotFoundError(name)
            out.append(self.disk.read(name, location.position, location.size))
        return out

    async def delete_segments(self, segments: Sequence[int]) -> int:
        assert self.segment not in segments, "the segment being written stays"
        freed = 0
        for segment in segments:
            freed += self.segment_size(segment)
            self.disk.delete(segment_name(segment))
        self.disk.sync_dir()
        self.bytes_total -= freed
        return freed

    async def close(self) -> None:
        """Sync what is written and stop the writer."""
        self._stopping = True
        self._wake.set()
        if self._writer is not None:
            await self._writer

    def kill(self) -> None:
        """The process dies: the writer stops where it is (what it wrote stays written,
        unsynced); nothing is written or answered any more."""
        self.failed = StorageError("the simulated process was killed")
        if self._writer is not None:
            self._writer.cancel()

    # -- the writer -----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.failed is not None:
            raise self.failed
        assert self._loop is not None, "start() first"

    def _put(self, segment: int, position: int, data: bytes, sync: bool,
             on_durable: Callable[[], None] | None) -> asyncio.Future[None]:
        assert self._loop is not None
        future = self._loop.create_future()
        self._queue.append(_Item(segment, position, data, future, sync, on_durable))
        self._wake.set()
        return future

    async def _run(self) -> None:
        unsynced: list[_Item] = []
        dirty: list[int] = []  # segments written since their last sync, in order
        while True:
            if not self._queue and not self._stopping:
                self._wake.clear()
                try:
                    idle_s = limits.wal_idle_sync_ms / 1000 if unsynced else None
                    await asyncio.wait_for(self._wake.wait(), idle_s)
                except TimeoutError:
                    pass
            group, self._queue = self._queue, []
            idle = not group
            for item in group:
                if not item.data:
                    continue
                if dirty and dirty[-1] != item.segment:
                    await self._sync(dirty)  # a segment is durable before the next starts
                if not dirty or dirty[-1] != item.segment:
                    dirty.append(item.segment)
                self.disk.write(segment_name(item.segment), item.position, item.data)
            for item in group:
                if not item.sync and not item.future.done():
                    item.future.set_result(None)  # deferred: written
            unsynced.extend(group)
            if unsynced and (idle or self._stopping or any(i.sync for i in group)):
                await self._sync(dirty)
                self.syncs += 1
                for item in unsynced:
                    if item.on_durable is not None:
                        item.on_durable()
                    if not item.future.done():
                        item.future.set_result(None)
                unsynced = []
            if self._stopping and not self._queue:
                return

    async def _sync(self, dirty: list[int]) -> None:
        for segment in dirty:
            await self.disk.sync(segment_name(segment))
        dirty.clear()
