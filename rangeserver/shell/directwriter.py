"""Group commit on the event loop: O_DIRECT writes submitted with Linux native AIO.

The log's default writer where the filesystem and kernel allow it (``wal.py`` falls back to
its writer thread elsewhere; why it exists: ``linuxaio.py``). Entries fill an aligned
buffer that repeats the log's last partial block; one write is in flight at a time, and
appends arriving meanwhile share the next one; a group with a synced entry is written with
``RWF_DSYNC``. How a group commit goes, and how it fails: :class:`DirectWriter`.

Side effects: the segment files' writes and fdatasyncs, through :mod:`rangeserver.shell.linuxaio`.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import mmap
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from estream.wire import limits
from estream.wire.errors import StorageError
from rangeserver.shell import exhaustion
from rangeserver.shell.linuxaio import BLOCK_BYTES, AioContext, aligned_buffer, buffer_address

log = logging.getLogger(__name__)

group_bytes_max = limits.wal_write_bytes_max  # one write; a whole batch always fits


def block_floor(position: int) -> int:
    return position - position % BLOCK_BYTES


def block_ceil(position: int) -> int:
    return -(-position // BLOCK_BYTES) * BLOCK_BYTES


@dataclass(slots=True)
class WalItem:
    """One entry (or, with no ``parts``, a barrier) on its way to the log."""

    segment: int
    position: int  # where ``parts`` go in ``segment``
    parts: Sequence[bytes | memoryview]
    size: int
    future: asyncio.Future[None] | None
    sync: bool  # the future completes after fdatasync (else once written)
    on_durable: Callable[[], None] | None
    on_failed: Callable[[], None] | None = None  # undoes the entry's effects if never written
    settled: bool = False  # durable (or a barrier answered): nothing left to fail or undo


@dataclass(slots=True)
class _Group:
    segment: int
    base: int  # file offset of the buffer's first byte (block-aligned)
    buffer: mmap.mmap
    address: int
    used: int  # bytes of the buffer holding data (the repeated partial block included)
    items: list[WalItem] = field(default_factory=list)
    sync: bool = False  # written with RWF_DSYNC
    has_data: bool = False  # False: barriers only, nothing to write
    submitted: float = 0.0  # time.perf_counter() of the write's submission (statistics)

    @property
    def end(self) -> int:
        """File offset just past the group's data."""
        return self.base + self.used


