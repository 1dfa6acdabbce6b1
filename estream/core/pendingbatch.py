"""The writer's pending batch: the records taken since the last cut, encoded as they come
(each record's head, then its value), cut into one encoded section.

Pure: no I/O.
"""

from __future__ import annotations

from estream.wire.record import EncodedRecords, is_extended_head, section_of_parts, with_system


class PendingBatch:
    """The records of the batch being filled; :meth:`cut` encodes and empties it. Its
    fields are read and written in place by the range writer's per-record path."""

    __slots__ = ("parts", "count", "keyed", "first_ts", "max_ts", "sequences", "bytes",
                 "since_ms", "stamped")

    def __init__(self, *, stamped: bool) -> None:
        self.parts: list[bytes] = []
        self.count = 0
        self.keyed = False  # some head is extended (the batch is KEYED)
        self.first_ts = 0
        self.max_ts = 0
        self.sequences: list[int] = []  # a producer's, one per record (``stamped``)
        self.bytes = 0
        self.since_ms = 0  # when the first record was taken (its linger's start)
        self.stamped = stamped  # its records carry sequences (the range writer's stamp)

    def take(self, head: bytes, value: bytes, timestamp: int, now_ms: int,
             sequence: int) -> None:
        """Add one record (``head``: :func:`~estream.wire.record.encode_record_head`)."""
        if not self.count:
            self.since_ms = now_ms
            self.first_ts = self.max_ts = timestamp
        elif timestamp > self.max_ts:
            self.max_ts = timestamp
        parts = self.parts
        parts.append(head)
        parts.append(value)
        self.count += 1
        if not self.keyed and is_extended_head(head):
            self.keyed = True
        if self.stamped:
            self.sequences.append(sequence)
        self.bytes += len(head) + len(value)

    def cut(self, producer_id: str, digest: int) -> tuple[int, EncodedRecords]:
        """Empty the batch; its record count and encoded section (with the system block of
        ``producer_id``'s sequences and ``digest`` when either is set). Raises
        :class:`~estream.wire.errors.MalformedBatch` for records that cannot be encoded
        (the batch is emptied all the same)."""
        parts, count, keyed, sequences = self.parts, self.count, self.keyed, self.sequences
        self.clear()
        section = section_of_parts(parts, count, self.first_ts, self.max_ts, keyed)
        if producer_id or digest:
            section = with_system(
                section,
                producer_id=producer_id,
                sequences=sequences if producer_id else None,
                digest=digest,
            )
        return count, section

    def clear(self) -> None:
        self.parts = []
        self.count = 0
        self.keyed = False
        self.sequences = []
        self.bytes = 0


__all__ = ["PendingBatch"]
