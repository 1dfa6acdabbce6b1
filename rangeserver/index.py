"""Where each replica's batches are in the log, and a bounded cache of recent batches.

:class:`RangeIndex` maps an offset of one range replica to the log location of the batch
holding it: batches of a replica arrive in offset order, so the index is a few parallel
append-only arrays searched with ``bisect`` (about 40 bytes per batch). It is saved in the
checkpoint as raw arrays.

:class:`BatchCache` keeps the most recently appended batches (bounded in bytes, oldest
evicted first) so that tail reads, the common case, are served from memory.

Pure: no I/O.
"""

from __future__ import annotations

import bisect
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, unsafe_hash=True)
class Location:
    """A batch in the log: segment number, byte position of the batch, its size (a value,
    never changed; not frozen: one is made per batch stored, and a frozen dataclass's
    construction costs several times as much)."""

    segment: int
    position: int
    size: int


@dataclass(frozen=True, slots=True)
class IndexedBatch:
    base: int
    end: int
    location: Location


class RangeIndex:
    """Batch locations of one range replica, in offset order."""

    __slots__ = ("_bases", "_ends", "_segments", "_positions", "_sizes")

    def __init__(self) -> None:
        self._bases = array("q")
        self._ends = array("q")
        self._segments = array("q")
        self._positions = array("q")
        self._sizes = array("q")

    def __len__(self) -> int:
        return len(self._bases)

    def add(self, base: int, end: int, location: Location) -> None:
        """Append a batch; it must start where the previous one ended (or later)."""
        assert not self._ends or base >= self._ends[-1], "index batches out of order"
        assert end > base
        self._bases.append(base)
        self._ends.append(end)
        self._segments.append(location.segment)
        self._positions.append(location.position)
        self._sizes.append(location.size)

    def find(self, offset: int) -> int | None:
        """Index of the batch holding ``offset``, or None."""
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0 or offset >= self._ends[i]:
            return None
        return i

    def count_ended_by(self, offset: int) -> int:
        """How many batches end at or below ``offset``."""
        return bisect.bisect_right(self._ends, offset)

    def batch(self, i: int) -> IndexedBatch:
        location = Location(self._segments[i], self._positions[i], self._sizes[i])
        return IndexedBatch(self._bases[i], self._ends[i], location)

    def select(
        self, offset: int, end_max: int, bytes_max: int, *, partial_last: bool
    ) -> list[IndexedBatch]:
        """The batches from the one holding ``offset`` whose end is at most ``end_max`` (or,
        with ``partial_last``, that start below it), until ``bytes_max`` is passed; at least
        one batch when any qualifies."""
        i = self.find(offset)
        if i is None:
            return []
        chosen: list[IndexedBatch] = []
        total = 0
        while i < len(self._bases):
            batch = self.batch(i)
            fits = batch.base < end_max if partial_last else batch.end <= end_max
            if not fits or (chosen and total + batch.location.size > bytes_max):
                break
            chosen.append(batch)
            total += batch.location.size
            i += 1
        return chosen

    def bytes_total(self) -> int:
        """The bytes of every batch indexed."""
        return sum(self._sizes)

    def moved(self, bases: Sequence[int], locations: Sequence[Location]) -> None:
        """The first ``len(bases)`` batches (which start at ``bases``) are now at
        ``locations``: the log carried them forward (``rangeserver/carry.py``)."""
        assert list(self._bases[: len(bases)]) == list(bases), "index batches changed"
        for i, location in enumerate(locations):
            self._segments[i] = location.segment
            self._positions[i] = location.position
            self._sizes[i] = location.size

    def truncate(self, base: int) -> None:
        """Forget the batches from the one starting at ``base`` on (their log entries
        were cut back: never written)."""
        i = bisect.bisect_left(self._bases, base)
        for column in (self._bases, self._ends, self._segments, self._positions, self._sizes):
            del column[i:]

    def to_wire(self) -> dict[str, bytes]:
        return {
            "bases": self._bases.tobytes(),
            "ends": self._ends.tobytes(),
            "segments": self._segments.tobytes(),
            "positions": self._positions.tobytes(),
            "sizes": self._sizes.tobytes(),
        }

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> RangeIndex:
        index = cls()
        for name in ("bases", "ends", "segments", "positions", "sizes"):
            column = array("q")
            column.frombytes(raw[name])
            setattr(index, f"_{name}", column)
        sizes = {len(getattr(index, f"_{n}")) for n in ("bases", "ends", "segments")}
        if len(sizes) != 1:
            raise ValueError("index columns of different lengths")
        return index


CacheKey = tuple[int, int, int]  # stream id, range index, base offset


class BatchCache:
    """Recently appended batches, at most ``bytes_max`` bytes, oldest evicted first."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self._batches: OrderedDict[CacheKey, bytes] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._batches)

    def put(self, key: CacheKey, batch: bytes) -> None:
        if len(batch) > self.bytes_max:
            return
        old = self._batches.pop(key, None)
        if old is not None:
            self.bytes -= len(old)
        self._batches[key] = batch
        self.bytes += len(batch)
        while self.bytes > self.bytes_max:
            _, evicted = self._batches.popitem(last=False)
            self.bytes -= len(evicted)

    def get(self, key: CacheKey) -> bytes | None:
        batch = self._batches.get(key)
        if batch is None:
            self.misses += 1
        else:
            self.hits += 1
        return batch

    def drop_range(self, stream_id: int, range_index: int) -> None:
        """Forget a replica's batches (e.g. once it is found damaged)."""
        for key in [k for k in self._batches if k[0] == stream_id and k[1] == range_index]:
            self.bytes -= len(self._batches.pop(key))
