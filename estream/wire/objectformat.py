"""The object-tier format: sealed ranges' batches in an object, its index and its footer.

An object holds the record batches of one or more sealed ranges exactly as the range
servers store them (checksums kept: every reader verifies every batch), each range's
back to back; then an index of one entry per batch; then a 64-byte footer. Version 2 (what
the offloader writes) holds many ranges, 52-byte entries, and the catalog keeps each
range's *part* (:class:`~estream.wire.meta.ObjectPart`), so a reader GETs its entries
(:func:`decode_part`) then its batches; version 1 (one range, 40-byte entries) still reads.
Byte layouts: docs/ARCHITECTURE.md 3.3. Both are checked on encode and decode (contiguous
offsets, entries back to back); malformed input raises only :class:`MalformedObject`, a
failed footer or index checksum :class:`ChecksumMismatch`.

Pure: no I/O.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Final

import xxhash

from estream.wire.errors import ChecksumMismatch, EstreamError, MalformedObject
from estream.wire.meta import ObjectPart
from estream.wire.record import decode_columns, iter_batches, verify_batch

OBJECT_MAGIC: Final = 0xE50B1EC7
OBJECT_VERSION: Final = 1  # one range per object (read; written by encode_object)
PACK_VERSION: Final = 2  # several ranges per object (what the offloader writes)
VERSIONS: Final = (OBJECT_VERSION, PACK_VERSION)
_ENTRY: Final = struct.Struct("<QIQIqq")
_ENTRY2: Final = struct.Struct("<QIQIQIqq")
PACK_ENTRY_BYTES: Final = _ENTRY2.size  # 52
_FOOTER: Final = struct.Struct("<IHHQIIQQQQQ")
INDEX_ENTRY_BYTES: Final = _ENTRY.size  # 40
FOOTER_BYTES: Final = _FOOTER.size  # 64
_FOOTER_CHECKSUM_AT: Final = FOOTER_BYTES - 8
assert INDEX_ENTRY_BYTES == 40 and FOOTER_BYTES == 64


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """Where one batch lies in the object and what it holds."""

    base_offset: int
    count: int
    position: int
    length: int
    min_timestamp: int
    max_timestamp: int
    stream_id: int = 0  # version 2 only (version 1: the footer's)
    range_index: int = 0

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count

    def pack(self) -> bytes:
        """The entry's 52 bytes in a version-2 index."""
        return _ENTRY2.pack(self.stream_id, self.range_index, self.base_offset, self.count,
                            self.position, self.length, self.min_timestamp,
                            self.max_timestamp)


@dataclass(frozen=True, slots=True)
class ObjectFooter:
    """The fixed footer: what the object holds and where its index is."""

    stream_id: int
    range_index: int
    batch_count: int
    start_offset: int
    end_offset: int
    index_position: int
    index_bytes: int
    checksum: int
    version: int = OBJECT_VERSION

    @property
    def object_bytes(self) -> int:
        """The whole object's size this footer implies."""
        return self.index_position + self.index_bytes + FOOTER_BYTES

    @property
    def range_count(self) -> int:
        """Ranges with batches the object holds (version 1: its one range)."""
        return self.range_index if self.version == PACK_VERSION else 1

    @property
    def entry_bytes(self) -> int:
        return PACK_ENTRY_BYTES if self.version == PACK_VERSION else INDEX_ENTRY_BYTES


