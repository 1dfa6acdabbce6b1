"""The sparse time index of one range replica: where to start looking for a timestamp.

Writers' clocks may go backwards, so the index keeps the **running maximum** of record
timestamps: the first offset whose record is at or after ``t`` is where the running
maximum first reaches ``t``, well defined and monotonic in ``t``. Entries ``(timestamp,
end)`` are added at most once per :data:`entry_interval_bytes` of batches and only when
the maximum grew (Kafka's rule); the rule, a worked example, the statistics kept and a
``partial`` index: :class:`TimeIndex`.

Pure: no I/O.
"""

from __future__ import annotations

import bisect
from array import array
from typing import Any, Final

entry_interval_bytes: Final = 4096  # at most one entry per this many bytes of batches


class TimeIndex:
    """Running-maximum time index and statistics of one replica.

    Entries are ``(timestamp, end)`` pairs meaning "every record below ``end`` has a
    timestamp at most ``timestamp``". After each batch the index adds one (the running
    maximum, the batch's end) only when at least :data:`entry_interval_bytes` of batches came
    since the last entry **and** the running maximum grew past the last entry's timestamp
    (Kafka's rule): at most one 16-byte entry per 4 KiB of log, timestamps and ends both
    strictly increasing. A lookup for ``t`` (:meth:`TimeIndex.scan_start`) takes the last
    entry whose timestamp is below ``t``: everything below its end is older than ``t``, so the
    caller scans batches from there and stops at the first batch whose ``max_timestamp`` is
    at least ``t`` (the first record at or after ``t`` is in it: the one
    :func:`estream.wire.timestamps.first_at_or_after` picks).

    Worked example (interval 0 for brevity): batches ``[0,2) max 100``, ``[2,4) max 90``
    (a clock went back), ``[4,6) max 150`` give entries ``(100, 2), (150, 6)``;
    ``scan_start(120)`` is 2 (offsets 0..1 are at most 100, below 120) and the scan finds the
    batch ``[4,6)``; ``scan_start(100)`` is the replica's start (no entry below 100).

    The index also keeps the replica's statistics: ``max_timestamp`` (the running maximum of
    everything held, an upper bound of what is readable), ``min_timestamp`` (the smallest
    first-record timestamp of its batches: records inside a batch may be older, so it is
    informational only and never used to skip data) and ``bytes`` (its batches' sizes).

    A replica recovered from a checkpoint written without its time index is ``partial``:
    its entries do not cover the batches before the checkpoint, so lookups scan it from its
    start (slower, never wrong) and its statistics are unknown.
    """

    __slots__ = ("_stamps", "_ends", "max_timestamp", "min_timestamp", "bytes", "_since",
                 "partial")

    def __init__(self, *, partial: bool = False) -> None:
        self._stamps = array("q")
        self._ends = array("q")
        self.max_timestamp: int | None = None
        self.min_timestamp: int | None = None
        self.bytes = 0
        self._since = 0  # batch bytes since the last entry
        self.partial = partial

    def __len__(self) -> int:
        return len(self._stamps)

    def observe(self, end: int, first_timestamp: int, max_timestamp: int, size: int) -> None:
        """A batch ending at ``end`` was added to the replica (in offset order)."""
        if self.max_timestamp is None or max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
        if self.min_timestamp is None or first_timestamp < self.min_timestamp:
            self.min_timestamp = first_timestamp
        self.bytes += size
        self._since += size
        grew = not self._stamps or self.max_timestamp > self._stamps[-1]
        if grew and self._since >= entry_interval_bytes:
            self._stamps.append(self.max_timestamp)
            self._ends.append(end)
            self._since = 0

    def scan_start(self, timestamp_ms: int, start: int) -> int:
        """Where a scan for the first record at or after ``timestamp_ms`` begins: the end
        of the last entry older than it, else the replica's ``start``."""
        if self.partial:
            return start
        i = bisect.bisect_left(self._stamps, timestamp_ms)
        return start if i == 0 else max(start, self._ends[i - 1])

    def may_hold(self, timestamp_ms: int) -> bool:
        """False when no record held is at or after ``timestamp_ms``."""
        return self.partial or (self.max_timestamp is not None
                                and self.max_timestamp >= timestamp_ms)

    def stats(self) -> dict[str, Any]:
        """``{"min_timestamp", "max_timestamp", "bytes"}`` (None when unknown: partial)."""
        if self.partial:
            return {"min_timestamp": None, "max_timestamp": None, "bytes": None}
        return {"min_timestamp": self.min_timestamp, "max_timestamp": self.max_timestamp,
                "bytes": self.bytes}

    def to_wire(self) -> dict[str, Any]:
        return {
            "stamps": self._stamps.tobytes(),
            "ends": self._ends.tobytes(),
            "max": self.max_timestamp,
            "min": self.min_timestamp,
            "bytes": self.bytes,
            "since": self._since,
            "partial": self.partial,
        }

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> TimeIndex:
        """Parse :meth:`to_wire`'s map; raises ValueError when inconsistent."""
        index = cls(partial=bool(raw["partial"]))
        index._stamps.frombytes(raw["stamps"])
        index._ends.frombytes(raw["ends"])
        if len(index._stamps) != len(index._ends):
            raise ValueError("time index columns of different lengths")
        index.max_timestamp = None if raw["max"] is None else int(raw["max"])
        index.min_timestamp = None if raw["min"] is None else int(raw["min"])
        index.bytes, index._since = int(raw["bytes"]), int(raw["since"])
        return index
