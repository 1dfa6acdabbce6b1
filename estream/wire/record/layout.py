"""The record batch's layout: its constants, the model (``Record``, ``BatchHeader``,
``RecordBatch``) and the digests every hop computes (checksum, MAC, ``stream_key``).

The byte layout (72-byte header, system block, records, extended heads) is drawn in
docs/ARCHITECTURE.md 3.1; all integers are little-endian.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

import crc32c
import xxhash

from estream.wire.errors import (
    MalformedBatch,
)

BATCH_MAGIC: Final = 0xE5B7
BATCH_VERSION: Final = 1
_HEADER: Final = struct.Struct("<HBBQIQQIQqqIQ")
BATCH_HEADER_BYTES: Final = _HEADER.size  # 72
_CHECKSUM_AT: Final = BATCH_HEADER_BYTES - 8
_RECORD: Final = struct.Struct("<qII")
RECORD_PREFIX_BYTES: Final = _RECORD.size  # 16
_LENGTHS: Final = struct.Struct("<II")  # a record prefix's headers_bytes and value_bytes
assert BATCH_HEADER_BYTES == 72 and RECORD_PREFIX_BYTES == 16

FLAG_SYSTEM: Final = 0x01  # a system block starts the records section
_DIGEST_SHIFT: Final = 1
_DIGEST_MASK: Final = 0x06
FLAG_KEYED: Final = 0x08  # some record has an extended head (a key, or bytes headers)
_FLAGS_KNOWN: Final = 0x0F
EXTENDED_HEAD: Final = 0xC1  # first byte of an extended head (msgpack never uses it)
_KEY_NONE: Final = 0xFFFFFFFF
_KEY_BYTES: Final = struct.Struct("<BI")
DIGEST_XXH3: Final = 0
DIGEST_CRC32C: Final = 1
DIGEST_HMAC_SHA256: Final = 2
DIGESTS: Final = {"xxh3": DIGEST_XXH3, "crc32c": DIGEST_CRC32C, "hmac-sha256": DIGEST_HMAC_SHA256}
DIGEST_NAMES: Final = {v: k for k, v in DIGESTS.items()}
MAC_BYTES: Final = 32


def digest_kind(flags: int) -> int:
    """The digest a batch's flags name (bits 1-2): ``DIGEST_XXH3``, ``DIGEST_CRC32C`` or
    ``DIGEST_HMAC_SHA256``.

    >>> digest_kind(0x00), digest_kind(0x03), digest_kind(0x04), digest_kind(0x0A)
    (0, 1, 2, 1)
    """
    return (flags & _DIGEST_MASK) >> _DIGEST_SHIFT
SEQUENCE_NONE: Final = 0
SEQUENCE_CONSECUTIVE: Final = 1
SEQUENCE_LISTED: Final = 2
_SYSTEM: Final = struct.Struct("<IBBBBqq")
SYSTEM_PREFIX_BYTES: Final = _SYSTEM.size  # 24
_MAC_FIELDS: Final = struct.Struct("<QIQIB")  # mac_version 0
_MAC_FIELDS_V1: Final = struct.Struct("<QIQIBQqq")  # 1: and confirm, first/max timestamp
MAC_VERSION: Final = 1  # what writers write
_MAC_VERSION_AT: Final = 7  # in the system block
_SEQ: Final = struct.Struct("<q")
assert SYSTEM_PREFIX_BYTES == 24


class _RecordFields(NamedTuple):
    value: bytes
    headers: Mapping[str, str]
    timestamp: int
    offset: int
    key: bytes | None


class Record(_RecordFields):
    """One record: a value, string headers, a timestamp (ms), its offset once stored, and
    an optional key (a Kafka record's; None for records appended without one).

    Immutable, a named tuple: made once per record decoded for a reader and per Kafka
    record produced, and a frozen dataclass cost about 2.6 times as much to make (1.85
    against 0.70 us with five arguments). Without ``headers``, each record gets an empty
    dict of its own."""

    __slots__ = ()

    def __new__(cls, value: bytes, headers: Mapping[str, str] | None = None,
                timestamp: int = 0, offset: int = -1, key: bytes | None = None) -> Record:
        return tuple.__new__(cls, (value, {} if headers is None else headers, timestamp,
                                   offset, key))


@dataclass(slots=True, unsafe_hash=True)
class BatchHeader:
    """The fixed header of an encoded batch (a value, never changed once made; not
    ``frozen``, whose construction costs about five times as much: one per batch
    decoded, on every replica)."""

    stream_id: int
    range_index: int
    epoch: int
    base_offset: int
    count: int
    confirm_offset: int
    first_timestamp: int
    max_timestamp: int
    records_bytes: int
    checksum: int
    flags: int = 0

    @property
    def end_offset(self) -> int:
        """One past the last record's offset."""
        return self.base_offset + self.count

    @property
    def total_bytes(self) -> int:
        """Size of the whole encoded batch."""
        return BATCH_HEADER_BYTES + self.records_bytes


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A decoded batch: its header and its records (with offsets filled in)."""

    header: BatchHeader
    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """A records section encoded once, to be wrapped in batch headers (and re-wrapped
    when a batch is resent to a new range) without re-encoding the records."""

    data: bytes
    count: int
    first_timestamp: int
    max_timestamp: int
    flags: int = 0
    system: bytes = b""  # the system block (a MAC's place zeroed until wrapped)

    @property
    def records_bytes(self) -> int:
        """The records section's length in a batch: system block and records."""
        return len(self.system) + len(self.data)


@dataclass(frozen=True, slots=True)
class BatchSystem:
    """A batch's system properties (its system block): the producer and the producer
    sequence of each record, and the MAC of an ``hmac-sha256`` stream's batch."""

    producer_id: str
    first_sequence: int
    last_sequence: int
    sequences: tuple[int, ...] | None  # listed; None: consecutive from first_sequence
    mac: bytes
    size: int  # the block's bytes
    mac_version: int = 0  # what the MAC covers (module docstring)

    def sequence(self, i: int) -> int:
        """Record ``i``'s sequence (-1 when the batch has none)."""
        if self.first_sequence < 0:
            return -1
        return self.sequences[i] if self.sequences is not None else self.first_sequence + i


def _checksum(flags: int, head: bytes | memoryview, *rest: bytes | memoryview) -> int:
    if digest_kind(flags) == DIGEST_CRC32C:
        value = crc32c.crc32c(head)
        for part in rest:
            value = crc32c.crc32c(part, value)
        return int(value)
    digest = xxhash.xxh3_64(head)
    for part in rest:
        digest.update(part)
    return digest.intdigest()


def _mac(
    key: bytes,
    version: int,
    fields: tuple[int, int, int, int, int, int, int, int],
    system_body: bytes | memoryview,
    data: bytes | memoryview,
) -> bytes:
    """The MAC of one batch. ``fields``: stream_id, range_index, base_offset, count, flags,
    confirm_offset, first_timestamp, max_timestamp (the last three from version 1 on)."""
    if version == 0:
        head = _MAC_FIELDS.pack(*fields[:5])
    elif version == 1:
        head = _MAC_FIELDS_V1.pack(*fields)
    else:
        raise MalformedBatch(f"unknown MAC version {version}")
    mac = hmac.new(key, head, hashlib.sha256)
    mac.update(system_body)
    mac.update(data)
    return mac.digest()


def _header_mac(key: bytes, view: memoryview, header: BatchHeader) -> tuple[bytes, bytes]:
    """(computed, stored) MAC of a whole hmac-sha256 batch (structure checked)."""
    end = records_at(view, header)
    body_at = BATCH_HEADER_BYTES
    if end - MAC_BYTES < body_at + SYSTEM_PREFIX_BYTES or view[body_at + 6] != MAC_BYTES:
        raise MalformedBatch("an hmac-sha256 batch without its MAC")
    fields = (header.stream_id, header.range_index, header.base_offset, header.count,
              header.flags, header.confirm_offset, header.first_timestamp,
              header.max_timestamp)
    mac = _mac(key, view[body_at + _MAC_VERSION_AT], fields, view[body_at : end - MAC_BYTES],
               view[end : BATCH_HEADER_BYTES + header.records_bytes])
    return mac, bytes(view[end - MAC_BYTES : end])


def stream_key(secret: bytes, stream_id: int) -> bytes:
    """The MAC key of one stream (``hmac-sha256`` digest): derived from the cluster secret
    and the stream's id (ids are never reused), so a key opens one stream only."""
    return hmac.new(secret, b"estream-stream-key/v1" + stream_id.to_bytes(8, "little"),
                    hashlib.sha256).digest()


def records_at(batch: bytes | memoryview, header: BatchHeader) -> int:
    """Where the records start in a whole batch: after the header and its system block."""
    if not header.flags & FLAG_SYSTEM:
        return BATCH_HEADER_BYTES
    if len(batch) < BATCH_HEADER_BYTES + SYSTEM_PREFIX_BYTES:
        raise MalformedBatch("batch too short for its system block")
    size = int.from_bytes(batch[BATCH_HEADER_BYTES : BATCH_HEADER_BYTES + 4], "little")
    if size < SYSTEM_PREFIX_BYTES or size + header.count * RECORD_PREFIX_BYTES > (
        header.records_bytes
    ):
        raise MalformedBatch(f"bad system block length {size}")
    return BATCH_HEADER_BYTES + size