@dataclass(frozen=True, slots=True)
class ObjectIndex:
    """The decoded index of one object: its footer and an entry per batch, in order."""

    footer: ObjectFooter
    entries: tuple[IndexEntry, ...]

    def locate(self, start_offset: int, end_offset: int) -> tuple[int, int]:
        """The byte span ``[byte_start, byte_end)`` of the batches holding any offset of
        ``[start_offset, end_offset)``, for one ranged GET. The span starts at a batch
        boundary (the first batch may hold offsets below ``start_offset``: readers skip
        them). Raises :class:`MalformedObject` when the window is empty or outside the
        object's offsets.

        >>> # batches [0,10) at 0..100, [10,20) at 100..250: offsets 12..15 -> (100, 250)
        """
        f = self.footer
        if not f.start_offset <= start_offset < end_offset <= f.end_offset:
            raise MalformedObject(
                f"window [{start_offset}, {end_offset}) is outside the object's "
                f"[{f.start_offset}, {f.end_offset})"
            )
        first = self.entry_index(start_offset)
        last = self.entry_index(end_offset - 1)
        lo, hi = self.entries[first], self.entries[last]
        return lo.position, hi.position + hi.length

    def entry_index(self, offset: int) -> int:
        """The position in :attr:`entries` of the batch holding ``offset``."""
        at = bisect.bisect_right(self.entries, offset, key=_base_offset) - 1
        if at < 0 or offset >= self.entries[at].end_offset:
            raise MalformedObject(f"offset {offset} is not in the object")
        return at

    def windows(self, bytes_max: int) -> list[tuple[int, int]]:
        """The object's data as byte spans ``[lo, hi)`` of whole consecutive batches, each
        at most ``bytes_max`` long unless one batch alone is longer: one ranged GET each
        for a reader going through the whole object.

        >>> # batches of 100, 150, 100 bytes, at most 260 a window -> [(0, 250), (250, 350)]
        """
        out: list[tuple[int, int]] = []
        for e in self.entries:
            if out and e.position + e.length - out[-1][0] <= bytes_max:
                out[-1] = (out[-1][0], e.position + e.length)
            else:
                out.append((e.position, e.position + e.length))
        return out

    def ranges(self) -> list[tuple[int, int, tuple[IndexEntry, ...]]]:
        """``(stream_id, range_index, entries)`` of each range the object holds, in order
        (version 1: its one range, also when it holds no batch)."""
        f = self.footer
        if f.version == OBJECT_VERSION:
            return [(f.stream_id, f.range_index, self.entries)]
        out: list[tuple[int, int, tuple[IndexEntry, ...]]] = []
        at = 0
        for i in range(1, len(self.entries) + 1):
            if i == len(self.entries) or _owner(self.entries[i]) != _owner(self.entries[at]):
                e = self.entries[at]
                out.append((e.stream_id, e.range_index, self.entries[at:i]))
                at = i
        return out

    def first_at_or_after(self, timestamp_ms: int) -> int | None:
        """The base offset of the first batch whose max timestamp is at or after
        ``timestamp_ms`` (records before it are all older), or None."""
        for entry in self.entries:
            if entry.max_timestamp >= timestamp_ms:
                return entry.base_offset
        return None


def _base_offset(entry: IndexEntry) -> int:
    return entry.base_offset


def _owner(entry: IndexEntry) -> tuple[int, int]:
    return entry.stream_id, entry.range_index


@dataclass(frozen=True, slots=True)
class PackRange:
    """One sealed range to put in a version-2 object: its batches in offset order."""

    stream_id: int
    range_index: int
    start_offset: int
    end_offset: int
    batches: Sequence[bytes | memoryview]