class DirectWriter:
    """The log's writer on the event loop (see the module docstring).

    ``open_segment(segment, fd)`` opens a segment for O_DIRECT writing (closing ``fd``,
    the segment open before, if not None); the :class:`~rangeserver.shell.wal.Wal` provides it
    (it knows the spares). ``complete(items, durable)`` and ``fail(items, error)`` finish
    items on the event loop. ``exhausted((segment, position), error)`` is told where the
    good entries end when a resource ran out; the writer then stops (the log replaces it).


    How a group commit goes:

    - Entries are copied, as :meth:`DirectWriter.put` receives them, into a *filling* group:
      an aligned buffer that starts at the block holding the entry's position. Its first
      bytes repeat the log's last partial block (kept in :attr:`DirectWriter.tail`), so every
      write covers whole blocks; the end is padded with zeros (the log reads zeros after its
      last entry as unused space, ``rangeserver/walformat.py``).
    - At most one write is in flight. When none is, the filling group is submitted at the
      end of the current event-loop iteration (every append decoded in it joins the group);
      when one is, the filling group grows until that write completes and is then submitted
      at once: appends that arrive during a write share the next one.
    - A group holding a synced entry is written with ``RWF_DSYNC`` and its entries complete
      when the kernel says the write is durable. A group of ``DEFERRED_SYNC`` entries only
      is written without it; its entries complete once written and become durable with the
      next synced group, a barrier, or after ``limits.wal_idle_sync_ms`` of idleness (an
      ``fdatasync``).
    - A group never spans segments; before the first write to a new segment the previous
      one is synced and closed (a segment is complete and durable before the next starts).
    - Two buffers: one in flight, one filling; entries that fit in neither wait in order.

    Writes rewrite the last partial block of the one before: one write at a time keeps two
    writes of the same block from ever being in flight together.

    Failure: a write or open that ran out of a resource (a short write: out of disk,
    ``rangeserver/shell/exhaustion.py``) stops the writer and reports where the log's good
    entries end (the failed group's first entry): the log cuts back there and starts a new
    writer (see ``rangeserver/shell/wal.py``). Any other failure, and any failed fdatasync,
    fails every pending entry and puts the log in the failed state.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        segment: int,
        fd: int,
        tail: bytes,
        open_segment: Callable[[int, int | None], int],
        spare_ready: Callable[[], bool],
        complete: Callable[[list[WalItem], bool], None],
        fail: Callable[[list[WalItem], StorageError], None],
        exhausted: Callable[[tuple[int, int], StorageError], None],
        on_sync: Callable[[float], None] | None = None,
    ) -> None:
        self._loop = loop
        self._segment = segment
        self._fd = fd
        self.tail = tail  # the log's last partial block (data before the next position)
        self._open_segment = open_segment
        self._spare_ready = spare_ready
        self._complete = complete
        self._fail = fail
        self._exhausted = exhausted
        self._on_sync = on_sync  # seconds each durable write or fdatasync took (statistics)
        self._aio = AioContext(depth=1)
        self._free: list[mmap.mmap] = [aligned_buffer(group_bytes_max) for _ in range(2)]
        self._buffer_bytes = len(self._free[0])
        self._addresses = {id(b): buffer_address(b) for b in self._free}
        self._filling: _Group | None = None
        self._inflight: _Group | None = None
        self._waiting: deque[WalItem] = deque()  # fit in no buffer yet, in order
        self._unsynced: list[WalItem] = []  # written without RWF_DSYNC, not yet fsynced
        self._tokens = itertools.count(1)
        self._kick_scheduled = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle: asyncio.Future[None] | None = None
        self.failed: StorageError | None = None
        self.syncs = 0  # durable writes and fdatasyncs (statistics)
        loop.add_reader(self._aio.eventfd, self._on_completions)

    # ------------------------------------------------------------------------ taking

    def put(self, item: WalItem) -> None:
        """Take one entry or barrier, in log order."""
        if self.failed is not None:
            self._fail([item], self.failed)
            return
        self._waiting.append(item)
        self._fill()
        if not self._kick_scheduled and self._inflight is None:
            self._kick_scheduled = True
            self._loop.call_soon(self._kick)

    def _fill(self) -> None:
        """Copy waiting entries into the filling group while they fit."""
        while self._waiting:
            item = self._waiting[0]
            group = self._filling
            if group is None:
                if not self._free:
                    return
                group = self._filling = self._new_group(item)
            elif item.parts and (
                item.segment != group.segment
                or item.position - group.base + item.size > len(group.buffer)
            ):
                return  # the next group takes it
            self._waiting.popleft()
            if item.parts:
                self._copy_in(group, item)
                group.has_data = True
            group.items.append(item)
            group.sync = group.sync or item.sync

    def _new_group(self, item: WalItem) -> _Group:
        """A group starting at ``item``'s position (a barrier's is the log's end)."""
        base = block_floor(item.position)
        prefix = self.tail if item.position else b""
        assert len(prefix) == item.position - base, "entries are placed contiguously"
        if self._buffer_bytes < item.position - base + item.size:  # never for a batch
            buffer = aligned_buffer(item.position - base + item.size)  # used once
            self._addresses[id(buffer)] = buffer_address(buffer)
        else:
            buffer = self._free.pop()
        buffer[: len(prefix)] = prefix
        return _Group(item.segment, base, buffer, self._addresses[id(buffer)], len(prefix))

    def _copy_in(self, group: _Group, item: WalItem) -> None:
        at = item.position - group.base
        assert at == group.used, "entries are placed contiguously"
        for part in item.parts:
            size = len(part)
            group.buffer[at : at + size] = part
            at += size
        group.used = at
        self.tail = group.buffer[block_floor(group.end) - group.base : group.used]

    # ----------------------------------------------------------------------- writing

    def _kick(self) -> None:
        self._kick_scheduled = False
        self._pump()

    def _pump(self) -> None:
        """Submit the filling group when no write is in flight, and refill."""
        self._fill()
        while self._inflight is None and self._filling is not None and self.failed is None:
            group, self._filling = self._filling, None
            if group.has_data:
                self._submit(group)
            else:
                self._finish_barriers(group)
            self._fill()
        if self._drained():
            self._wake_closer()

    def _submit(self, group: _Group) -> None:
        """Write ``group`` (the only write in flight)."""
        try:
            if group.segment != self._segment:
                self._switch_segment(group.segment)
            elif group.base == 0 and group.items[0].position == 0 and self._spare_ready():
                self._fd = self._open_segment(group.segment, self._fd)  # created empty at start
            size = block_ceil(group.used)
            group.buffer[group.used : size] = bytes(size - group.used)
            group.submitted = time.perf_counter()
            self._aio.submit_write(
                next(self._tokens), self._fd, group.address, size, group.base, dsync=group.sync
            )
            self._inflight = group
        except OSError as exc:
            self._release(group.buffer)
            self._broken(exc, group.items)

    def _release(self, buffer: mmap.mmap) -> None:
        """A buffer is free again (one made for a single oversized entry is dropped)."""
        if len(buffer) == self._buffer_bytes:
            self._free.append(buffer)
        else:
            del self._addresses[id(buffer)]

    def _switch_segment(self, segment: int) -> None:
        """The segment before is complete: make it durable, then open ``segment``."""
        if self._unsynced:
            self._fdatasync()
        self._fd = self._open_segment(segment, self._fd)
        self._segment = segment

    def _finish_barriers(self, group: _Group) -> None:
        self._release(group.buffer)
        if not group.sync or self._sync_unsynced(group.items):
            self._complete(group.items, group.sync)

    def _fdatasync(self) -> None:
        started = time.perf_counter()
        exhaustion.sync(self._fd)
        if self._on_sync is not None:
            self._on_sync(time.perf_counter() - started)
        self.syncs += 1
        unsynced, self._unsynced = self._unsynced, []
        self._complete(unsynced, True)

    def _sync_unsynced(self, items: list[WalItem]) -> bool:
        """Make the writes done without RWF_DSYNC durable (one fdatasync), if any; False
        if it failed (the log is then broken, ``items`` failed with everything pending)."""
        if self._unsynced:
            try:
                self._fdatasync()
            except OSError as exc:
                self._broken(exc, items)
                return False
        return True

    def _on_completions(self) -> None:
        for done in self._aio.completions():
            group = self._inflight
            assert group is not None, "one write in flight"
            self._inflight = None
            self._release(group.buffer)
            if done.result != block_ceil(group.used):
                # A short direct write: the filesystem ran out of blocks.
                error = -done.result if done.result < 0 else errno.ENOSPC
                reason = f"short write ({done.result} bytes)" if done.result >= 0 else (
                    os.strerror(error))
                self._broken(OSError(error, reason), group.items)
                return
            self._written(group)
        self._pump()

    def _written(self, group: _Group) -> None:
        if not group.sync:
            self._complete(group.items, False)
            self._unsynced.extend(group.items)
            self._arm_idle_sync()
            return
        self.syncs += 1
        if self._on_sync is not None:
            self._on_sync(time.perf_counter() - group.submitted)
        if self._sync_unsynced(group.items):  # RWF_DSYNC made only this write durable
            self._complete(group.items, True)

    def _arm_idle_sync(self) -> None:
        if self._idle_timer is None:
            delay_s = limits.wal_idle_sync_ms / 1000
            self._idle_timer = self._loop.call_later(delay_s, self._idle_sync)

    def _idle_sync(self) -> None:
        self._idle_timer = None
        if not self._unsynced or self.failed is not None:
            return
        if not self._drained():
            self._arm_idle_sync()  # busy: look again later
            return
        self._sync_unsynced([])

    def _drained(self) -> bool:
        return self._inflight is None and self._filling is None and not self._waiting

    def _broken(self, exc: OSError, items: list[WalItem]) -> None:
        error = StorageError(f"log write failed: {exc}", errno=exc.errno)
        self.failed = error
        first = next((item for item in items if item.parts), None)
        if exhaustion.exhausted_resource(exc) is not None and first is not None:
            # Nothing from ``first`` on is kept: the log cuts back there and fails (and
            # undoes) those entries; what was written before stays.
            if self._filling is not None:
                self._release(self._filling.buffer)
            self._unsynced, self._filling = [], None
            self._waiting.clear()
            self._exhausted((first.segment, first.position), error)
            self._wake_closer()
            return
        pending = list(items) + self._unsynced
        if self._filling is not None:
            self._release(self._filling.buffer)
            pending += self._filling.items
        pending += list(self._waiting)
        self._unsynced, self._filling = [], None
        self._waiting.clear()
        self._fail(pending, error)
        self._wake_closer()

    def _wake_closer(self) -> None:
        """Nothing more will be written: let a waiting :meth:`close` go on."""
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    # ---------------------------------------------------------------------- shutdown

    async def close(self) -> None:
        """Write everything taken so far, fsync it, and release the files and context."""
        if not self._drained() and self.failed is None:
            self._idle = self._loop.create_future()
            self._pump()
            await self._idle
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._loop.remove_reader(self._aio.eventfd)
        self._aio.close()
        if self.failed is None:
            self._sync_unsynced([])
        os.close(self._fd)
