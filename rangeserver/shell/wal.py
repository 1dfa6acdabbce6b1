"""The write-ahead log's files: segments and positions, the two group-commit writers, reads.

The one module that opens the log's segment files (``DATA/wal/NNNNNNNNNN.wal``). The event
loop gives each entry (``rangeserver/walformat.py``) its segment and position when
:meth:`Wal.append` is called, so the index knows where a batch is before it is written. Two
writers, chosen at :meth:`Wal.start`: **direct** (``directwriter.py``: O_DIRECT and native
AIO from the event loop) and **thread** (here: one ``pwritev`` per segment and one
``fdatasync`` per group, or one ``pwritev(RWF_DSYNC)``). A resource running out
(``exhaustion.py``) *cuts back* the log to the failed write and probes until it is back; any
other write or fdatasync error fails every later append (fsyncgate). With
``--disk-bytes-per-s-max`` entries reach the writer through ``diskpacer.py``. Why and how:
docs/ARCHITECTURE.md 2.1; the syscalls themselves: ``segmentfiles.py``.

Side effects: the segment files (create, write, fdatasync, read, truncate).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from estream.server.durable import fsync_dir
from estream.wire import limits
from estream.wire.errors import StorageError
from rangeserver.index import Location
from rangeserver.shell import exhaustion, linuxaio, segmentfiles
from rangeserver.shell.directwriter import DirectWriter, WalItem, block_floor
from rangeserver.shell.diskpacer import DiskPacer
from rangeserver.shell.spares import SparePool

log = logging.getLogger(__name__)



def segment_name(segment: int) -> str:
    return f"{segment:010d}.wal"


_STOP = object()
IO_MODES = ("auto", "direct", "thread")


class Wal:
    """Append-only segment files with a group-commit writer thread."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes_max: int = limits.segment_bytes_max,
        spares: int = 0,
        io: str = "auto",
        disk_bytes_per_s_max: int | None = None,
    ):
        if io not in IO_MODES:
            raise ValueError(f"io must be one of {IO_MODES}, not {io!r}")
        self.directory = directory
        self.io = io  # asked for; ``mode`` is what start() chose
        self.segment_bytes_max = segment_bytes_max
        self.directory.mkdir(parents=True, exist_ok=True)
        self.last_append = 0.0  # time.monotonic() of the latest append (the spares' idleness)
        self.spares = SparePool(
            directory, segment_bytes_max, spares, last_activity=lambda: self.last_append
        )
        self.segment = 0
        self.position = 0  # where the next entry goes in ``segment``
        self.bytes_total = 0
        self.failed: StorageError | None = None
        # The resource that ran out ("disk", "descriptors"): batches refused until it is back.
        self.exhausted: str | None = None
        self.exhaustions = 0  # times a resource ran out (statistics)
        self._exhaustion: StorageError | None = None  # what refused batches are told
        self._halted: StorageError | None = None  # cut back, no writer yet: all refused
        self._recovery: asyncio.Task[None] | None = None
        self.headroom = exhaustion.Headroom(directory)
        self.on_resumed: Callable[[], None] | None = None  # a new writer took over
        # Entries appended and not settled, in log order (what a cut back fails).
        self._pending: deque[WalItem] = deque()
        self._syncs = 0  # fdatasync calls of the writer thread (statistics)
        # Seconds each durable write (write + fdatasync, or one RWF_DSYNC write) took; called
        # on the writer thread in thread mode, on the event loop in direct mode (statistics).
        self.on_sync: Callable[[float], None] | None = None
        self.mode = ""  # "direct" or "thread", once started
        self._direct: DirectWriter | None = None
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._read_fds: dict[int, int] = {}
        self._retired_fds: list[int] = []  # of deleted segments: closed on the next delete
        self._dsync = False  # RWF_DSYNC writes: probed by start()
        self._writer_fd = -1  # the writer thread's open segment (its thread only)
        self.disk_bytes_per_s_max = disk_bytes_per_s_max  # None: no pacer, entries go at once
        self.pacer: DiskPacer | None = None

    # ------------------------------------------------------------------ startup (sync)

    def segments(self) -> list[int]:
        """Segment numbers on disk, in order."""
        found = []
        for path in self.directory.glob("*.wal"):
            if path.stem.isdigit():
                found.append(int(path.stem))
        return sorted(found)

    def path(self, segment: int) -> Path:
        return self.directory / segment_name(segment)

    def segment_size(self, segment: int) -> int:
        try:
            return self.path(segment).stat().st_size
        except FileNotFoundError:
            return 0

    def read_segment(self, segment: int, start: int = 0) -> bytes:
        """The bytes of a segment from ``start`` (recovery only, before serving), up to
        where only a hole follows (a segment that direct writes gave its full size is
        mostly hole: reading it would make up hundreds of MiB of zeros)."""
        with open(self.path(segment), "rb") as f:
            end = segmentfiles.data_end(f.fileno(), start)
            f.seek(start)
            return f.read(max(0, end - start))

    def truncate(self, segment: int, size: int, tail: bytes = b"") -> None:
        """Cut a torn tail off (recovery only) and make the cut durable. With ``tail``,
        those bytes are written at ``size`` first and the file is cut after them: they
        replace what is cut off (entries that record why, ``rangeserver/replay.py``)."""
        fd = os.open(self.path(segment), os.O_WRONLY)
        try:
            written = 0
            while written < len(tail):
                written += os.pwrite(fd, memoryview(tail)[written:], size + written)
            os.ftruncate(fd, size + len(tail))
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def start(self, loop: asyncio.AbstractEventLoop, segment: int, position: int) -> None:
        """Start appending at ``position`` of ``segment`` (created if missing), with direct
        writes where they work (``io`` "auto"), else with the writer thread."""
        self._loop = loop
        self.segment = segment
        self.position = position
        earlier = sum(self.segment_size(s) for s in self.segments() if s < segment)
        self.bytes_total = earlier + position
        self.spares.open()
        self.headroom.restore()
        if self.disk_bytes_per_s_max is not None:
            self.pacer = DiskPacer(loop, self.disk_bytes_per_s_max, self._hand)
        self.mode = self._choose_mode()
        if self.mode == "direct":
            self._start_direct(loop, segment, position)
            self.spares.start()
            return
        fd = self._open_segment(segment)
        self._dsync = segmentfiles.dsync_supported(fd)
        self._thread = threading.Thread(
            target=self._run, args=(fd, segment), name="wal-writer", daemon=True
        )
        self._thread.start()
        self.spares.start()

    def _choose_mode(self) -> str:
        if self.io == "thread":
            return "thread"
        why_not = linuxaio.probe(str(self.directory))
        if why_not is None:
            return "direct"
        if self.io == "direct":
            raise StorageError(f"direct log writes are unavailable in {self.directory}: {why_not}")
        log.info("direct log writes unavailable (%s): writer thread", why_not)
        return "thread"

    def _start_direct(self, loop: asyncio.AbstractEventLoop, segment: int, position: int) -> None:
        fd = self._open_segment(segment)
        tail = b""
        if position % linuxaio.BLOCK_BYTES:
            with open(self.path(segment), "rb") as f:
                f.seek(block_floor(position))
                tail = f.read(position - block_floor(position))
        self._direct = DirectWriter(
            loop,
            segment=segment,
            fd=fd,
            tail=tail,
            open_segment=self._open_segment,
            spare_ready=lambda: self.spares.ready() > 0,
            complete=self._complete,
            fail=self._fail,
            exhausted=self._on_exhausted,
            on_sync=self._synced,
        )

    def _synced(self, seconds: float) -> None:
        if self.on_sync is not None:
            self.on_sync(seconds)

    @property
    def syncs(self) -> int:
        """Durable writes and fdatasyncs so far (statistics)."""
        return self._direct.syncs if self._direct is not None else self._syncs

    def _open_segment(self, segment: int, fd: int | None = None) -> int:
        """Open ``segment`` for writing (closing ``fd``, its earlier opening): made from a
        spare when it is missing or holds no data and one is ready, else as it is, or
        created (empty; for direct writes, a hole of the segment's size); its directory
        entry is durable."""
        path = self.path(segment)
        if not path.exists() or path.stat().st_blocks == 0:  # missing, empty or all hole
            spare = self.spares.take()
            if spare is not None:
                os.rename(spare, path)  # replaces an empty file in one step
        flags = os.O_WRONLY | os.O_CREAT | (os.O_DIRECT if self.mode == "direct" else 0)
        new = os.open(path, flags, 0o644)  # ``fd`` stays open if this fails (EMFILE)
        try:
            if self.mode == "direct" and os.fstat(new).st_size < self.segment_bytes_max:
                # No spare: give the file its full size at once (a hole, no blocks). A
                # direct write past the end of a file completes inside io_submit on ext4
                # (it waits to update the size), which would block the event loop for the
                # write and its journal commit; a write inside the size stays asynchronous.
                os.ftruncate(new, self.segment_bytes_max)
            fsync_dir(self.directory)  # the new (or renamed) file's directory entry
        except BaseException:
            os.close(new)
            raise
        if fd is not None:
            os.close(fd)
        return new

    # ----------------------------------------------------------------- event-loop side

    def append(
        self,
        parts: Sequence[bytes | memoryview],
        size: int,
        *,
        sync: bool = True,
        on_durable: Callable[[], None] | None = None,
        on_failed: Callable[[], None] | None = None,
        control: bool = False,
    ) -> tuple[Location, asyncio.Future[None]]:
        """Queue one entry (``parts`` joined, ``size`` bytes); returns where it will be
        and a future completed once it is durable (``sync``) or written (not ``sync``).
        ``on_durable`` runs on the event loop once an fdatasync covers the entry;
        ``on_failed`` if the log cuts back before it (it is then not in the log). A
        ``control`` entry is taken while a resource is short (a batch is refused)."""
        self._check_open()
        if not control:
            self.check_room()
        assert self._loop is not None, "Wal.start() first"
        if self.position > 0 and self.position + size > self.segment_bytes_max:
            self.segment += 1
            self.position = 0
        location = Location(self.segment, self.position, size)
        self.position += size
        self.bytes_total += size
        self.last_append = time.monotonic()
        future = self._loop.create_future()
        segment, position = location.segment, location.position
        self._put(WalItem(segment, position, parts, size, future, sync, on_durable, on_failed))
        return location, future

    def _check_open(self) -> None:
        if self.failed is not None:
            raise self.failed
        if self._halted is not None:
            raise self._halted

    def check_room(self) -> None:
        """Raise :class:`StorageError` while a resource is short (what a new replica or
        a record batch is told)."""
        if self._exhaustion is not None:
            raise self._exhaustion

    def _put(self, item: WalItem) -> None:
        self._pending.append(item)
        if self.pacer is not None:
            self.pacer.put(item)  # on to _hand in order, at the disk budget's pace
        else:
            self._hand(item)

    def _hand(self, item: WalItem) -> None:
        if self._direct is not None:
            self._direct.put(item)
        else:
            self._queue.put(item)

    def barrier(self, *, sync: bool = True) -> asyncio.Future[None]:
        """A future completed once everything appended so far is durable (``sync``) or
        written."""
        self._check_open()
        assert self._loop is not None, "Wal.start() first"
        future = self._loop.create_future()
        self._put(WalItem(self.segment, self.position, (), 0, future, sync, None))
        return future

    async def force(self) -> None:
        """Wait until everything appended so far is fsynced."""
        await self.barrier(sync=True)

    async def read(self, locations: Sequence[Location]) -> list[bytes]:
        """The bytes at each location (read in a worker thread)."""
        fds = [self._read_fd(loc.segment) for loc in locations]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, segmentfiles.pread_all, fds, locations)

    def _read_fd(self, segment: int) -> int:
        fd = self._read_fds.get(segment)
        if fd is None:
            fd = os.open(self.path(segment), os.O_RDONLY)
            self._read_fds[segment] = fd
        return fd

    async def delete_segments(self, segments: Sequence[int]) -> int:
        """Delete these segments (never the one being written), durably (the directory
        is synced); returns the bytes freed. Their read descriptors are closed on the next
        call, not now: a read that picked one up may still be using it."""
        assert self.segment not in segments, "the segment being written stays"
        for fd in self._retired_fds:
            os.close(fd)
        self._retired_fds = [self._read_fds.pop(s) for s in segments if s in self._read_fds]
        sizes = [self.segment_size(s) for s in segments]
        paths = [self.path(s) for s in segments]
        try:
            await asyncio.to_thread(segmentfiles.delete_files, paths, self.directory)
        except OSError as exc:
            raise StorageError(f"deleting log segments failed: {exc}") from None
        freed = sum(sizes)
        self.bytes_total -= freed
        return freed

    async def close(self) -> None:
        """Sync and stop the writer thread; close every file."""
        self.spares.stop()
        if self.pacer is not None:
            await self.pacer.flush()
        if self._recovery is not None:
            self._recovery.cancel()
            await asyncio.gather(self._recovery, return_exceptions=True)
        await self._stop_writer()
        for fd in [*self._read_fds.values(), *self._retired_fds]:
            os.close(fd)
        self._read_fds.clear()
        self._retired_fds.clear()

    async def _stop_writer(self) -> None:
        """Stop the writer (it syncs what it wrote, unless it stopped on an error)."""
        if self._direct is not None:
            direct, self._direct = self._direct, None
            await direct.close()
        if self._thread is not None:
            thread, self._thread = self._thread, None
            self._queue.put(_STOP)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, thread.join)

    def _complete(self, items: list[WalItem], durable: bool) -> None:
        for item in items:
            if durable and item.on_durable is not None:
                item.on_durable()
            if item.future is not None and not item.future.done() and (durable or not item.sync):
                item.future.set_result(None)
            if durable or not (item.parts or item.sync):
                item.settled = True
        while self._pending and self._pending[0].settled:
            self._pending.popleft()

    def _fail(self, items: list[WalItem], error: StorageError, *, latch: bool = True) -> None:
        if latch and self.failed is None:
            log.error("write-ahead log failed, appends stop: %s", error.message)
            self.failed = error
        for item in items:
            item.settled = True
            if item.future is not None and not item.future.done():
                item.future.set_exception(error)

    # ---------------------------------------------------------------- running out, back

    def _on_exhausted(self, cut: tuple[int, int], error: StorageError) -> None:
        """The writer ran out of a resource and stopped; nothing from ``cut`` (segment,
        position) on is in the log: fail those entries, undo them (newest first), and
        start the recovery (see the module)."""
        if self.failed is not None or self._halted is not None:
            return
        resource = exhaustion.exhausted_resource(OSError(error.fields.get("errno"), ""))
        assert resource is not None, "only exhaustion is reported here"
        log.warning("log: %s exhausted (%s): cut back to %s, record batches refused until "
                    "it is back", resource, error.message, cut)
        self.exhausted = resource
        self.exhaustions += 1
        self._exhaustion = StorageError(
            f"the range server's {resource} is exhausted ({error.message}): appends "
            "refused until it is back", errno=error.fields.get("errno"))
        self._halted = self._exhaustion
        if self._recovery is not None and self._recovery is not asyncio.current_task():
            self._recovery.cancel()  # ran out again while only control entries went in
        # Unsettled entries: from the cut on, never written (failed, undone); before it,
        # written: still waiting for a sync (failed: harmless) or answered (kept, synced
        # by the cut back).
        lost: list[WalItem] = []
        waiting: list[WalItem] = []
        kept: list[WalItem] = []
        for item in self._pending:
            if item.settled:
                continue
            if (item.segment, item.position) >= cut:
                lost.append(item)
            elif item.future is not None and not item.future.done():
                waiting.append(item)
            else:
                kept.append(item)
        self._pending = deque(kept)
        if self.pacer is not None:
            self.pacer.drop()  # entries it holds come after the cut: lost
        for item in reversed(lost):
            if item.on_failed is not None:
                item.on_failed()
        self._fail(lost + waiting, error, latch=False)
        assert self._loop is not None
        self._recovery = self._loop.create_task(self._recover(cut, resource, kept))

    async def _recover(self, cut: tuple[int, int], resource: str, kept: list[WalItem]) -> None:
        """Cut the log back and start a new writer there (retried while the resource is
        short), then wait for the resource to come back."""
        await self._stop_writer()
        # Later segments are deleted (their numbers come back), and the cut one may be
        # replaced by a spare: their read descriptors are retired, reopened when read.
        for segment in [s for s in self._read_fds if s >= cut[0]]:
            self._retired_fds.append(self._read_fds.pop(segment))
        while True:
            try:
                await asyncio.to_thread(self._cut_back, cut, resource)
                self._restart(*cut)
                break
            except OSError as exc:
                if exhaustion.exhausted_resource(exc) is None:
                    error = StorageError(f"log cut back failed: {exc}", errno=exc.errno)
                    self._fail([i for i in self._pending if not i.settled], error)
                    return
                log.info("log: cut back waits for %s: %s", resource, exc)
            await asyncio.sleep(exhaustion.probe_interval_s)
        self._complete(kept, True)  # the cut's fdatasync covered them
        self._halted = None
        log.info("log: resumed at %s (control entries only while %s is short)", cut, resource)
        if self.on_resumed is not None:
            self.on_resumed()
        while not await asyncio.to_thread(exhaustion.resource_back, resource, self.headroom):
            await asyncio.sleep(exhaustion.probe_interval_s)
        self.exhausted = self._exhaustion = None
        log.warning("log: %s is back: appends resume", resource)

    def _cut_back(self, cut: tuple[int, int], resource: str) -> None:
        """Truncate the log at ``cut`` (later segments deleted), durably (writer thread
        or executor: blocking)."""
        if resource == "disk":
            self.headroom.release()
        segment, position = cut
        for later in [s for s in self.segments() if s > segment]:
            self.path(later).unlink()
        path = self.path(segment)
        if path.exists():
            fd = os.open(path, os.O_WRONLY)
            try:
                if os.fstat(fd).st_size > position:
                    os.ftruncate(fd, position)
                exhaustion.sync(fd)
            finally:
                os.close(fd)
        fsync_dir(self.directory)

    def _restart(self, segment: int, position: int) -> None:
        """A new writer appending at ``position`` of ``segment`` (mode kept)."""
        assert self._loop is not None
        earlier = sum(self.segment_size(s) for s in self.segments() if s < segment)
        if self.mode == "direct":
            self._start_direct(self._loop, segment, position)
        else:
            fd = self._open_segment(segment)
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(
                target=self._run, args=(fd, segment), name="wal-writer", daemon=True
            )
            self._thread.start()
        self.segment, self.position = segment, position
        self.bytes_total = earlier + position

    # ------------------------------------------------------------------ writer thread

    def _run(self, fd: int, segment: int) -> None:
        loop = self._loop
        assert loop is not None
        self._writer_fd = fd  # the open segment, also when a group fails after a switch
        unsynced: list[WalItem] = []
        error: StorageError | None = None
        stop = False
        while not stop:
            try:
                idle_s = limits.wal_idle_sync_ms / 1000 if unsynced else None
                first = self._queue.get(timeout=idle_s)
            except queue.Empty:
                first = None
            batch: list[WalItem] = []
            for obj in self._drain(first):
                if obj is _STOP:
                    stop = True
                else:
                    assert isinstance(obj, WalItem)
                    batch.append(obj)
            if error is not None:
                loop.call_soon_threadsafe(self._fail, batch, error)
                continue
            want_sync = stop or first is None or any(item.sync for item in batch)
            # Nothing written and unsynced before this group: one pwritev(RWF_DSYNC) both
            # writes and syncs it (one system call, one wait for the GIL after it).
            dsync = want_sync and not unsynced and self._dsync
            started = time.perf_counter()
            try:
                fd, segment = self._write_group(self._writer_fd, segment, batch, dsync=dsync)
                if any(not item.sync for item in batch):
                    loop.call_soon_threadsafe(self._complete, batch, False)
                unsynced.extend(batch)
                if unsynced and want_sync:
                    if not dsync:
                        exhaustion.sync(fd)
                    self._synced(time.perf_counter() - started)
                    segmentfiles.drop_cached(fd, unsynced, segment)
                    self._syncs += 1
                    loop.call_soon_threadsafe(self._complete, unsynced, True)
                    unsynced = []
            except OSError as exc:
                error = StorageError(f"log write failed: {exc}", errno=exc.errno)
                first = next((item for item in batch if item.parts), None)
                if exhaustion.exhausted_resource(exc) is not None and first is not None:
                    # Stop; the event loop cuts back to the group's first entry.
                    loop.call_soon_threadsafe(
                        self._on_exhausted, (first.segment, first.position), error)
                    break
                loop.call_soon_threadsafe(self._fail, unsynced + batch, error)
                unsynced = []
        os.close(self._writer_fd)

    def _drain(self, first: object | None) -> list[object]:
        objs = [] if first is None else [first]
        while True:
            try:
                objs.append(self._queue.get_nowait())
            except queue.Empty:
                return objs

    def _write_group(
        self, fd: int, segment: int, batch: list[WalItem], *, dsync: bool
    ) -> tuple[int, int]:
        """Write the group's entries at their positions (switching segments where they
        say), the last segment's part with ``RWF_DSYNC`` when ``dsync``. Entries of one
        segment are contiguous: the event loop assigned their positions in order."""
        parts: list[bytes | memoryview] = []
        start = -1
        for item in batch:
            if not item.parts:
                continue
            if item.segment != segment:
                segmentfiles.write_all(fd, parts, start)
                parts, start = [], -1
                exhaustion.sync(fd)  # a segment is complete and durable before the next starts
                segment = item.segment
                fd = self._writer_fd = self._open_segment(segment, fd)
            elif start < 0 and item.position == 0 and self.spares.ready():
                fd = self._writer_fd = self._open_segment(segment, fd)  # empty: a spare now
            if start < 0:
                start = item.position
            parts.extend(item.parts)
        segmentfiles.write_all(fd, parts, start, segmentfiles.DSYNC_FLAGS if dsync else 0)
        return fd, segment