def encode_pack_parts(
    ranges: Sequence[PackRange],
) -> tuple[list[bytes | memoryview], list[ObjectPart]]:
    """A version-2 object of ``ranges`` (distinct, each exactly its ``[start, end)``, every
    batch verified) as its parts in order (the batches, then one last part holding index
    and footer), and each range's :class:`ObjectPart` (what the catalog records)."""
    entries: list[IndexEntry] = []
    parts: list[ObjectPart] = []
    seen: set[tuple[int, int]] = set()
    position = 0
    for r in ranges:
        if (r.stream_id, r.range_index) in seen:
            raise MalformedObject(f"range {r.range_index} of stream {r.stream_id} twice")
        seen.add((r.stream_id, r.range_index))
        first, data_start = len(entries), position
        expected = r.start_offset
        for raw in r.batches:
            header = verify_batch(raw)
            if header.stream_id != r.stream_id or header.base_offset != expected:
                raise MalformedObject(
                    f"batch of stream {header.stream_id} at offset {header.base_offset} where "
                    f"stream {r.stream_id} offset {expected} was expected")
            min_ts = min(decode_columns(raw, verify=False).timestamps)
            entries.append(IndexEntry(header.base_offset, header.count, position,
                                      header.total_bytes, min_ts, header.max_timestamp,
                                      r.stream_id, r.range_index))
            position += header.total_bytes
            expected = header.end_offset
        if expected != r.end_offset:
            raise MalformedObject(f"batches of range {r.range_index} of stream {r.stream_id} "
                                  f"end at offset {expected}, the range at {r.end_offset}")
        mine = b"".join(e.pack() for e in entries[first:])
        parts.append(ObjectPart(data_start, position, first * PACK_ENTRY_BYTES,
                                len(entries) * PACK_ENTRY_BYTES, xxhash.xxh3_64_intdigest(mine)))
    index = b"".join(e.pack() for e in entries)
    range_count = sum(1 for r in ranges if r.end_offset > r.start_offset)
    footer = ObjectFooter(0, range_count, len(entries), 0, 0, position, len(index), 0,
                          PACK_VERSION)
    footer = replace(footer, checksum=_checksum(index, footer))
    # index spans in the catalog are byte positions in the object
    parts = [replace(p, index_start=position + p.index_start, index_end=position + p.index_end)
             for p in parts]
    data = [b for r in ranges for b in r.batches]
    return [*data, index + _pack_footer(footer)], parts


def decode_part(raw: bytes | memoryview, part: ObjectPart, *, stream_id: int,
                range_index: int, start_offset: int, end_offset: int) -> ObjectIndex:
    """The index of one range's part of a version-2 object from its entries (the bytes
    ``[part.index_start, part.index_end)``), checked against the catalog's checksum and
    the range: entries of that stream and range, back to back over ``part``'s data span,
    offsets contiguous over ``[start_offset, end_offset)``. Its footer describes the part
    (the range's stream, index and offsets; ``index_position``: the data span's end), so
    every reader of an :class:`ObjectIndex` reads a part like a version-1 object."""
    if len(raw) != part.index_end - part.index_start or len(raw) % PACK_ENTRY_BYTES:
        raise MalformedObject(f"part index of {len(raw)} bytes, the catalog says "
                              f"{part.index_end - part.index_start}")
    actual = xxhash.xxh3_64_intdigest(raw)
    if actual != part.checksum:
        raise ChecksumMismatch("object part index checksum mismatch", expected=part.checksum,
                               actual=actual)
    entries = tuple(_entry2(fields) for fields in _ENTRY2.iter_unpack(raw))
    position, offset = part.data_start, start_offset
    for e in entries:
        if (e.stream_id, e.range_index) != (stream_id, range_index) or e.position != position \
                or e.base_offset != offset or e.count == 0 or e.length == 0:
            raise MalformedObject(f"part index entry at offset {e.base_offset} is out of place")
        position += e.length
        offset += e.count
    if position != part.data_end or offset != end_offset:
        raise MalformedObject("part index entries do not cover the range's data and offsets")
    footer = ObjectFooter(stream_id, range_index, len(entries), start_offset, end_offset,
                          part.data_end, len(raw), part.checksum, PACK_VERSION)
    return ObjectIndex(footer, entries)


def _entry2(fields: tuple[int, ...]) -> IndexEntry:
    stream_id, range_index, base, count, position, length, lo, hi = fields
    return IndexEntry(base, count, position, length, lo, hi, stream_id, range_index)


def encode_object(
    batches: Sequence[bytes | memoryview],
    *,
    stream_id: int,
    range_index: int,
    start_offset: int,
    end_offset: int,
) -> bytes:
    """The object for a sealed range ``[start_offset, end_offset)`` from its batches in
    offset order (each verified). Raises :class:`MalformedObject` unless the batches cover
    the range exactly, and :class:`~estream.wire.errors.ChecksumMismatch` /
    :class:`~estream.wire.errors.MalformedBatch` for a bad batch."""
    return b"".join(encode_object_parts(batches, stream_id=stream_id, range_index=range_index,
                                        start_offset=start_offset, end_offset=end_offset))


