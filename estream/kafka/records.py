"""Kafka record batches (magic 2): decode what producers send, encode what Fetch answers.

Batch layout (big-endian; Kafka's "RecordBatch", KIP-98)::

    offset size field
      0     8   base_offset
      8     4   batch_length            bytes after this field
     12     4   partition_leader_epoch
     16     1   magic                   2
     17     4   crc                     crc32c of bytes [21, end)
     21     2   attributes              bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4,
                                        4 zstd); 3 timestamp type; 4 transactional; 5 control
     23     4   last_offset_delta
     27     8   base_timestamp          ms
     35     8   max_timestamp
     43     8   producer_id
     51     2   producer_epoch
     53     4   base_sequence
     57     4   records_count
     61     .   records                 compressed as the attributes say

Record: length varint | attributes i8 | timestamp_delta varlong | offset_delta varint |
key_length varint, key | value_length varint, value | headers_count varint, each
key_length varint, key (UTF-8) | value_length varint, value (-1: null). Varints are
zigzag-encoded.

Compression goes through ``cramjam`` (gzip, snappy raw or xerial-framed, lz4 frame, zstd).
Decompressed sizes are bounded by :data:`records_bytes_max`. Fetch answers are encoded
uncompressed, one Kafka batch per estream batch, at the estream offsets.

Bad input raises :class:`~estream.wire.errors.MalformedBatch` (Kafka's CORRUPT_MESSAGE)
or :class:`~estream.wire.errors.InvalidArgument` (UNSUPPORTED_COMPRESSION_TYPE, INVALID_RECORD:
its ``argument`` says which). Pure: no I/O.
"""

from __future__ import annotations

import functools
import operator
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import cramjam
import crc32c

from estream.wire.errors import InvalidArgument, MalformedBatch

MAGIC: Final = 2
BATCH_PREFIX_BYTES: Final = 12  # base_offset, batch_length: what precedes the rest
BATCH_HEADER_BYTES: Final = 61
records_bytes_max: Final = 64 * 1024 * 1024  # one batch's records, decompressed
records_per_batch_max: Final = 1_000_000
COMPRESSION_NONE: Final = 0
COMPRESSION_GZIP: Final = 1
COMPRESSION_SNAPPY: Final = 2
COMPRESSION_LZ4: Final = 3
COMPRESSION_ZSTD: Final = 4
COMPRESSION_NAMES: Final = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
ATTR_COMPRESSION_MASK: Final = 0x07
ATTR_TRANSACTIONAL: Final = 0x10
ATTR_CONTROL: Final = 0x20
_HEAD: Final = struct.Struct(">qiibIhiqqqhii")
_CRC: Final = struct.Struct(">I")
_XERIAL: Final = b"\x82SNAPPY\x00"
assert _HEAD.size == BATCH_HEADER_BYTES


class KafkaRecord(NamedTuple):
    """One Kafka record: its timestamp (ms), key, value and headers (in order; a header
    value may be None). A named tuple: a frozen dataclass costs about four times as much
    to make, once per record the gateway decodes."""

    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class KafkaBatch:
    """A decoded batch: its producer fields and records (offsets base_offset + i)."""

    base_offset: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: tuple[KafkaRecord, ...]
    base_timestamp: int = -1
    body: bytes = b""  # the records section as sent, decompressed (what the deltas are of)

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK


def _zigzag(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, next position) of the zigzag varint at ``pos``; one or two bytes inline
    (a 1 KiB value's length, a timestamp delta up to 8 s), the rest in
    :func:`_zigzag_long`."""
    if pos + 1 < end:
        byte = data[pos]
        if byte < 0x80:
            return (byte >> 1) ^ -(byte & 1), pos + 1
        second = data[pos + 1]
        if second < 0x80:
            raw = (byte & 0x7F) | (second << 7)
            return (raw >> 1) ^ -(raw & 1), pos + 2
    return _zigzag_long(data, pos, end)


def _zigzag_long(data: bytes, pos: int, end: int) -> tuple[int, int]:
    shift = raw = 0
    while True:
        if pos >= end or shift > 63:
            raise MalformedBatch("bad varint in a Kafka record")
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def _nullable(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    """(bytes or None for length -1, next position) of a length-prefixed field."""
    size, pos = _zigzag(data, pos, end)
    if size == -1:
        return None, pos
    stop = pos + size
    if size < 0 or stop > end:
        raise MalformedBatch("a Kafka record field runs past its record")
    return data[pos:stop], stop


def decode_batches(data: bytes | memoryview) -> list[KafkaBatch]:
    """Every batch of a Produce request's records field, checked (magic, length, CRC,
    record structure) and decompressed. Raises MalformedBatch or InvalidArgument."""
    view = memoryview(data)
    batches: list[KafkaBatch] = []
    pos = 0
    while pos < len(view):
        if len(view) - pos < BATCH_HEADER_BYTES:
            raise MalformedBatch("a Kafka record batch is cut short")
        length = int.from_bytes(view[pos + 8 : pos + 12], "big", signed=True)
        end = pos + BATCH_PREFIX_BYTES + length
        if length < BATCH_HEADER_BYTES - BATCH_PREFIX_BYTES or end > len(view):
            raise MalformedBatch(f"Kafka batch length {length} does not fit its request")
        batches.append(_decode_batch(view[pos:end]))
        pos = end
    if not batches:
        raise MalformedBatch("a Produce partition without a record batch")
    return batches


def _decode_batch(view: memoryview) -> KafkaBatch:
    (base_offset, _, _, magic, crc, attributes, last_delta, base_ts, _, producer_id,
     producer_epoch, base_sequence, count) = _HEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise InvalidArgument(f"Kafka record batch magic {magic} (only 2 is supported)",
                              argument="magic")
    if crc32c.crc32c(view[21:]) != crc:
        raise MalformedBatch("Kafka record batch CRC mismatch")
    if attributes & ATTR_CONTROL:
        raise InvalidArgument("control batches (transactions) are not supported",
                              argument="attributes")
    if not 0 < count <= records_per_batch_max or last_delta != count - 1:
        raise InvalidArgument(f"Kafka batch of {count} records, last offset delta "
                              f"{last_delta}", argument="records_count")
    # As bytes (one copy when uncompressed): indexing and slicing bytes is the fast path.
    body = bytes(_decompress(attributes & ATTR_COMPRESSION_MASK, view[BATCH_HEADER_BYTES:]))
    records, end = _decode_records(body, base_ts, count)
    if end != len(body):
        raise MalformedBatch("bytes after a Kafka batch's last record")
    return KafkaBatch(base_offset, attributes, producer_id, producer_epoch, base_sequence,
                      records, base_ts, body)


_TIMESTAMP: Final = operator.attrgetter("timestamp")
_VALUE: Final = operator.attrgetter("value")
_HEADERS: Final = operator.attrgetter("headers")


def plain_batch_at(base_offset: int, batch: KafkaBatch) -> bytes | None:
    """``batch`` as Fetch answers its records once stored at ``base_offset`` (uncompressed,
    no producer fields), from its records section as sent: when every record is stored as
    sent (a value, a timestamp, no header; keys are kept as they are), the same records
    the read path encodes from the stored ones, with no Python line per record; else None.

    >>> sent = decode_batches(encode_producer_batch(
    ...     [KafkaRecord(5, None, b"a"), KafkaRecord(7, None, b"bc")], COMPRESSION_GZIP))[0]
    >>> again = decode_batches(plain_batch_at(40, sent))[0]
    >>> again.base_offset, again.compression, again.records == sent.records
    (40, 0, True)
    >>> plain_batch_at(0, decode_batches(encode_producer_batch([KafkaRecord(5, b"k", None)]))[0])
    """
    records = batch.records
    if not records or batch.base_timestamp < 0 or not batch.body:
        return None
    if None in map(_VALUE, records) or any(map(_HEADERS, records)):  # (C-level walks)
        return None
    timestamps = list(map(_TIMESTAMP, records))
    if min(timestamps) < 0:
        return None
    n, base_ts = len(records), batch.base_timestamp
    head = bytearray(BATCH_HEADER_BYTES)
    _HEAD.pack_into(head, 0, base_offset, BATCH_HEADER_BYTES - BATCH_PREFIX_BYTES
                    + len(batch.body), 0, MAGIC, 0, 0, n - 1, base_ts, max(timestamps),
                    -1, -1, -1, n)
    _CRC.pack_into(head, 17, crc32c.crc32c(batch.body, crc32c.crc32c(bytes(head[21:]))))
    return bytes(head) + batch.body


def _decode_records(body: bytes, base_ts: int, count: int
                    ) -> tuple[tuple[KafkaRecord, ...], int]:
    """``count`` records from the start of ``body`` and the position after them (the
    gateway's produce path, once per record produced: one function, and the common
    record inline: one- and two-byte varints, no key, no headers; the rest through
    :func:`_zigzag` and :func:`_nullable`). A field read past the body is
    :class:`MalformedBatch`; one read past its record's length makes the record not add up
    to it (its value or headers run past it, or the end is missed): the same."""
    records: list[KafkaRecord] = []
    append = records.append
    pos, size = 0, len(body)
    try:
        for index in range(count):
            byte = body[pos]  # the record's length
            if byte < 0x80:
                length = (byte >> 1) ^ -(byte & 1)
                pos += 1
            elif (second := body[pos + 1]) < 0x80:
                raw = (byte & 0x7F) | (second << 7)
                length = (raw >> 1) ^ -(raw & 1)
                pos += 2
            else:
                length, pos = _zigzag_long(body, pos, size)
            end = pos + length
            if length <= 0 or end > size:
                raise MalformedBatch("a Kafka record's length runs past its batch")
            byte = body[pos + 1]  # after the attributes (unused): the timestamp delta
            if byte < 0x80:
                ts_delta = (byte >> 1) ^ -(byte & 1)
                pos += 2
            else:
                ts_delta, pos = _zigzag(body, pos + 1, end)
            byte = body[pos]
            if byte < 0x80:
                offset_delta = (byte >> 1) ^ -(byte & 1)
                pos += 1
            else:
                offset_delta, pos = _zigzag(body, pos, end)
            if offset_delta != index:
                raise InvalidArgument(f"record {index} has offset delta {offset_delta}",
                                      argument="offset_delta")
            if body[pos] == 1:  # key length -1: no key
                key = None
                pos += 1
            else:
                key, pos = _nullable(body, pos, end)
            value, pos = _nullable(body, pos, end)
            if pos + 1 == end and body[pos] == 0:  # no headers
                append(KafkaRecord(base_ts + ts_delta, key, value))
                pos = end
                continue
            headers, pos = _decode_headers(body, pos, end, length)
            if pos != end:
                raise MalformedBatch("a Kafka record's fields do not add up to its length")
            append(KafkaRecord(base_ts + ts_delta, key, value, headers))
    except IndexError:
        raise MalformedBatch("a Kafka record runs past its batch") from None
    return tuple(records), pos


def _decode_headers(body: bytes, pos: int, end: int, length: int
                    ) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """A record's headers (count, then each name and value) and the position after them."""
    header_count, pos = _zigzag(body, pos, end)
    if header_count < 0 or header_count > length:
        raise MalformedBatch(f"a Kafka record with {header_count} headers")
    found: list[tuple[str, bytes | None]] = []
    for _ in range(header_count):
        name, pos = _nullable(body, pos, end)
        if name is None:
            raise MalformedBatch("a Kafka record header without a key")
        header_value, pos = _nullable(body, pos, end)
        found.append((name.decode("utf-8", "surrogateescape"), header_value))
    return tuple(found), pos


