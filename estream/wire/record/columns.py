"""Batches read as columns: ``BatchView`` (a verified batch, not decoded) and
``BatchColumns`` (offsets, values, timestamps, headers, keys of many batches at once), with
a strided fast path for batches whose records all have the same length and no headers.

Pure: no I/O.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from estream.wire.errors import (
    MalformedBatch,
)
from estream.wire.record.decode import (
    _decode_head,
    _uniform_value_bytes,
    decode_header,
    verify_batch,
)
from estream.wire.record.layout import (
    _RECORD,
    BATCH_HEADER_BYTES,
    FLAG_SYSTEM,
    RECORD_PREFIX_BYTES,
    BatchHeader,
    Record,
    records_at,
)


class _Listed:
    """Values of a window as views, one per record (the general walk)."""

    __slots__ = ("items",)

    def __init__(self, items: list[memoryview]) -> None:
        self.items = items

    def views(self) -> list[memoryview]:
        return self.items

    def values(self) -> list[bytes]:
        return list(map(bytes, self.items))


class _Strided:
    """Values of a uniform batch's window, left where they are: ``n`` records of
    ``stride`` bytes from ``records`` on, each a 16-byte prefix then ``value_bytes``
    bytes of value (no view or object per record until asked for)."""

    __slots__ = ("records", "n", "value_bytes")

    def __init__(self, records: memoryview, n: int, value_bytes: int) -> None:
        self.records = records  # exactly n records
        self.n = n
        self.value_bytes = value_bytes

    def views(self) -> list[memoryview]:
        size, records = self.value_bytes, self.records
        stride = RECORD_PREFIX_BYTES + size
        at = RECORD_PREFIX_BYTES
        return [records[p : p + size] for p in range(at, at + self.n * stride, stride)]

    def values(self) -> list[bytes]:
        fmt = f"<{RECORD_PREFIX_BYTES}x{self.value_bytes}s"
        return [value for (value,) in struct.iter_unpack(fmt, self.records)]


_Values = _Listed | _Strided


class BatchColumns:
    """Records of one batch (or of a window of it) as columns, without a :class:`Record`
    per record: what batch-level readers (the Spark source) turn into Arrow arrays.

    Record ``i`` has offset ``base_offset + i``, timestamp ``timestamps[i]`` (an int64
    ``array``, usable as an Arrow buffer as is), value
    ``data[value_offsets[i]:value_offsets[i + 1]]`` (values back to back; ``value_offsets``
    holds ``count + 1`` int32 entries, the first 0) and headers ``headers[i]``
    (``headers`` is None when no record of the window has headers) and key ``keys[i]``
    (``keys`` is None when no record of the window has a key).

    Decoded columns hold their values as views of the (verified) bytes they were decoded
    from until ``data`` is first asked for, which joins them into one buffer then (and
    drops the views): a consumer of :meth:`values` or of the timestamps alone never pays
    for that copy. Immutable.
    """

    __slots__ = ("base_offset", "timestamps", "value_offsets", "headers", "confirm_offset",
                 "keys", "_data", "_pieces")

    base_offset: int
    timestamps: array[int]
    value_offsets: array[int]
    headers: list[dict[str, str]] | None
    confirm_offset: int
    keys: list[bytes | None] | None
    _data: bytes | None
    _pieces: Sequence[_Values] | None

    def __init__(
        self,
        base_offset: int,
        timestamps: array[int],
        data: bytes,
        value_offsets: array[int],
        headers: list[dict[str, str]] | None = None,
        confirm_offset: int = 0,
        keys: list[bytes | None] | None = None,
    ) -> None:
        _set = object.__setattr__
        _set(self, "base_offset", base_offset)
        _set(self, "timestamps", timestamps)
        _set(self, "value_offsets", value_offsets)
        _set(self, "headers", headers)
        _set(self, "confirm_offset", confirm_offset)
        _set(self, "keys", keys)
        _set(self, "_data", data)
        _set(self, "_pieces", None)

    @classmethod
    def _of_pieces(
        cls,
        base_offset: int,
        timestamps: array[int],
        pieces: Sequence[_Values],
        value_offsets: array[int],
        headers: list[dict[str, str]] | None,
        confirm_offset: int,
        keys: list[bytes | None] | None = None,
    ) -> BatchColumns:
        """Columns whose values are those of ``pieces`` in order (lengths as
        ``value_offsets`` says), joined on first use of ``data``."""
        columns = cls(base_offset, timestamps, b"", value_offsets, headers, confirm_offset,
                      keys)
        object.__setattr__(columns, "_data", None)
        object.__setattr__(columns, "_pieces", pieces)
        return columns

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"BatchColumns is immutable: cannot set {name!r}")

    @property
    def data(self) -> bytes:
        """Every value, back to back (one buffer, built on first use)."""
        data = self._data
        if data is None:
            data = b"".join([v for piece in self._pieces or () for v in piece.views()])
            object.__setattr__(self, "_data", data)
            object.__setattr__(self, "_pieces", None)
        return data

    @property
    def count(self) -> int:
        return len(self.timestamps)

    @property
    def end_offset(self) -> int:
        """One past the last record's offset."""
        return self.base_offset + len(self.timestamps)

    def values(self) -> list[bytes]:
        """Every value as its own bytes object."""
        pieces = self._pieces
        if pieces is not None:
            if len(pieces) == 1:
                return pieces[0].values()
            return [v for piece in pieces for v in piece.values()]
        data, ends = self.data, self.value_offsets
        return [data[ends[i] : ends[i + 1]] for i in range(len(self.timestamps))]

    def records(self) -> list[Record]:
        """The same records as :class:`Record` objects (what :func:`decode_batch` gives)."""
        headers = self.headers or [{} for _ in self.timestamps]
        keys = self.keys or [None] * len(self.timestamps)
        first = self.base_offset
        return [
            Record(value, hdrs, ts, first + i, key)
            for i, (value, hdrs, ts, key) in enumerate(
                zip(self.values(), headers, self.timestamps, keys, strict=True)
            )
        ]

    def _fields(self) -> tuple[object, ...]:
        return (self.base_offset, self.timestamps, self.data, self.value_offsets,
                self.headers, self.confirm_offset, self.keys)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BatchColumns):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"BatchColumns(base_offset={self.base_offset!r}, timestamps="
                f"{self.timestamps!r}, data={self.data!r}, value_offsets="
                f"{self.value_offsets!r}, headers={self.headers!r}, confirm_offset="
                f"{self.confirm_offset!r}, keys={self.keys!r})")


