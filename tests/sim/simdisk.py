"""A simulated disk that loses what was not synced when its node crashes.

:class:`SimDisk` holds named files as two images: what was *written* (what reads see) and
what is *durable* (what an fsync covered). ``sync`` takes a seeded, virtual time (on a
:class:`~tests.sim.simloop.SimLoop`) and makes durable what was written when it began.
:meth:`SimDisk.crash` is a power loss: each file goes back to its durable image plus,
the seed deciding, a prefix of the writes after it (the page cache flushed some of them
on its own), never the last of them whole (a torn write); files created and never synced
vanish, files deleted but not synced come back (:meth:`SimDisk.sync_dir` makes deletions
durable). :meth:`SimDisk.flip` is the medium changing a byte under both images (what a
reader's checksum must find).

Pure: no I/O (tests only).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Final

SYNC_MS: Final = (1.0, 3.0)  # one fsync, uniform (ms)


@dataclass
class _File:
    written: bytearray = field(default_factory=bytearray)
    durable: bytearray | None = None  # None: the file itself is not durable yet
    unsynced: list[tuple[int, bytes]] = field(default_factory=list)  # writes since the sync


class SimDisk:
    """The files of one simulated node (see the module)."""

    def __init__(self, rng: random.Random, sync_ms: tuple[float, float] = SYNC_MS) -> None:
        self.rng = rng
        self.sync_ms = sync_ms
        self.files: dict[str, _File] = {}
        self.deleted: dict[str, _File] = {}  # deleted since their last sync
        self.syncs = 0

    def names(self) -> list[str]:
        return sorted(self.files)

    def write(self, name: str, offset: int, data: bytes) -> None:
        file = self.files.get(name)
        if file is None:
            file = self.files[name] = _File()
        end = offset + len(data)
        if len(file.written) < end:
            file.written.extend(bytes(end - len(file.written)))
        file.written[offset:end] = data
        file.unsynced.append((offset, bytes(data)))

    def append(self, name: str, data: bytes) -> int:
        """Write at the end; the offset written at."""
        offset = self.size(name)
        self.write(name, offset, data)
        return offset

    def read(self, name: str, offset: int = 0, size: int | None = None) -> bytes:
        written = self.files[name].written
        return bytes(written[offset:] if size is None else written[offset:offset + size])

    def size(self, name: str) -> int:
        file = self.files.get(name)
        return 0 if file is None else len(file.written)

    def delete(self, name: str) -> None:
        file = self.files.pop(name)
        if file.durable is not None:
            self.deleted[name] = file

    def sync_dir(self) -> None:
        """The directory's fsync: the deletions so far are durable (not undone by a crash)."""
        self.deleted.clear()

    def truncate(self, name: str, size: int) -> None:
        """Cut ``name`` to ``size`` bytes (durable once synced; writes past it are gone)."""
        file = self.files[name]
        del file.written[size:]
        file.unsynced = [(offset, data[:max(0, size - offset)])
                         for offset, data in file.unsynced if offset < size]

    def flip(self, name: str, offset: int) -> None:
        """The medium changes the byte at ``offset``: reads and a crash both see it."""
        file = self.files[name]
        file.written[offset] ^= 0xFF
        if file.durable is not None and offset < len(file.durable):
            file.durable[offset] ^= 0xFF

    def sync_now(self, name: str) -> None:
        """An fsync that takes no virtual time (a recovery's, before anything is served)."""
        file = self.files[name]
        file.durable = bytearray(file.written)
        file.unsynced.clear()
        self.deleted.pop(name, None)
        self.syncs += 1

    async def sync(self, name: str) -> None:
        """fsync: what ``name`` held when it began is durable when it returns."""
        file = self.files[name]
        image, covered = bytearray(file.written), len(file.unsynced)
        await asyncio.sleep(self.rng.uniform(*self.sync_ms) / 1000)
        self.syncs += 1
        file.durable = image
        del file.unsynced[:covered]
        self.deleted.pop(name, None)

    def crash(self, *, lose_all: bool = False) -> None:
        """Power loss (see the module); ``lose_all``: no unsynced write reached the disk."""
        for name, file in self.deleted.items():
            self.files.setdefault(name, file)
        self.deleted.clear()
        for name, file in list(self.files.items()):
            if file.durable is None:
                del self.files[name]
                continue
            image = bytearray(file.durable)
            kept = self.rng.randint(0, max(0, len(file.unsynced) - 1))  # never the last whole
            if lose_all:
                kept = 0
            reached = list(file.unsynced[:kept])
            if kept < len(file.unsynced) and not lose_all and self.rng.random() < 0.5:  # torn
                offset, data = file.unsynced[kept]
                reached.append((offset, data[:self.rng.randrange(len(data))]))
            for offset, data in reached:
                end = offset + len(data)
                if len(image) < end:
                    image.extend(bytes(end - len(image)))
                image[offset:end] = data
            file.written, file.durable, file.unsynced = image, bytearray(image), []