def _decompress(kind: int, data: memoryview) -> bytes | memoryview:
    if kind == COMPRESSION_NONE:
        return data
    try:
        if kind == COMPRESSION_GZIP:
            inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header
            out: bytes | memoryview = inflater.decompress(data, records_bytes_max + 1)
        elif kind == COMPRESSION_SNAPPY:
            out = _snappy(bytes(data))
        elif kind == COMPRESSION_LZ4:
            out = _bounded(cramjam.lz4.decompress_into, bytes(data), records_bytes_max)
        elif kind == COMPRESSION_ZSTD:
            out = _bounded(cramjam.zstd.decompress_into, bytes(data), records_bytes_max)
        else:
            raise InvalidArgument(f"unknown compression {kind}", argument="compression")
    except (zlib.error, cramjam.DecompressionError, ValueError) as exc:
        raise MalformedBatch(f"{COMPRESSION_NAMES[kind]} records do not decompress: "
                             f"{exc}") from None
    if len(out) > records_bytes_max:
        raise InvalidArgument(f"records decompress past {records_bytes_max} bytes",
                              argument="records")
    return out


def _bounded(into: Callable[[bytes, bytearray], int], data: bytes, limit: int
             ) -> memoryview:
    """``data`` decompressed by ``into`` (cramjam's ``decompress_into``) into a buffer
    that starts at 8 times its size and doubles up to ``limit`` + 1 bytes: never more
    than that held, whatever the data claims or expands to (a zstd frame of 64 KiB
    expands to 2 GiB), and the work at most about twice the output's. Past ``limit``:
    :class:`InvalidArgument`."""
    size = min(limit + 1, max(64 * 1024, 8 * len(data)))
    while True:
        buffer = bytearray(size)
        try:
            return memoryview(buffer)[: into(data, buffer)]
        except cramjam.DecompressionError as exc:
            if "buffer" not in str(exc):  # (corrupt, not too small)
                raise
            if size > limit:
                raise InvalidArgument(f"records decompress past {limit} bytes",
                                      argument="records") from None
            del buffer  # (before the next is made: at most one held)
            size = min(limit + 1, 2 * size)