def encode_object_parts(
    batches: Sequence[bytes | memoryview],
    *,
    stream_id: int,
    range_index: int,
    start_offset: int,
    end_offset: int,
) -> list[bytes | memoryview]:
    """:func:`encode_object` as the object's parts in order, without joining them: the
    batches as given, then one last part holding the index block and the footer (so an
    uploader streams the parts and never holds the object twice)."""
    entries: list[bytes] = []
    position = 0
    expected = start_offset
    for raw in batches:
        header = verify_batch(raw)
        if header.stream_id != stream_id:
            raise MalformedObject(
                f"batch of stream {header.stream_id} in an object of stream {stream_id}"
            )
        if header.base_offset != expected:
            raise MalformedObject(
                f"batch at offset {header.base_offset} where {expected} was expected"
            )
        min_ts = min(decode_columns(raw, verify=False).timestamps)
        entries.append(
            _ENTRY.pack(
                header.base_offset,
                header.count,
                position,
                header.total_bytes,
                min_ts,
                header.max_timestamp,
            )
        )
        position += header.total_bytes
        expected = header.end_offset
    if expected != end_offset:
        raise MalformedObject(f"batches end at offset {expected}, the range at {end_offset}")
    index = b"".join(entries)
    footer = ObjectFooter(stream_id, range_index, len(entries), start_offset, end_offset,
                          position, len(index), 0)
    footer = replace(footer, checksum=_checksum(index, footer))
    return [*batches, index + _pack_footer(footer)]


def decode_footer(tail: bytes | memoryview) -> ObjectFooter:
    """The footer from the last :data:`FOOTER_BYTES` of ``tail`` (any suffix of the
    object at least that long). Checks its fields; the checksum needs the index too and
    is checked by :func:`decode_index`."""
    if len(tail) < FOOTER_BYTES:
        raise MalformedObject(f"{len(tail)} bytes is shorter than an object footer")
    (magic, version, flags, stream_id, range_index, batch_count, start_offset, end_offset,
     index_position, index_bytes, checksum) = _FOOTER.unpack_from(tail, len(tail) - FOOTER_BYTES)
    if magic != OBJECT_MAGIC:
        raise MalformedObject(f"bad object magic {magic:#010x}")
    if version not in VERSIONS:
        raise MalformedObject(f"unsupported object format version {version}")
    if flags != 0:
        raise MalformedObject(f"unsupported object flags {flags:#06x}")
    f = ObjectFooter(stream_id, range_index, batch_count, start_offset, end_offset,
                     index_position, index_bytes, checksum, version)
    if f.index_bytes != f.batch_count * f.entry_bytes:
        raise MalformedObject(f"index of {f.index_bytes} bytes for {f.batch_count} batches")
    if version == PACK_VERSION:
        if stream_id or start_offset or end_offset or f.range_count > batch_count or (
                (batch_count > 0) != (f.range_count > 0)):
            raise MalformedObject("bad version-2 footer fields")
        return f
    if f.end_offset < f.start_offset or (f.batch_count == 0) != (f.end_offset == f.start_offset):
        raise MalformedObject(f"bad offsets [{f.start_offset}, {f.end_offset}) for the object")
    return f


def decode_index(index: bytes | memoryview, footer: ObjectFooter) -> ObjectIndex:
    """The index block (exactly ``footer.index_bytes`` long) decoded and checked against
    the footer's checksum and offsets."""
    if len(index) != footer.index_bytes:
        raise MalformedObject(f"index is {len(index)} bytes, footer says {footer.index_bytes}")
    actual = _checksum(index, footer)
    if actual != footer.checksum:
        raise ChecksumMismatch("object index checksum mismatch", expected=footer.checksum,
                               actual=actual)
    if footer.version == PACK_VERSION:
        entries = tuple(_entry2(fields) for fields in _ENTRY2.iter_unpack(index))
        _check_pack_entries(entries, footer)
    else:
        entries = tuple(IndexEntry(*fields) for fields in _ENTRY.iter_unpack(index))
        _check_entries(entries, footer)
    return ObjectIndex(footer, entries)


