"""Encoding record batches: records, extended heads, the system block (producer id,
sequences, MAC), the header and checksum; ``restamp`` for a copy into another range or
epoch (it changes nothing the MAC covers).

Pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import xxhash

from estream.wire import limits
from estream.wire.errors import (
    DigestKeyMissing,
    MalformedBatch,
)
from estream.wire.packing import packb
from estream.wire.record.decode import verify_batch
from estream.wire.record.layout import (
    _CHECKSUM_AT,
    _DIGEST_SHIFT,
    _HEADER,
    _KEY_BYTES,
    _KEY_NONE,
    _MAC_VERSION_AT,
    _RECORD,
    _SYSTEM,
    BATCH_HEADER_BYTES,
    BATCH_MAGIC,
    BATCH_VERSION,
    DIGEST_HMAC_SHA256,
    DIGEST_NAMES,
    DIGEST_XXH3,
    EXTENDED_HEAD,
    FLAG_KEYED,
    FLAG_SYSTEM,
    MAC_BYTES,
    MAC_VERSION,
    RECORD_PREFIX_BYTES,
    SEQUENCE_CONSECUTIVE,
    SEQUENCE_LISTED,
    SEQUENCE_NONE,
    SYSTEM_PREFIX_BYTES,
    EncodedRecords,
    Record,
    _checksum,
    _mac,
    digest_kind,
    records_at,
)


def encode_system(
    count: int,
    *,
    producer_id: str = "",
    sequences: Sequence[int] | None = None,
    digest: int = DIGEST_XXH3,
) -> bytes:
    """A system block for ``count`` records (b"" when there is nothing to say). Sequences
    must be strictly increasing, one per record; consecutive ones are stored as a range."""
    mac_bytes = MAC_BYTES if digest == DIGEST_HMAC_SHA256 else 0
    if not producer_id and sequences is None and not mac_bytes:
        return b""
    pid = producer_id.encode()
    if len(pid) > limits.producer_id_bytes_max:
        raise MalformedBatch(f"producer id of {len(pid)} bytes is too long")
    kind, first, last, listed = SEQUENCE_NONE, -1, -1, b""
    if sequences is not None:
        if len(sequences) != count:
            raise MalformedBatch(f"{len(sequences)} sequences for {count} records")
        first, last = int(sequences[0]), int(sequences[-1])
        if first < 0:
            raise MalformedBatch(f"sequence {first} is negative")
        if last - first + 1 == count and _increasing(sequences):
            kind = SEQUENCE_CONSECUTIVE
        else:
            if not _increasing(sequences):
                raise MalformedBatch("sequences of a batch must increase strictly")
            kind = SEQUENCE_LISTED
            listed = struct.pack(f"<{count}q", *sequences)
    size = SYSTEM_PREFIX_BYTES + len(pid) + len(listed) + mac_bytes
    try:
        prefix = _SYSTEM.pack(size, len(pid), kind, mac_bytes,
                              MAC_VERSION if mac_bytes else 0, first, last)
    except struct.error:
        raise MalformedBatch("sequence out of range") from None
    return b"".join((prefix, pid, listed, bytes(mac_bytes)))


def _increasing(values: Sequence[int]) -> bool:
    return all(a < b for a, b in zip(values, values[1:], strict=False))


def encode_records(
    records: Sequence[Record],
    *,
    producer_id: str = "",
    sequences: Sequence[int] | None = None,
    digest: int = DIGEST_XXH3,
) -> EncodedRecords:
    """Encode the records section (with a system block for a producer's records or an
    ``hmac-sha256`` stream). Raises :class:`MalformedBatch` on oversize input."""
    return with_system(
        _encode_records(records), producer_id=producer_id, sequences=sequences, digest=digest)


def encode_record_head(
    value: bytes, headers: Mapping[str, str] | None, timestamp: int, key: bytes | None = None
) -> bytes:
    """One record's prefix and encoded headers (its value follows them in a records
    section), for writers that build a section record by record
    (:func:`section_of_parts`; :func:`is_extended_head` tells whether the batch must be
    KEYED). Raises :class:`MalformedBatch` as :func:`encode_records`."""
    if len(value) > limits.record_value_bytes_max:
        raise MalformedBatch(f"record value of {len(value)} bytes is too large")
    if key is not None:
        return _extended_head(value, headers, timestamp, key)
    if not headers:
        try:
            return _RECORD.pack(timestamp, 0, len(value))
        except struct.error:
            raise MalformedBatch(f"record timestamp {timestamp} is out of range") from None
    try:
        encoded = _encode_headers(headers)
    except UnicodeEncodeError:  # surrogate-escaped bytes: only the extended head holds them
        return _extended_head(value, headers, timestamp, None)
    if len(encoded) > limits.record_headers_bytes_max:
        raise MalformedBatch(f"record headers of {len(encoded)} bytes are too large")
    try:
        return _RECORD.pack(timestamp, len(encoded), len(value)) + encoded
    except struct.error:
        raise MalformedBatch(f"record timestamp {timestamp} is out of range") from None


def _extended_head(
    value: bytes, headers: Mapping[str, str] | None, timestamp: int, key: bytes | None
) -> bytes:
    """A record's prefix and extended head (module docstring): its key and headers."""
    if key is not None and not isinstance(key, bytes):
        raise MalformedBatch("a record key must be bytes")
    if key is not None and len(key) > limits.record_key_bytes_max:
        raise MalformedBatch(f"record key of {len(key)} bytes is too large")
    encoded = _encode_headers(headers, escaped=True) if headers else b""
    if len(encoded) > limits.record_headers_bytes_max:
        raise MalformedBatch(f"record headers of {len(encoded)} bytes are too large")
    mark = _KEY_BYTES.pack(EXTENDED_HEAD, _KEY_NONE if key is None else len(key))
    size = len(mark) + (len(key) if key else 0) + len(encoded)
    try:
        prefix = _RECORD.pack(timestamp, size, len(value))
    except struct.error:
        raise MalformedBatch(f"record timestamp {timestamp} is out of range") from None
    return b"".join((prefix, mark, key or b"", encoded))


