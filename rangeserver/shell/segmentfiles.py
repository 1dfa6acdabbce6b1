"""The plain syscalls on log segment files that the write-ahead log runs: write every buffer
(resuming partial writes, optionally ``RWF_DSYNC``), read locations, find where data ends
(before a hole), probe ``RWF_DSYNC``, drop synced pages from the cache, delete segments.

Side effects: the segment files (write, read, fadvise, unlink) and their directory's fsync.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from estream.server.durable import fsync_dir
from rangeserver.index import Location
from rangeserver.shell.directwriter import WalItem

log = logging.getLogger(__name__)

writev_buffers_max: Final = 512  # buffers per writev (the OS limit is usually 1024)
# pwritev2 with RWF_DSYNC (Linux 4.7+): write and fdatasync in one call; 0 where missing.
DSYNC_FLAGS: Final[int] = getattr(os, "RWF_DSYNC", 0)


def drop_cached(fd: int, items: list[WalItem], segment: int) -> None:
    """Drop what ``items`` wrote to ``segment`` from the page cache, now that it is
    synced (clean): reads of recent batches come from the store's own cache, and a host
    that reclaims cold page cache itself (DAMON ``pageout``) otherwise does it while
    appends write into the same file, and stalls them (see ``rangeserver/shell/spares.py``)."""
    written = [item for item in items if item.parts and item.segment == segment]
    if written:
        start = written[0].position
        os.posix_fadvise(fd, start, written[-1].position + written[-1].size - start,
                         os.POSIX_FADV_DONTNEED)


def data_end(fd: int, start: int) -> int:
    """Where a file's data ends from ``start`` on: its size, or the start of a hole after
    which there is no data (where the filesystem says, with SEEK_HOLE and SEEK_DATA)."""
    size = os.fstat(fd).st_size
    try:
        hole = os.lseek(fd, min(start, size), os.SEEK_HOLE)
    except OSError:
        return size  # no SEEK_HOLE here: all of it
    if hole >= size:
        return size
    try:
        os.lseek(fd, hole, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return hole  # nothing but the hole after it
        return size
    return size  # more data after the hole: all of it


def dsync_supported(fd: int) -> bool:
    """Whether this kernel and filesystem take ``RWF_DSYNC`` (probed with an empty write,
    before any data, so that a refusal never leaves half a group written)."""
    if not DSYNC_FLAGS:
        return False
    try:
        os.pwritev(fd, [b""], -1, DSYNC_FLAGS)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        log.info("RWF_DSYNC writes unsupported here (%s): writev + fdatasync", exc)
        return False
    return True


def write_all(fd: int, parts: list[bytes | memoryview], position: int, flags: int = 0) -> None:
    """Write every buffer, one after the other, from ``position`` on, resuming after
    partial writes; with ``flags`` (``RWF_DSYNC``) each call is also synced before it
    returns."""
    i = 0
    while i < len(parts):
        chunk = parts[i : i + writev_buffers_max]
        written = os.pwritev(fd, chunk, position, flags)
        position += written
        for part in chunk:
            size = len(part)
            if written >= size:
                written -= size
                i += 1
                continue
            parts[i] = memoryview(part)[written:]  # partial: resume inside this buffer
            break


def delete_files(paths: Sequence[Path], directory: Path) -> None:
    """Unlink every path (gone already is fine), then fsync their directory."""
    for path in paths:
        path.unlink(missing_ok=True)
    fsync_dir(directory)


def pread_all(fds: list[int], locations: Sequence[Location]) -> list[bytes]:
    """Each location's bytes, read from the matching descriptor."""
    out = []
    for fd, location in zip(fds, locations, strict=True):
        data = os.pread(fd, location.size, location.position)
        out.append(data)
    return out