def _snappy(data: bytes) -> bytes | memoryview:
    """Raw snappy, or the xerial framing Java and kafka-python producers write (each
    block within what is left of :data:`records_bytes_max`)."""
    into = cramjam.snappy.decompress_raw_into
    if not data.startswith(_XERIAL):
        return _bounded(into, data, records_bytes_max)
    pos, parts, total = 16, [], 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise MalformedBatch("xerial snappy block cut short")
        size = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        part = _bounded(into, data[pos : pos + size], records_bytes_max - total)
        total += len(part)
        parts.append(part)
        pos += size
    return b"".join(parts)


def _varint(value: int) -> bytes:
    """``value`` zigzag-encoded as a varint."""
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


_VARINTS_SMALL: Final = 1 << 14  # lengths, deltas and indexes below it: from a table
_VARINTS: Final = tuple(_varint(v) for v in range(_VARINTS_SMALL))
_NULL: Final = _varint(-1)


def _v(value: int) -> bytes:
    return _VARINTS[value] if 0 <= value < _VARINTS_SMALL else _varint(value)


def _record_bytes(record: KafkaRecord, ts_delta: int, index: int) -> bytes:
    key, value = record.key, record.value
    parts = [b"\x00", _v(ts_delta), _v(index),
             _NULL if key is None else _v(len(key)), key or b"",
             _NULL if value is None else _v(len(value)), value or b"",
             _v(len(record.headers))]
    for name, header in record.headers:
        raw = name.encode("utf-8", "surrogateescape")
        parts += (_v(len(raw)), raw, _NULL if header is None else _v(len(header)),
                  header or b"")
    body = b"".join(parts)
    return _v(len(body)) + body


def encode_batch(base_offset: int, records: Sequence[KafkaRecord]) -> bytes:
    """One uncompressed batch of ``records`` at ``base_offset``, ``base_offset + 1``, ...
    (no producer: id -1), CRC filled in."""
    if not records:
        raise ValueError("a Kafka batch needs at least one record")
    base_ts = records[0].timestamp
    max_ts = max(r.timestamp for r in records)
    body = b"".join([_record_bytes(r, r.timestamp - base_ts, i)
                     for i, r in enumerate(records)])
    head = _HEAD.pack(base_offset, BATCH_HEADER_BYTES - BATCH_PREFIX_BYTES + len(body), 0,
                      MAGIC, 0, 0, len(records) - 1, base_ts, max_ts, -1, -1, -1,
                      len(records))
    crc = crc32c.crc32c(head[21:])
    crc = crc32c.crc32c(body, crc)
    return b"".join((head[:17], crc.to_bytes(4, "big"), head[21:], body))


_INDEXES: Final = tuple(v + _NULL for v in _VARINTS)  # offset delta, then a null key
_ZERO: Final = b"\x00"
_LENGTHS: Final = tuple(v + _ZERO for v in _VARINTS)  # a record's length, attributes 0
_BLANK_HEAD: Final = bytes(BATCH_HEADER_BYTES)