@dataclass(frozen=True, slots=True)
class BatchView:
    """A verified batch kept as a view of the bytes it arrived in (a READ answer), and
    the window ``[start, end)`` of its offsets to decode: what a reader holds between
    receiving batches and decoding many of them at once with :func:`decode_views`.
    Cutting a window (:meth:`head`, :meth:`tail`) copies nothing."""

    header: BatchHeader
    batch: memoryview  # the whole batch, checksum verified
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start

    def head(self, n: int) -> BatchView:
        """The window's first ``n`` records."""
        return BatchView(self.header, self.batch, self.start, min(self.end, self.start + n))

    def tail(self, n: int) -> BatchView:
        """The window without its first ``n`` records."""
        return BatchView(self.header, self.batch, min(self.end, self.start + n), self.end)


def view_batch(
    batch: bytes | memoryview,
    *,
    start: int | None = None,
    end: int | None = None,
    verify: bool = True,
) -> BatchView:
    """One batch as a :class:`BatchView` of its records with offsets in ``[start, end)``
    (None: no bound); verifies the checksum first. Copies nothing."""
    header = verify_batch(batch) if verify else decode_header(batch)
    total = header.total_bytes
    if len(batch) < total:
        raise MalformedBatch("truncated batch")
    count = header.count
    base = header.base_offset
    lo = 0 if start is None else min(count, max(0, start - base))
    hi = count if end is None else max(lo, min(count, end - base))
    return BatchView(header, memoryview(batch)[:total], base + lo, base + hi)


def decode_columns(
    batch: bytes | memoryview,
    *,
    start: int | None = None,
    end: int | None = None,
    verify: bool = True,
) -> BatchColumns:
    """Decode one whole batch into :class:`BatchColumns`, keeping only the records with
    offsets in ``[start, end)`` (None: no bound). Verifies the checksum first, and the
    whole records section's structure; headers are decoded for the kept records only.

    Equivalent to :func:`decode_batch` (same records, same errors on bad structure) at a
    fraction of its cost: no object per record. Batches whose records all have the same
    value length and no headers (the common case) are checked and split with strided
    byte slices, in C.
    """
    return decode_views([view_batch(batch, start=start, end=end, verify=verify)])


