"""Spare segments: log files filled with zeros ahead of time, while the log is idle.

An fdatasync after an append that grows a file must also commit filesystem metadata (on
ext4 a journal commit: the append's slow tail); overwriting blocks already allocated and
zeroed needs none. So a preparer thread zero-fills spare files while no append comes, and
the log takes one when it rolls to a new segment. Why, how and the bounds:
:class:`SparePool`; measured in benchmarks/RESULTS.md.

Side effects: the spare files (create, write, fdatasync, rename, delete), one thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from estream.server.durable import fsync_dir
from estream.wire import limits

log = logging.getLogger(__name__)

SUFFIX = ".spare"
PREPARING = "preparing.tmp"
chunk_bytes: Final = 1 * limits.MiB  # one write + fdatasync of zeros
idle_s: Final = 0.1  # no append for this long: the log is idle and spares may be prepared
poll_s: Final = 0.05  # how often an idle-waiting preparer looks again
reserve_free_bytes: Final = 4 * limits.GiB  # never fill the disk below this much free space
retry_s: Final = 5.0  # after a preparation failed (no room, no descriptors), before trying again


class SparePool:
    """Up to ``wanted`` zero-filled files of ``segment_bytes`` bytes in ``directory``.

    Why: an fdatasync that covers an append which *grows* a file must also commit the
    filesystem's metadata (the new size, the blocks just allocated): on ext4 that is a
    journal commit, and it is what gives appends their slow tail. An append that overwrites
    blocks already allocated and initialized needs no metadata at all: its fdatasync is the
    data and a cache flush, so overwriting a zero-filled file keeps the append tail far
    shorter than growing one (the range-server benchmark, ``benchmarks/RESULTS.md``).

    How: a preparer thread writes ``PREPARING`` full of zeros in chunks (each chunk written
    and fdatasynced, so no large amount of dirty data ever waits for a flush), then renames
    it to ``spare-N.spare`` and syncs the directory. It works only while no append has come
    for ``idle_s``, and stops between chunks as soon as one does: zero-filling *during*
    appends doubles the writes and makes the tail worse than growing files.
    The writer thread takes a spare when the log rolls to a new segment (renamed to the
    segment's name; ``rangeserver/shell/wal.py``); with none ready, it creates an empty file as
    before. The pool never grows past ``wanted`` spares and never takes the disk below
    ``reserve_free_bytes`` free.

    The zeros are dropped from the page cache once synced (``POSIX_FADV_DONTNEED``): appends
    never read them, and a host that reclaims cold page cache on its own (this project's
    machines run DAMON's ``pageout``) would otherwise do it while appends are writing into the
    same files, and stall them (benchmarks/RESULTS.md, "Range server").

    A crash leaves either a complete spare (kept) or a ``PREPARING`` file (deleted at start).
    A segment made from a spare ends in zeros after its last entry: recovery treats an
    all-zero remainder as unused space, not as a torn tail (``rangeserver/shell/store.py``).
    """

    def __init__(
        self,
        directory: Path,
        segment_bytes: int,
        wanted: int,
        *,
        last_activity: Callable[[], float],
        reserve_bytes: int = reserve_free_bytes,
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.wanted = wanted
        self.reserve_bytes = reserve_bytes
        self._last_activity = last_activity  # time.monotonic() of the latest append
        self._ready: list[Path] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_name = 0

    def open(self) -> None:
        """Keep the complete spares on disk; delete an interrupted preparation and any
        spare of another size (the segment size changed)."""
        (self.directory / PREPARING).unlink(missing_ok=True)
        for path in sorted(self.directory.glob("*" + SUFFIX)):
            if path.stat().st_size == self.segment_bytes and len(self._ready) < self.wanted:
                self._ready.append(path)
            else:
                path.unlink()
        numbers = [int(p.stem.rpartition("-")[2]) for p in self._ready
                   if p.stem.rpartition("-")[2].isdigit()]
        self._next_name = max(numbers, default=-1) + 1

    def start(self) -> None:
        if self.wanted > 0:
            self._thread = threading.Thread(target=self._run, name="wal-spares", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def ready(self) -> int:
        """Spares ready to be taken."""
        with self._lock:
            return len(self._ready)

    def take(self) -> Path | None:
        """A ready spare (its file now belongs to the caller), or None."""
        with self._lock:
            return self._ready.pop(0) if self._ready else None

    # ------------------------------------------------------------------ preparer thread

    def _run(self) -> None:
        wait_s = poll_s
        try:
            while not self._stop.wait(wait_s):
                wait_s = poll_s
                try:
                    if self.ready() < self.wanted and self._idle() and self._room():
                        self._prepare_one()
                except OSError as exc:  # a full disk, no descriptors: appends grow files
                    log.warning("spare segments: preparation paused for %ss: %s",
                                retry_s, exc)
                    wait_s = retry_s  # then tried again: a resource may come back
        finally:
            (self.directory / PREPARING).unlink(missing_ok=True)

    def _idle(self) -> bool:
        return time.monotonic() - self._last_activity() >= idle_s

    def _room(self) -> bool:
        stat = os.statvfs(self.directory)
        return stat.f_bavail * stat.f_frsize - self.segment_bytes >= self.reserve_bytes

    def _prepare_one(self) -> None:
        """Fill ``PREPARING`` chunk by chunk while idle; once whole, make it a spare.
        Returns early (keeping what is written) when appends come or the pool stops."""
        path = self.directory / PREPARING
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            done = os.fstat(fd).st_size
            zeros = bytes(chunk_bytes)
            while done < self.segment_bytes:
                if self._stop.is_set() or not self._idle():
                    return
                size = min(chunk_bytes, self.segment_bytes - done)
                written = os.pwrite(fd, zeros[:size] if size < chunk_bytes else zeros, done)
                os.fdatasync(fd)
                os.posix_fadvise(fd, done, written, os.POSIX_FADV_DONTNEED)  # see below
                done += written
        finally:
            os.close(fd)
        spare = self.directory / f"spare-{self._next_name:06d}{SUFFIX}"
        self._next_name += 1
        os.rename(path, spare)
        fsync_dir(self.directory)
        with self._lock:
            self._ready.append(spare)
