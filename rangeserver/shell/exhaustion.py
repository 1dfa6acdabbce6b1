"""Resources the log can run out of, and how it knows they are back.

**Exhaustion** (ENOSPC or EDQUOT: ``"disk"``; EMFILE or ENFILE: ``"descriptors"``; a short
direct write) wrote nothing the log keeps: the log cuts back, refuses appends with a
retriable ``StorageError``, keeps taking control entries and resumes once
:func:`resource_back` says so (ENOSPC comes at ``write()``, while allocating, so no byte is
left for a later writeback to lose). **Anything else**, and any failed fdatasync
(:class:`SyncFailed`), stops the log until a restart (fsyncgate). :class:`Headroom`, a
file of zeros deleted when the disk fills, leaves room for control entries and the
checkpoint. The whole story: docs/ARCHITECTURE.md 2.1.

Side effects: the headroom file (create, write, fdatasync, delete), probe descriptors.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Final

from estream.server.durable import fsync_dir
from estream.wire import limits

log = logging.getLogger(__name__)

HEADROOM: Final = "headroom.reserve"
headroom_bytes: Final = 8 * limits.MiB  # deleted when the disk fills: room for control entries
probe_interval_s: Final = 1.0  # how often an exhausted log looks whether the resource is back
probe_descriptors: Final = 16  # descriptors that must open for "descriptors" to be back
_RESOURCES: Final = {
    errno.ENOSPC: "disk",
    errno.EDQUOT: "disk",
    errno.EMFILE: "descriptors",
    errno.ENFILE: "descriptors",
}
RESOURCES: Final = ("disk", "descriptors")


class SyncFailed(OSError):
    """An fdatasync failed: never exhaustion, whatever its errno (see the module)."""


def sync(fd: int) -> None:
    """``os.fdatasync(fd)``, its failure raised as :class:`SyncFailed`."""
    try:
        os.fdatasync(fd)
    except OSError as exc:
        raise SyncFailed(exc.errno, exc.strerror) from exc


def exhausted_resource(exc: OSError) -> str | None:
    """The resource a failed write or open ran out of (``"disk"``, ``"descriptors"``), or
    None when the failure is not exhaustion (the log must stop)."""
    if isinstance(exc, SyncFailed):
        return None
    return _RESOURCES.get(exc.errno or 0)


class Headroom:
    """The headroom file in ``directory`` (see the module)."""

    def __init__(self, directory: Path, size_bytes: int = headroom_bytes) -> None:
        self.path = directory / HEADROOM
        self.size_bytes = size_bytes

    def present(self) -> bool:
        try:
            return self.path.stat().st_size == self.size_bytes
        except FileNotFoundError:
            return False

    def release(self) -> bool:
        """Delete the file (durably); True if there was one to free."""
        if not self.path.exists():
            return False
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)
        log.warning("log headroom released (%d bytes) for control entries", self.size_bytes)
        return True

    def restore(self) -> bool:
        """Write the file again when the disk has room for it and as much again free
        after; True once it is there. An OSError (the disk filled meanwhile) leaves no
        partial file."""
        if self.present():
            return True
        if free_bytes(self.path.parent) < 2 * self.size_bytes:
            return False
        try:
            # O_DSYNC: each write durable when it returns (the log's own syncs stay its).
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DSYNC
            fd = os.open(self.path, flags, 0o644)
            try:
                zeros = bytes(min(self.size_bytes, limits.MiB))
                done = 0
                while done < self.size_bytes:
                    done += os.pwrite(fd, zeros[: self.size_bytes - done], done)
            finally:
                os.close(fd)
            fsync_dir(self.path.parent)
        except OSError as exc:
            log.info("log headroom not written yet: %s", exc)
            self.path.unlink(missing_ok=True)
            return False
        return True


def free_bytes(directory: Path) -> int:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def descriptors_back() -> bool:
    """Whether :data:`probe_descriptors` more descriptors open now (closed again)."""
    opened: list[int] = []
    try:
        for _ in range(probe_descriptors):
            opened.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        return False
    finally:
        for fd in opened:
            os.close(fd)
    return True


def resource_back(resource: str, headroom: Headroom) -> bool:
    """Whether appends may resume: the disk has room again (the headroom file written
    back), or descriptors open again."""
    if resource == "disk":
        return headroom.restore()
    return descriptors_back()