def decode_views(views: Sequence[BatchView]) -> BatchColumns:
    """The windows of consecutive views (each starting where the previous one ends) as
    one :class:`BatchColumns`, as :func:`decode_columns` decodes each (whole records
    section checked): every value is copied once, from the views straight into the one
    values buffer (when ``data`` is first asked for: the columns keep views of the batches
    until then), so a batch consumer gets its column in a single copy."""
    timestamps = array("q")
    parts: list[_Values] = []
    ends = array("i", [0])
    headers: list[dict[str, str]] = []
    any_headers = False
    keys: list[bytes | None] = []
    any_keys = False
    for i, view in enumerate(views):
        if i and view.start != views[i - 1].end:
            raise ValueError(f"views are not consecutive at offset {view.start}")
        section = view.batch[records_at(view.batch, view.header) :]
        base, count = view.header.base_offset, view.header.count
        lo, hi = view.start - base, view.end - base
        size = ends[-1]
        uniform = _uniform_columns(section, count, lo, hi)
        values: _Values
        if uniform is not None:
            stamps, values = uniform
            value_bytes = values.value_bytes
            timestamps.extend(_int64s_le(stamps))
            n = hi - lo
            if value_bytes:
                ends.extend(range(size + value_bytes, size + n * value_bytes + 1, value_bytes))
            else:
                ends.extend([size] * n)
            if any_headers:
                headers.extend({} for _ in range(n))
            if any_keys:
                keys.extend([None] * n)
        else:
            stamps_w, listed, ends_w, headers_w, keys_w = _walk_columns(
                section, count, lo, hi, view.header.flags)
            values = _Listed(listed)
            if headers_w is not None and not any_headers:
                headers = [{} for _ in range(len(timestamps))]
                any_headers = True
            if keys_w is not None and not any_keys:
                keys = [None] * len(timestamps)
                any_keys = True
            timestamps.extend(stamps_w)
            ends.extend(size + e for e in ends_w[1:])
            if any_headers:
                headers.extend(headers_w or ({} for _ in stamps_w))
            if any_keys:
                keys.extend(keys_w or [None] * len(stamps_w))
        parts.append(values)
    first = views[0].start if views else 0
    confirm = views[-1].header.confirm_offset if views else 0
    return BatchColumns._of_pieces(first, timestamps, parts, ends,
                                   headers if any_headers else None, confirm,
                                   keys if any_keys else None)


def _int64s_le(data: bytes) -> array[int]:
    """Little-endian int64s as an array in this machine's order."""
    values = array("q", data)
    if sys.byteorder != "little":
        values.byteswap()
    return values


_Columns = tuple["array[int]", list[memoryview], "array[int]", "list[dict[str, str]] | None",
                 "list[bytes | None] | None"]


def uniform_value_bytes(view: BatchView) -> int | None:
    """The value length of every record of the view's batch when all have that length and
    no headers (records then lie ``RECORD_PREFIX_BYTES + value_bytes`` apart, each a
    16-byte prefix and its value), else None. Checks the whole records section, as
    :func:`decode_columns` does, so a consumer may gather such a batch by strides from
    ``BATCH_HEADER_BYTES`` (a batch with a system block: None)."""
    if view.header.flags & FLAG_SYSTEM:
        return None
    return _uniform_value_bytes(view.batch[BATCH_HEADER_BYTES:], view.header.count)


def _uniform_columns(
    section: memoryview, count: int, lo: int, hi: int
) -> tuple[bytes, _Strided] | None:
    """The fast path: every record has no headers and the same value length. Returns the
    window's timestamps (little-endian int64 bytes) and its records (values left in
    place), or None when the section is not like that (the general walk then decodes)."""
    value_bytes = _uniform_value_bytes(section, count)
    if value_bytes is None:
        return None
    stride = RECORD_PREFIX_BYTES + value_bytes
    n = hi - lo
    first = lo * stride
    stamps = bytearray(8 * n)
    for j in range(8):  # gather the timestamps' bytes: the prefixes are `stride` apart
        stamps[j::8] = section[first + j : hi * stride : stride]
    return bytes(stamps), _Strided(section[first : hi * stride], n, value_bytes)


def _walk_columns(section: memoryview, count: int, lo: int, hi: int, flags: int = 0) -> _Columns:
    """The general path: walk the record prefixes one by one."""
    view = section
    end = len(section)
    unpack = _RECORD.unpack_from
    timestamps = array("q")
    parts: list[memoryview] = []
    ends = array("i", [0])
    headers: list[dict[str, str]] = []
    any_headers = False
    keys: list[bytes | None] = []
    any_keys = False
    pos = 0
    size = 0
    for i in range(count):
        if pos + RECORD_PREFIX_BYTES > end:
            raise MalformedBatch("record prefix runs past the batch")
        timestamp, headers_bytes, value_bytes = unpack(view, pos)
        pos += RECORD_PREFIX_BYTES
        stop = pos + headers_bytes + value_bytes
        if stop > end:
            raise MalformedBatch("record runs past the batch")
        if lo <= i < hi:
            timestamps.append(timestamp)
            key: bytes | None = None
            if headers_bytes:
                key, hdrs = _decode_head(view[pos : pos + headers_bytes], flags)
                headers.append(hdrs)
                any_headers = any_headers or bool(hdrs)
                any_keys = any_keys or key is not None
            else:
                headers.append({})
            keys.append(key)
            parts.append(view[pos + headers_bytes : stop])
            size += value_bytes
            ends.append(size)
        pos = stop
    if pos != end:
        raise MalformedBatch(f"{end - pos} trailing bytes after the last record")
    return (timestamps, parts, ends, headers if any_headers else None,
            keys if any_keys else None)