def _pack_footer(f: ObjectFooter) -> bytes:
    return _FOOTER.pack(OBJECT_MAGIC, f.version, 0, f.stream_id, f.range_index, f.batch_count,
                        f.start_offset, f.end_offset, f.index_position, f.index_bytes,
                        f.checksum)


def _checksum(index: bytes | memoryview, footer: ObjectFooter) -> int:
    """xxh3-64 of the index block followed by the footer's bytes before its checksum."""
    digest = xxhash.xxh3_64(index)
    digest.update(_pack_footer(footer)[:_FOOTER_CHECKSUM_AT])
    return digest.intdigest()


def _check_entries(entries: Sequence[IndexEntry], footer: ObjectFooter) -> None:
    position, offset = 0, footer.start_offset
    for e in entries:
        if e.position != position or e.base_offset != offset or e.count == 0 or e.length == 0:
            raise MalformedObject(f"index entry at offset {e.base_offset} is out of place")
        position += e.length
        offset += e.count
    if position != footer.index_position or offset != footer.end_offset:
        raise MalformedObject("index entries do not cover the object's data and offsets")


def _check_pack_entries(entries: Sequence[IndexEntry], footer: ObjectFooter) -> None:
    """Version 2: entries back to back from byte 0, each range one run with contiguous
    offsets, no range twice."""
    position = 0
    seen: set[tuple[int, int]] = set()
    previous: IndexEntry | None = None
    for e in entries:
        if e.position != position or e.count == 0 or e.length == 0:
            raise MalformedObject(f"index entry at position {e.position} is out of place")
        if previous is not None and _owner(previous) == _owner(e):
            if e.base_offset != previous.end_offset:
                raise MalformedObject(f"index entry at offset {e.base_offset} is out of place")
        elif _owner(e) in seen:
            raise MalformedObject(f"range {e.range_index} of stream {e.stream_id} twice")
        seen.add(_owner(e))
        position += e.length
        previous = e
    if position != footer.index_position or len(seen) != footer.range_index:
        raise MalformedObject("index entries do not cover the object's data and ranges")


def decode_tail(tail: bytes | memoryview) -> ObjectIndex | None:
    """The index from a suffix of the object (one GET of its last bytes), or None when the
    suffix is too short to hold the whole index (then GET ``footer.index_position``
    onwards)."""
    footer = decode_footer(tail)
    need = footer.index_bytes + FOOTER_BYTES
    if len(tail) < need:
        return None
    end = len(tail) - FOOTER_BYTES
    return decode_index(memoryview(tail)[end - footer.index_bytes : end], footer)


def decode_object(data: bytes | memoryview) -> ObjectIndex:
    """A whole object checked end to end: footer, index, size, and every batch's checksum
    and place (what an uploader runs before committing an object it read back)."""
    index = decode_tail(data)
    if index is None or len(data) != index.footer.object_bytes:
        raise MalformedObject(f"object of {len(data)} bytes does not match its footer")
    view = memoryview(data)
    for entry in index.entries:
        raw = view[entry.position : entry.position + entry.length]
        header = verify_batch(raw)
        if (header.base_offset, header.count) != (entry.base_offset, entry.count):
            raise MalformedObject(f"batch at {entry.position} does not match its index entry")
        owner = entry.stream_id if index.footer.version == PACK_VERSION else (
            index.footer.stream_id)
        if header.stream_id != owner:
            raise MalformedObject(f"batch at {entry.position} is of another stream")
    return index


def iter_object_batches(data: bytes | memoryview) -> Iterator[tuple[int, memoryview]]:
    """The batches of a span read from an object (a :meth:`ObjectIndex.locate` span starts
    and ends at batch boundaries), as ``(base_offset, batch)``; each batch still has to be
    verified (``verify_batch``/``view_batch``) before its records are used."""
    try:
        for header, raw in iter_batches(data):
            yield header.base_offset, raw
    except EstreamError as exc:
        raise MalformedObject(f"object span does not hold whole batches: {exc}") from None