def is_extended_head(head: bytes) -> bool:
    """Whether an :func:`encode_record_head` result is an extended head (its batch must
    be KEYED: :func:`section_of_parts` ``keyed=True``)."""
    return len(head) > RECORD_PREFIX_BYTES and head[RECORD_PREFIX_BYTES] == EXTENDED_HEAD


def section_of_parts(
    parts: Sequence[bytes], count: int, first_timestamp: int, max_timestamp: int,
    keyed: bool = False,
) -> EncodedRecords:
    """The records section of ``count`` records given as their parts in order (each
    record's :func:`encode_record_head`, then its value): the bytes :func:`encode_records`
    makes of the same records. ``keyed``: some head is extended (:func:`is_extended_head`)."""
    if not count:
        raise MalformedBatch("a batch needs at least one record")
    if count > limits.batch_records_max:
        raise MalformedBatch(f"{count} records exceed {limits.batch_records_max}")
    data = b"".join(parts)
    if len(data) + BATCH_HEADER_BYTES > limits.batch_bytes_max:
        raise MalformedBatch(f"batch of {len(data)} bytes exceeds {limits.batch_bytes_max}")
    return EncodedRecords(data, count, first_timestamp, max_timestamp,
                          FLAG_KEYED if keyed else 0)


def with_system(
    section: EncodedRecords,
    *,
    producer_id: str = "",
    sequences: Sequence[int] | None = None,
    digest: int = DIGEST_XXH3,
) -> EncodedRecords:
    """``section`` with the system block of a producer's records or an ``hmac-sha256``
    stream (as :func:`encode_records` adds it)."""
    if digest not in DIGEST_NAMES:
        raise MalformedBatch(f"unknown digest {digest}")
    system = encode_system(
        section.count, producer_id=producer_id, sequences=sequences, digest=digest
    )
    flags = (digest << _DIGEST_SHIFT) | (FLAG_SYSTEM if system else 0) | (
        section.flags & FLAG_KEYED)
    if not flags:
        return section
    if len(system) + len(section.data) + BATCH_HEADER_BYTES > limits.batch_bytes_max:
        raise MalformedBatch("batch with its system block is too large")
    return EncodedRecords(
        section.data, section.count, section.first_timestamp, section.max_timestamp,
        flags, system,
    )


def _encode_records(records: Sequence[Record]) -> EncodedRecords:
    if not records:
        raise MalformedBatch("a batch needs at least one record")
    if len(records) > limits.batch_records_max:
        raise MalformedBatch(f"{len(records)} records exceed {limits.batch_records_max}")
    parts: list[bytes] = []
    pack = _RECORD.pack
    max_ts = records[0].timestamp
    keyed = False
    for record in records:
        value = record.value
        if len(value) > limits.record_value_bytes_max:
            raise MalformedBatch(f"record value of {len(value)} bytes is too large")
        headers: bytes | None = b""
        if record.key is None and record.headers:
            try:
                headers = _encode_headers(record.headers)
            except UnicodeEncodeError:  # bytes headers: the extended head holds them
                headers = None
        if record.key is not None or headers is None:
            parts.append(_extended_head(value, record.headers, record.timestamp, record.key))
            parts.append(value)
            keyed = True
            max_ts = max(max_ts, record.timestamp)
            continue
        if len(headers) > limits.record_headers_bytes_max:
            raise MalformedBatch(f"record headers of {len(headers)} bytes are too large")
        try:
            parts.append(pack(record.timestamp, len(headers), len(value)))
        except struct.error:
            raise MalformedBatch(f"record timestamp {record.timestamp} is out of range") from None
        if headers:
            parts.append(headers)
        parts.append(value)
        if record.timestamp > max_ts:
            max_ts = record.timestamp
    data = b"".join(parts)
    if len(data) + BATCH_HEADER_BYTES > limits.batch_bytes_max:
        raise MalformedBatch(f"batch of {len(data)} bytes exceeds {limits.batch_bytes_max}")
    return EncodedRecords(data, len(records), records[0].timestamp, max_ts,
                          FLAG_KEYED if keyed else 0)


