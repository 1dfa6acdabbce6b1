"""check_records: what a range server checks before it stores a batch. A batch whose
checksum is right but whose records do not decode is MalformedBatch; every batch the
writer makes passes."""

from __future__ import annotations

import struct

import msgpack
import pytest

from estream.wire.errors import MalformedBatch
from estream.wire.record import (
    DIGEST_CRC32C,
    EncodedRecords,
    Record,
    check_records,
    decode_batch,
    encode_records,
    verify_batch,
    wrap_records,
)

PREFIX = struct.Struct("<qII")


def wrapped(section: EncodedRecords) -> bytes:
    return wrap_records(section, stream_id=7, range_index=0, epoch=1, base_offset=0)


def crafted(data: bytes, count: int, first: int = 1, largest: int = 1) -> bytes:
    """A batch around a hand-made records section, its checksum right."""
    return wrapped(EncodedRecords(data, count, first, largest))


def check(batch: bytes) -> None:
    check_records(batch, verify_batch(batch))


@pytest.mark.parametrize(
    "records",
    [
        [Record(b"x" * 100, {}, 5)] * 64,  # uniform: the strided path
        [Record(b"a", {"k": "v"}, 9), Record(b"", {}, 3), Record(b"bc" * 50, {}, 12)],
        [Record(b"", {}, -(2**63)), Record(b"", {}, 2**63 - 1)],
    ],
)
def test_what_a_writer_encodes_passes(records: list[Record]) -> None:
    for section in (encode_records(records),
                    encode_records(records, producer_id="p", sequences=range(len(records))),
                    encode_records(records, digest=DIGEST_CRC32C)):
        batch = wrapped(section)
        check(batch)
        assert len(decode_batch(batch).records) == len(records)


@pytest.mark.parametrize(
    ("data", "count"),
    [
        (PREFIX.pack(1, 0, 100) + b"x" * 10, 1),  # value length past the end
        (PREFIX.pack(1, 50, 0) + b"\x80", 1),  # headers length past the end
        (PREFIX.pack(1, 1, 0) + b"\xc1", 1),  # headers not msgpack (0xc1 is never used)
        (PREFIX.pack(1, 3, 0) + msgpack.packb([1, 2]), 1),  # msgpack, not a map
        (PREFIX.pack(1, 3, 0) + msgpack.packb({1: 2}), 1),  # not str -> str
        (PREFIX.pack(1, 0, 1) + b"x" + b"trailing", 1),  # bytes after the last record
        (PREFIX.pack(1, 0, 1) + b"x" + PREFIX.pack(1, 0, 40), 2),  # second one runs past
        (PREFIX.pack(1, 0, 0) * 3, 2),  # uniform lengths, one record too many
    ],
)
def test_records_that_do_not_decode_are_malformed(data: bytes, count: int) -> None:
    batch = crafted(data, count)
    verify_batch(batch)  # the checksum is right
    with pytest.raises(MalformedBatch):
        check(batch)
    with pytest.raises(MalformedBatch):
        decode_batch(batch)  # what every reader would have answered
