"""Decoding and verifying record batches from untrusted bytes: the header, the system block,
the checksum or MAC, every record's lengths; ``iter_batches`` over concatenated batches.

Decoding raises only :class:`MalformedBatch` or :class:`ChecksumMismatch`
(:func:`verify_digest`: :class:`DigestMismatch`).

Pure: no I/O.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Iterator

import msgpack
import xxhash

from estream.wire import limits
from estream.wire.errors import (
    ChecksumMismatch,
    DigestKeyMissing,
    DigestMismatch,
    MalformedBatch,
)
from estream.wire.record.layout import (
    _CHECKSUM_AT,
    _FLAGS_KNOWN,
    _HEADER,
    _KEY_BYTES,
    _KEY_NONE,
    _LENGTHS,
    _RECORD,
    _SYSTEM,
    BATCH_HEADER_BYTES,
    BATCH_MAGIC,
    BATCH_VERSION,
    DIGEST_HMAC_SHA256,
    DIGEST_NAMES,
    EXTENDED_HEAD,
    FLAG_KEYED,
    FLAG_SYSTEM,
    MAC_BYTES,
    MAC_VERSION,
    RECORD_PREFIX_BYTES,
    SEQUENCE_LISTED,
    SEQUENCE_NONE,
    SYSTEM_PREFIX_BYTES,
    BatchHeader,
    BatchSystem,
    Record,
    RecordBatch,
    _checksum,
    _header_mac,
    digest_kind,
    records_at,
)


def decode_header(buf: bytes | memoryview) -> BatchHeader:
    """Decode and validate the fixed header (not the checksum) at the start of ``buf``.

    ``buf`` may hold more than this batch; it must hold at least the header.
    """
    if len(buf) < BATCH_HEADER_BYTES:
        raise MalformedBatch(f"{len(buf)} bytes is shorter than a batch header")
    (
        magic,
        version,
        flags,
        stream_id,
        range_index,
        epoch,
        base_offset,
        count,
        confirm_offset,
        first_ts,
        max_ts,
        records_bytes,
        checksum,
    ) = _HEADER.unpack_from(buf, 0)
    if magic != BATCH_MAGIC:
        raise MalformedBatch(f"bad batch magic {magic:#06x}")
    if version != BATCH_VERSION:
        raise MalformedBatch(f"unsupported batch format version {version}")
    if flags & ~_FLAGS_KNOWN or digest_kind(flags) not in DIGEST_NAMES:
        raise MalformedBatch(f"unsupported batch flags {flags:#04x}")
    if digest_kind(flags) == DIGEST_HMAC_SHA256 and not flags & FLAG_SYSTEM:
        raise MalformedBatch("an hmac-sha256 batch without its system block")
    if count == 0 or count > limits.batch_records_max:
        raise MalformedBatch(f"bad record count {count}")
    if records_bytes < count * RECORD_PREFIX_BYTES:
        raise MalformedBatch(f"records section of {records_bytes} bytes cannot hold {count}")
    if records_bytes + BATCH_HEADER_BYTES > limits.batch_bytes_max:
        raise MalformedBatch(f"batch of {records_bytes} record bytes is too large")
    return BatchHeader(
        stream_id,
        range_index,
        epoch,
        base_offset,
        count,
        confirm_offset,
        first_ts,
        max_ts,
        records_bytes,
        checksum,
        flags,
    )


def compute_checksum(batch: bytes | memoryview) -> int:
    """xxh3-64 (flags' digest 1: crc32c) over every byte of an encoded batch except its
    checksum field."""
    view = memoryview(batch)
    flags = view[3] if len(view) > 3 else 0
    if not flags:
        digest = xxhash.xxh3_64(view[:_CHECKSUM_AT])
        digest.update(view[BATCH_HEADER_BYTES:])
        return digest.intdigest()
    return _checksum(flags, view[:_CHECKSUM_AT], view[BATCH_HEADER_BYTES:])


def decode_system(
    batch: bytes | memoryview, header: BatchHeader | None = None
) -> BatchSystem | None:
    """The system block of a whole batch (None when it has none). Checks its structure
    only: verify the batch (and its digest) first."""
    header = decode_header(batch) if header is None else header
    if not header.flags & FLAG_SYSTEM:
        return None
    view = memoryview(batch)
    end = records_at(view, header)
    size, pid_bytes, kind, mac_bytes, mac_version, first, last = _SYSTEM.unpack_from(
        view, BATCH_HEADER_BYTES)
    pos = BATCH_HEADER_BYTES + SYSTEM_PREFIX_BYTES
    listed_bytes = header.count * 8 if kind == SEQUENCE_LISTED else 0
    if kind > SEQUENCE_LISTED or mac_bytes not in (0, MAC_BYTES):
        raise MalformedBatch("bad system block")
    if mac_version > (MAC_VERSION if mac_bytes else 0):
        raise MalformedBatch(f"unknown MAC version {mac_version}")
    if pos + pid_bytes + listed_bytes + mac_bytes != end:
        raise MalformedBatch("system block fields do not add up to its length")
    try:
        producer = bytes(view[pos : pos + pid_bytes]).decode()
    except UnicodeDecodeError:
        raise MalformedBatch("producer id is not utf-8") from None
    pos += pid_bytes
    sequences: tuple[int, ...] | None = None
    if kind == SEQUENCE_LISTED:
        sequences = struct.unpack_from(f"<{header.count}q", view, pos)
    elif kind == SEQUENCE_NONE:
        first = last = -1
    mac = bytes(view[end - mac_bytes : end]) if mac_bytes else b""
    return BatchSystem(producer, first, last, sequences, mac, size, mac_version)


def producer_id_starts(batch: bytes | memoryview, prefix: bytes) -> bool:
    """Whether a batch's system block names a producer id starting with ``prefix``: a
    few bytes compared, nothing decoded or verified (False for bytes too short to hold
    it: the batch's own checks refuse them).

    >>> producer_id_starts(b"short", b"__kafka/")
    False
    """
    at = BATCH_HEADER_BYTES + SYSTEM_PREFIX_BYTES
    if len(batch) < at + len(prefix) or not batch[3] & FLAG_SYSTEM:  # (flags: byte 3)
        return False
    return batch[BATCH_HEADER_BYTES + 4] >= len(prefix) and (  # (producer id bytes)
        batch[at : at + len(prefix)] == prefix)


def verify_digest(
    batch: bytes | memoryview,
    *,
    digest: int,
    key: bytes | None,
    stream_id: int,
    range_index: int,
    header: BatchHeader | None = None,
) -> None:
    """Check a (checksum-verified) batch against its stream's digest: the same digest
    kind, and for ``hmac-sha256`` a MAC that verifies under ``key`` for the stream and
    range it was read from. Raises :class:`DigestMismatch`, or
    :class:`DigestKeyMissing` when ``key`` is None for an ``hmac-sha256`` stream."""
    header = decode_header(batch) if header is None else header
    kind = digest_kind(header.flags)
    where = {"stream_id": header.stream_id, "range_index": header.range_index,
             "base_offset": header.base_offset}
    if kind != digest:
        raise DigestMismatch(
            f"batch digest {DIGEST_NAMES.get(kind, kind)}, stream digest "
            f"{DIGEST_NAMES.get(digest, digest)}", **where)
    if digest != DIGEST_HMAC_SHA256:
        return
    if key is None:
        raise DigestKeyMissing("this stream's entries are MACed (hmac-sha256): no key")
    if header.stream_id != stream_id or header.range_index != range_index:
        raise DigestMismatch(
            f"batch of stream {header.stream_id} range {header.range_index} served for "
            f"stream {stream_id} range {range_index}", **where)
    verify_mac(batch, key, header)


def verify_mac(batch: bytes | memoryview, key: bytes, header: BatchHeader | None = None) -> None:
    """Check the MAC of an ``hmac-sha256`` batch under ``key`` for the stream, range,
    offsets (and, mac_version 1, confirm offset and timestamps) its header names: what a
    range server holding the cluster secret checks on APPEND. Raises
    :class:`DigestMismatch` (or :class:`MalformedBatch` for a batch that is not hmac-sha256
    or not well formed). Verify the checksum too (this does not)."""
    header = decode_header(batch) if header is None else header
    if digest_kind(header.flags) != DIGEST_HMAC_SHA256:
        raise MalformedBatch("not an hmac-sha256 batch")
    computed, stored = _header_mac(key, memoryview(batch), header)
    if not hmac.compare_digest(computed, stored):
        raise DigestMismatch(
            "batch MAC does not verify", stream_id=header.stream_id,
            range_index=header.range_index, base_offset=header.base_offset)


def is_hmac_batch(batch: bytes | memoryview) -> bool:
    """Whether ``batch``'s flags say hmac-sha256 (its header unchecked; a cheap test)."""
    return len(batch) > 3 and digest_kind(batch[3]) == DIGEST_HMAC_SHA256


def verify_batch(batch: bytes | memoryview) -> BatchHeader:
    """Validate the header, the exact length and the checksum of one whole batch."""
    header = decode_header(batch)
    if len(batch) != header.total_bytes:
        raise MalformedBatch(f"batch is {len(batch)} bytes, header says {header.total_bytes}")
    actual = compute_checksum(batch)
    if actual != header.checksum:
        raise ChecksumMismatch(
            "record batch checksum mismatch", expected=header.checksum, actual=actual
        )
    return header


def check_records(batch: bytes | memoryview, header: BatchHeader) -> None:
    """Check that a whole, checksum-verified batch decodes: its system block's structure,
    every record's lengths (each record within the section, nothing after the last) and
    every record's headers (a msgpack map of str to str). What a range server checks
    before it stores a batch, so that no replica acknowledges a batch a reader cannot
    decode. Raises :class:`MalformedBatch`. (The header's timestamps are the writer's
    word, as readers take them; an ``hmac-sha256`` batch's MAC covers them.)

    One pass over the records, nothing kept: a batch whose records all have the same
    value length and no headers (the common case) is checked with strided byte
    comparisons, in C, as :func:`decode_columns` does; any other walks the record
    prefixes, and decodes each record's headers unless they are the same bytes as the
    previous record's.
    """
    view = memoryview(batch)
    if header.flags & FLAG_SYSTEM:
        decode_system(view, header)
    section = view[records_at(view, header) : header.total_bytes]
    if _uniform_value_bytes(section, header.count) is None:
        _check_walk(section, header.count, header.flags)


def _check_walk(section: memoryview, count: int, flags: int = 0) -> None:
    """:func:`check_records`' walk of a section whose records are not all alike."""
    unpack = _LENGTHS.unpack_from
    end = len(section)
    pos = 0
    last: bytes | memoryview = b""
    for _ in range(count):
        if pos + RECORD_PREFIX_BYTES > end:
            raise MalformedBatch("record prefix runs past the batch")
        headers_bytes, value_bytes = unpack(section, pos + 8)
        pos += RECORD_PREFIX_BYTES
        if headers_bytes:
            raw = section[pos : pos + headers_bytes]
            if raw != last:
                _decode_head(raw, flags)  # MalformedBatch when not a key and a str map
                last = raw
        pos += headers_bytes + value_bytes
    if pos != end:
        raise MalformedBatch("a record runs past the batch" if pos > end
                             else f"{end - pos} trailing bytes after the last record")


def decode_batch(batch: bytes | memoryview, *, verify: bool = True) -> RecordBatch:
    """Decode one whole batch into records (with offsets). Verifies the checksum first."""
    header = verify_batch(batch) if verify else decode_header(batch)
    view = memoryview(batch)
    records: list[Record] = []
    end = header.total_bytes
    if len(view) < end:
        raise MalformedBatch("truncated batch")
    pos = records_at(view, header)
    unpack = _RECORD.unpack_from
    offset = header.base_offset
    for _ in range(header.count):
        if pos + RECORD_PREFIX_BYTES > end:
            raise MalformedBatch("record prefix runs past the batch")
        timestamp, headers_bytes, value_bytes = unpack(view, pos)
        pos += RECORD_PREFIX_BYTES
        if pos + headers_bytes + value_bytes > end:
            raise MalformedBatch("record runs past the batch")
        key: bytes | None = None
        headers: dict[str, str] = {}
        if headers_bytes:
            key, headers = _decode_head(view[pos : pos + headers_bytes], header.flags)
        pos += headers_bytes
        value = bytes(view[pos : pos + value_bytes])
        pos += value_bytes
        records.append(Record(value, headers, timestamp, offset, key))
        offset += 1
    if pos != end:
        raise MalformedBatch(f"{end - pos} trailing bytes after the last record")
    return RecordBatch(header, tuple(records))


def _uniform_value_bytes(section: memoryview, count: int) -> int | None:
    if len(section) < RECORD_PREFIX_BYTES:
        return None
    _, headers_bytes, value_bytes = _RECORD.unpack_from(section, 0)
    stride = RECORD_PREFIX_BYTES + value_bytes
    if headers_bytes or stride * count != len(section):
        return None
    if count == 1:  # one record, exactly the section: nothing to compare it with
        return int(value_bytes)
    lengths = bytes(section[8:RECORD_PREFIX_BYTES])
    for j in range(8):  # every prefix's length fields equal the first one's, byte by byte
        if section[8 + j :: stride] != lengths[j : j + 1] * count:
            return None
    return int(value_bytes)


def _decode_head(raw: memoryview, flags: int) -> tuple[bytes | None, dict[str, str]]:
    """A record's key (None without one) and headers, from its headers section (a
    msgpack map, or an extended head in a KEYED batch)."""
    if raw[0] != EXTENDED_HEAD:
        return None, _decode_headers(raw)
    if not flags & FLAG_KEYED:
        raise MalformedBatch("an extended record head in a batch that is not KEYED")
    if len(raw) < _KEY_BYTES.size:
        raise MalformedBatch("extended record head too short")
    _, key_bytes = _KEY_BYTES.unpack_from(raw, 0)
    at = _KEY_BYTES.size
    key: bytes | None = None
    if key_bytes != _KEY_NONE:
        if at + key_bytes > len(raw):
            raise MalformedBatch("record key runs past its head")
        key = bytes(raw[at : at + key_bytes])
        at += key_bytes
    headers = _decode_headers(raw[at:], escaped=True) if at < len(raw) else {}
    return key, headers


def _decode_headers(raw: memoryview, *, escaped: bool = False) -> dict[str, str]:
    try:
        headers = msgpack.unpackb(raw, strict_map_key=True,
                                  unicode_errors="surrogateescape" if escaped else "strict")
    except Exception as exc:  # msgpack raises many types on garbage
        raise MalformedBatch(f"undecodable record headers: {exc}") from None
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise MalformedBatch("record headers must be a map of str to str")
    return headers


def iter_batches(buf: bytes | memoryview) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Split concatenated batches (a read answer) into (header, bytes) without copying.

    Validates each header and length; checksums are left to :func:`verify_batch`.
    """
    view = memoryview(buf)
    pos = 0
    while pos < len(view):
        header = decode_header(view[pos:])
        end = pos + header.total_bytes
        if end > len(view):
            raise MalformedBatch("truncated batch at the end of the buffer")
        yield header, view[pos:end]
        pos = end


