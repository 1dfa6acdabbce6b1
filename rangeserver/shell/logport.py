"""The log port: everything the store asks of its write-ahead log, as a typed protocol.

:class:`~rangeserver.shell.wal.Wal` (segment files, group commit by a thread or O_DIRECT
AIO) implements it for the range server; tests/sim/simlog.py implements it on a simulated
disk that loses unsynced writes, so the real :class:`~rangeserver.shell.store.Store` runs
in virtual time. The store, its reads, the carrier, PING, the metrics and the probes see
only this. A structural type: nothing is checked or called through it at run time.

Side effects: none (a type).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from estream.wire.errors import StorageError
from rangeserver.index import Location
from rangeserver.shell.diskpacer import DiskPacer


class SpareCount(Protocol):
    def ready(self) -> int:
        """Spare segments ready now (PING reports it)."""
        ...


class LogPort(Protocol):
    """The write-ahead log as the store uses it (each method: ``Wal``'s docstring)."""

    # Where the next entry goes, the bytes the log holds, its figures and state.
    segment: int
    position: int
    segment_bytes_max: int
    bytes_total: int
    mode: str  # the writer chosen at start ("direct", "thread"; the simulator's "sim")
    failed: StorageError | None  # a write or fdatasync failed: appends fail until restart
    exhausted: str | None  # the resource that ran out: batches refused until it is back
    exhaustions: int
    pacer: DiskPacer | None  # --disk-bytes-per-s-max's (None: off)
    on_resumed: Callable[[], None] | None  # a new writer took over after a cut back
    on_sync: Callable[[float], None] | None  # seconds each durable write took

    @property
    def spares(self) -> SpareCount: ...

    # -- recovery, before start (synchronous: nothing is served yet)
    def segments(self) -> list[int]: ...
    def segment_size(self, segment: int) -> int: ...
    def read_segment(self, segment: int, start: int = 0) -> bytes: ...
    def truncate(self, segment: int, size: int, tail: bytes = b"") -> None: ...
    def start(self, loop: asyncio.AbstractEventLoop, segment: int, position: int) -> None: ...

    # -- serving: entries, group commit and its durable callbacks
    def append(
        self,
        parts: Sequence[bytes | memoryview],
        size: int,
        *,
        sync: bool = True,
        on_durable: Callable[[], None] | None = None,
        on_failed: Callable[[], None] | None = None,
        control: bool = False,
    ) -> tuple[Location, asyncio.Future[None]]: ...
    def check_room(self) -> None: ...
    def barrier(self, *, sync: bool = True) -> asyncio.Future[None]: ...
    async def force(self) -> None: ...
    async def read(self, locations: Sequence[Location]) -> list[bytes]: ...
    async def delete_segments(self, segments: Sequence[int]) -> int: ...
    async def close(self) -> None: ...