def _encode_headers(headers: Mapping[str, str], *, escaped: bool = False) -> bytes:
    """msgpack map of str to str; ``escaped``: strings encoded UTF-8 with
    surrogateescape (extended heads only), else a string that is not valid UTF-8 raises
    UnicodeEncodeError."""
    # Decoding accepts str -> str only, so encoding must refuse anything else.
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise MalformedBatch("record headers must be a map of str to str")
    if escaped:
        return packb(dict(headers), unicode_errors="surrogateescape")
    return packb(dict(headers))


def wrap_records(
    section: EncodedRecords,
    *,
    stream_id: int,
    range_index: int,
    epoch: int,
    base_offset: int,
    confirm_offset: int = 0,
    key: bytes | None = None,
) -> bytes:
    """Put a batch header with its checksum in front of an encoded records section
    (``key``: the stream's MAC key, for a section encoded with ``hmac-sha256``).

    Raises :class:`MalformedBatch` when a header field does not fit its width.
    """
    try:
        head = _pack_header(
            section, stream_id, range_index, epoch, base_offset, confirm_offset
        )
    except struct.error as exc:
        raise MalformedBatch(f"batch header field out of range: {exc}") from None
    if not section.flags:
        digest = xxhash.xxh3_64(head[:_CHECKSUM_AT])
        digest.update(section.data)
        return b"".join(
            (head[:_CHECKSUM_AT], digest.intdigest().to_bytes(8, "little"), section.data)
        )
    system = section.system
    if digest_kind(section.flags) == DIGEST_HMAC_SHA256:
        if key is None:
            raise DigestKeyMissing("an hmac-sha256 batch needs its stream's key")
        body = system[:-MAC_BYTES]
        mac = _mac(key, body[_MAC_VERSION_AT],
                   (stream_id, range_index, base_offset, section.count, section.flags,
                    confirm_offset, section.first_timestamp, section.max_timestamp),
                   body, section.data)
        system = body + mac
    checksum = _checksum(section.flags, head[:_CHECKSUM_AT], system, section.data)
    return b"".join((head[:_CHECKSUM_AT], checksum.to_bytes(8, "little"), system, section.data))


def _pack_header(
    section: EncodedRecords,
    stream_id: int,
    range_index: int,
    epoch: int,
    base_offset: int,
    confirm_offset: int,
) -> bytes:
    return _HEADER.pack(
        BATCH_MAGIC,
        BATCH_VERSION,
        section.flags,
        stream_id,
        range_index,
        epoch,
        base_offset,
        section.count,
        confirm_offset,
        section.first_timestamp,
        section.max_timestamp,
        len(section.system) + len(section.data),
        0,
    )


def encode_batch(
    records: Sequence[Record],
    *,
    stream_id: int,
    range_index: int,
    epoch: int,
    base_offset: int,
    confirm_offset: int = 0,
) -> bytes:
    """Encode records as one batch (see the layout in this module's docstring)."""
    return wrap_records(
        encode_records(records),
        stream_id=stream_id,
        range_index=range_index,
        epoch=epoch,
        base_offset=base_offset,
        confirm_offset=confirm_offset,
    )


def restamp(
    batch: bytes | memoryview, *, range_index: int, epoch: int, confirm_offset: int
) -> bytes:
    """A copy of ``batch`` with new range index, epoch and confirm offset, re-checksummed.

    Used when unconfirmed batches are resent into the next range after a seal.
    """
    header = verify_batch(batch)
    view = memoryview(batch)
    at = records_at(view, header)
    section = EncodedRecords(
        bytes(view[at:]),
        header.count,
        header.first_timestamp,
        header.max_timestamp,
        header.flags,
        bytes(view[BATCH_HEADER_BYTES:at]),
    )
    if header.flags:
        # The system block (and its MAC, which covers the range index and, from MAC
        # version 1, the confirm offset, never the epoch) is kept as it is: restamping
        # needs no key, so it may change nothing the MAC covers.
        if digest_kind(header.flags) == DIGEST_HMAC_SHA256:
            if range_index != header.range_index:
                raise MalformedBatch("an hmac-sha256 batch cannot move to another range")
            if confirm_offset != header.confirm_offset and view[
                BATCH_HEADER_BYTES + _MAC_VERSION_AT
            ]:
                raise MalformedBatch("an hmac-sha256 batch keeps its confirm offset")
        head = _pack_header(section, header.stream_id, range_index, epoch,
                            header.base_offset, confirm_offset)
        checksum = _checksum(header.flags, head[:_CHECKSUM_AT], section.system, section.data)
        return b"".join((head[:_CHECKSUM_AT], checksum.to_bytes(8, "little"),
                         section.system, section.data))
    return wrap_records(
        section,
        stream_id=header.stream_id,
        range_index=range_index,
        epoch=epoch,
        base_offset=header.base_offset,
        confirm_offset=confirm_offset,
    )