@functools.lru_cache(maxsize=16)
def _sized(size: int, count: int) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    """For records ``0..count-1`` whose values have ``size`` bytes: what follows the
    timestamp delta up to the value (index, null key, value length), and the record
    length less the delta's bytes (Fetch answers of a stream mostly share a size)."""
    tail = _VARINTS[size]
    heads = tuple(x + tail for x in _INDEXES[:count])
    return heads, tuple(len(h) + size + 2 for h in heads)


def encode_plain_batch(base_offset: int, timestamps: Sequence[int],
                       values: Sequence[bytes | memoryview]) -> bytearray:
    """What :func:`encode_batch` gives for records without key or headers (timestamps
    ``timestamps``, values ``values``), byte for byte, in a few Python operations per
    record: Fetch's common case. The answer is one buffer (no copy to return it)."""
    n = len(values)
    if not n or len(timestamps) != n:
        raise ValueError("a Kafka batch needs as many timestamps as values, at least one")
    base_ts = timestamps[0]
    deltas = [ts - base_ts for ts in timestamps]
    sizes = list(map(len, values))
    small = (n <= _VARINTS_SMALL and min(deltas) >= 0 and max(deltas) < _VARINTS_SMALL
             and max(sizes) < _VARINTS_SMALL - 16)  # (a record's length: size + 16 at most)
    # record: length | attributes 0 | delta | index | null key | value length | value | 0
    if small and min(sizes) == max(sizes):
        tails, rest = _sized(sizes[0], 1 << max(8, (n - 1).bit_length()))
        lengths = _LENGTHS
        heads = [lengths[len(d) + r] + d + t  # (the tables are longer: strict=False)
                 for d, t, r in zip(map(_VARINTS.__getitem__, deltas), tails, rest,
                                    strict=False)]
    else:
        v: Callable[[int], bytes] = _VARINTS.__getitem__ if small else _v
        indexes = _INDEXES if small else [_v(i) + _NULL for i in range(n)]
        heads = [v(len(d) + len(x) + len(s) + size + 2) + _ZERO + d + x + s
                 for d, x, s, size in zip(map(v, deltas), indexes, map(v, sizes), sizes,
                                          strict=False)]
    parts: list[bytes | memoryview] = [_ZERO] * (3 * n + 1)
    parts[0] = _BLANK_HEAD  # filled in below
    parts[1::3] = heads
    parts[2::3] = values
    out = bytearray().join(parts)
    _HEAD.pack_into(out, 0, base_offset, len(out) - BATCH_PREFIX_BYTES, 0, MAGIC, 0, 0,
                    n - 1, base_ts, base_ts + max(deltas), -1, -1, -1, n)
    _CRC.pack_into(out, 17, crc32c.crc32c(memoryview(out)[21:]))
    return out


def compress_records(kind: int, data: bytes) -> bytes:
    """``data`` compressed as a producer of ``kind`` would (tests make batches with it)."""
    if kind == COMPRESSION_GZIP:
        return bytes(cramjam.gzip.compress(data))
    if kind == COMPRESSION_SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if kind == COMPRESSION_LZ4:
        return bytes(cramjam.lz4.compress(data))
    if kind == COMPRESSION_ZSTD:
        return bytes(cramjam.zstd.compress(data))
    return data


def encode_producer_batch(
    records: Sequence[KafkaRecord], compression: int = COMPRESSION_NONE, *,
    producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
) -> bytes:
    """A batch as a producer sends it (base offset 0, compressed as asked)."""
    plain = encode_batch(0, records)
    body = compress_records(compression, plain[BATCH_HEADER_BYTES:])
    (_, _, _, _, _, _, last_delta, base_ts, max_ts, _, _, _, count) = _HEAD.unpack_from(plain)
    head = _HEAD.pack(0, BATCH_HEADER_BYTES - BATCH_PREFIX_BYTES + len(body), 0, MAGIC, 0,
                      compression, last_delta, base_ts, max_ts, producer_id, producer_epoch,
                      base_sequence, count)
    crc = crc32c.crc32c(head[21:])
    crc = crc32c.crc32c(body, crc)
    return b"".join((head[:17], crc.to_bytes(4, "big"), head[21:], body))
